"""peers/taskpool/cells.py, servers.py and assignment.py: leases count only from live members
where the assignment allows them, spares take open cells, standbys take shards over."""

from __future__ import annotations

import dataclasses

import pytest

from swarmd.errors import RecordError
from swarmd.peers.records.envelope import sign_record
from swarmd.peers.records.identity import Identity
from swarmd.peers.records.run_spec import derive_run_id
from swarmd.peers.taskpool.assignment import PROVISIONAL, provisional
from swarmd.peers.taskpool.cells import CellLease, open_cells, pipeline_epoch, resolve_cells, spare_for, spares
from swarmd.peers.taskpool.servers import KIND as SHARD_KIND
from swarmd.peers.taskpool.servers import (
    MAX_STEPS_PER_S,
    MAX_UNSEEN_STEPS,
    SeenVersions,
    ShardLease,
    encode_proof,
    resolve_shards,
)

pytestmark = pytest.mark.timeout(30)

T0 = 1_800_000_000.0
A, B, C, D = (Identity.generate() for _ in range(4))
RUN = derive_run_id("pool", A.public_key)


def cell(who: Identity, p: int = 0, s: int = 0, claimed_at: float = T0, **kw: object) -> CellLease:
    fields: dict[str, object] = dict(
        run_id=RUN, pipeline=p, stage=s, peer_id=who.peer_id, claimed_at=claimed_at, issued_at=T0, expires_at=T0 + 30
    )
    fields.update(kw)
    return CellLease(**fields)  # type: ignore[arg-type]


def shard(who: Identity, s: int = 0, k: int = 0, shards: int = 1, **kw: object) -> ShardLease:
    fields: dict[str, object] = dict(
        run_id=RUN,
        stage=s,
        shard=k,
        shards=shards,
        peer_id=who.peer_id,
        claimed_at=T0,
        issued_at=T0,
        expires_at=T0 + 30,
        version=5,
    )
    fields.update(kw)
    return ShardLease(**fields)  # type: ignore[arg-type]


def test_cell_lease_round_trip_and_impostor() -> None:
    original = cell(A, p=3, s=1)
    assert CellLease.parse(original.sign(A), run_id=RUN, now=T0, peer_id=A.peer_id) == original
    with pytest.raises(RecordError, match="signed by"):
        CellLease.parse(sign_record(A, "cell-lease", dataclasses.asdict(cell(B))), run_id=RUN, now=T0)


def test_a_lease_counts_only_from_a_live_member_where_the_assignment_allows_it() -> None:
    named = {(0, 0): A.peer_id, (0, 1): B.peer_id}
    live = {A.peer_id, B.peer_id, C.peer_id}
    leases = [cell(A), cell(C, s=1, claimed_at=T0 - 100), cell(B, s=1), cell(D, s=0, claimed_at=T0 - 999)]
    holders = resolve_cells(leases, named, live, T0)
    # A and B are named; C (a spare) may not take a cell whose named peer is live; D is no member.
    assert {c: h.peer_id for c, h in holders.items()} == {(0, 0): A.peer_id, (0, 1): B.peer_id}
    # B leaves: its cell is open, and the spare C takes it; D, with no heartbeat, still cannot.
    live = {A.peer_id, C.peer_id}
    holders = resolve_cells([cell(A), cell(C, s=1), cell(D, s=1, claimed_at=T0 - 999)], named, live, T0)
    assert holders[(0, 1)].peer_id == C.peer_id
    assert open_cells(named, live) == [(0, 1)] and spares(named, live) == [C.peer_id]


def test_a_spare_keeps_one_open_cell_and_the_draw_gives_each_cell_its_own_spare() -> None:
    named = {(0, 0): A.peer_id, (1, 0): B.peer_id}
    live = {C.peer_id, D.peer_id}
    holders = resolve_cells([cell(C, p=0, claimed_at=T0 - 2), cell(C, p=1, claimed_at=T0 - 1)], named, live, T0)
    assert [h.cell for h in holders.values()] == [(0, 0)]
    draw = spare_for([(0, 0), (1, 0)], [C.peer_id, D.peer_id])
    assert sorted(draw.values()) == sorted([C.peer_id, D.peer_id])
    assert spare_for([(0, 0), (1, 0)], [D.peer_id, C.peer_id]) == draw  # the same for every reader


def test_the_epoch_names_every_holder_in_order() -> None:
    assert pipeline_epoch(0, [A.peer_id, None]) is None
    assert pipeline_epoch(0, [A.peer_id, B.peer_id]) != pipeline_epoch(0, [B.peer_id, A.peer_id])
    assert pipeline_epoch(0, [A.peer_id, B.peer_id]) != pipeline_epoch(1, [A.peer_id, B.peer_id])


def test_only_the_named_standby_takes_a_shard_over_with_the_holders_signed_word() -> None:
    named, counts = {(0, 0): A.peer_id}, {0: 1}
    holder = shard(A, standby=B.peer_id)
    raw = holder.sign(A)
    take = shard(B, claimed_at=T0 + 5, issued_at=T0 + 5, expires_at=T0 + 35, proof=encode_proof(raw))
    assert ShardLease.parse(take.sign(B), run_id=RUN, now=T0 + 5) == take
    # C claims with A's lease as proof, but A named B: refused when read.
    forged = shard(C, claimed_at=T0 + 5, issued_at=T0 + 5, expires_at=T0 + 35, proof=encode_proof(raw))
    with pytest.raises(RecordError, match="does not name it"):
        ShardLease.parse(forged.sign(C), run_id=RUN, now=T0 + 5)
    # While A lives, B's take-over does not count; once A is gone it does.
    assert resolve_shards([holder, take], named, counts, {A.peer_id, B.peer_id}, T0 + 6)[(0, 0)].peer_id == A.peer_id
    assert resolve_shards([take], named, counts, {B.peer_id}, T0 + 6)[(0, 0)].peer_id == B.peer_id
    # A lease from another sharding of the stage is void, and so is one from a non-member.
    assert resolve_shards([shard(A, shards=2)], named, counts, {A.peer_id}, T0) == {}
    assert resolve_shards([holder], named, counts, {B.peer_id}, T0) == {}


def test_a_proof_must_be_fresh_and_for_this_shard() -> None:
    old = shard(A, standby=B.peer_id, issued_at=T0 - 5000, claimed_at=T0 - 5000, expires_at=T0 - 4990)
    stale = shard(B, claimed_at=T0, proof=encode_proof(old.sign(A)))
    with pytest.raises(RecordError, match="just before"):
        ShardLease.parse(stale.sign(B), run_id=RUN, now=T0)
    other = shard(A, k=1, shards=2, standby=B.peer_id)
    with pytest.raises(RecordError, match="another shard"):
        ShardLease.parse(shard(B, proof=encode_proof(other.sign(A))).sign(B), run_id=RUN, now=T0)
    with pytest.raises(RecordError, match="outside"):
        ShardLease.parse(sign_record(A, SHARD_KIND, {**dataclasses.asdict(shard(A)), "shard": 1}), run_id=RUN, now=T0)


def test_a_replica_far_past_what_rightful_holders_showed_is_not_believed() -> None:
    seen = SeenVersions()
    seen.note({(0, 0): shard(A, version=40)}, T0)
    assert seen.admits((0, 0), 40 + MAX_UNSEEN_STEPS) and not seen.admits((0, 0), 10**6)
    assert not seen.admits((1, 0), MAX_UNSEEN_STEPS + 1)


def test_a_holder_cannot_raise_the_seen_version_faster_than_training_could() -> None:
    seen = SeenVersions()
    seen.note({(0, 0): shard(A, version=40)}, T0)
    seen.note({(0, 0): shard(A, version=10**6)}, T0 + 2.0)  # two seconds later: at most 2 s of steps
    assert 40 < seen.of((0, 0)) <= 40 + 2 * MAX_STEPS_PER_S
    seen.note({(0, 0): shard(A, version=45)}, T0 + 3.0)  # an honest holder behind the bound lowers nothing
    assert seen.of((0, 0)) > 45 and not seen.admits((0, 0), 10**6)
    rise = seen.of((0, 0)) + 3
    seen.note({(0, 0): shard(B, version=rise)}, T0 + 4.0)  # a believable rise is taken whole
    assert seen.of((0, 0)) == rise


def test_this_peers_own_lease_does_not_anchor_the_seen_version() -> None:
    seen = SeenVersions(own=B.peer_id)
    seen.note({(0, 0): shard(B, version=0)}, T0)  # B named the server, its lease not yet serving
    seen.note({(0, 0): shard(A, version=70)}, T0)  # the live holder it takes the shard from
    assert seen.of((0, 0)) == 70  # so B's own checkpoint at 9 is no reason to open the shard
    assert SeenVersions().of((0, 0)) == 0


def test_provisional_assignment_spreads_members_and_one_holds_everything_alone() -> None:
    alone = provisional(["x"], stages=3, batch_micro_batches=8)
    assert alone.version == PROVISIONAL and alone.cells == (("x", "x", "x"),) and alone.servers == (("x",),) * 3
    four = provisional(["d", "c", "b", "a"], stages=2, batch_micro_batches=8)
    assert four.cells == (("a", "b"), ("c", "d")) and four.share_micro_batches == 4
    assert four.servers == (("a",), ("b",)) and four.cells_of("c") == [(1, 0)]
    three = provisional(["a", "b", "c"], stages=2, batch_micro_batches=8)
    assert three.cells == (("a", "b"),)  # c is a spare


def test_a_peer_holds_what_it_is_named_for_and_a_spare_keeps_the_open_cell_it_took() -> None:
    from swarmd.peers.taskpool.cells import cells_to_hold

    named = {(0, 0): A.peer_id, (0, 1): B.peer_id, (1, 0): A.peer_id}
    assert cells_to_hold(A.peer_id, named, {}, {A.peer_id, B.peer_id}) == [(0, 0), (1, 0)]
    live = {A.peer_id, C.peer_id, D.peer_id}  # B left: (0, 1) is open, C and D are spares
    drawn = [cells_to_hold(x.peer_id, named, {}, live) for x in (C, D)]
    assert sorted(map(len, drawn)) == [0, 1]
    taker = C if drawn[0] else D
    other = D if taker is C else C
    # Once the other spare holds it, the draw does not move it back.
    holders = {(0, 1): cell(other, s=1)}
    assert cells_to_hold(other.peer_id, named, holders, live) == [(0, 1)]
    assert cells_to_hold(taker.peer_id, named, holders, live) == []
