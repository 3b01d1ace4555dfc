"""daemon/training/bookkeeping.py: the trainer's round as a pure step, over synthetic leases.

Each test plays rounds as the trainer does (``Observed``, ``ShardsSeen``, ``CellsSeen``) and
checks the actions in order: what to claim, renew, release, open and close. Shard leases are
signed for real, since a take-over's proof is a signed lease the pool's rule parses.
"""

from __future__ import annotations

from typing import cast

import pytest

from swarmd.peers.records.identity import Identity
from swarmd.peers.records.plan_record import PlanRecord
from swarmd.peers.taskpool.assignment import Assignment, provisional
from swarmd.peers.taskpool.cells import Cell, CellLease
from swarmd.peers.taskpool.servers import Shard, ShardLease, encode_proof
from swarmd.training.bookkeeping import (
    Action,
    Books,
    CellsSeen,
    CloseCell,
    CloseShard,
    Follow,
    NoteVersions,
    Observed,
    OpenCell,
    OpenShard,
    PublishCell,
    PublishShard,
    ShardsSeen,
    StandbyChanged,
    Stopping,
    StopReducer,
    assignment_in_force,
    cells_to_scan,
    step,
)

pytestmark = pytest.mark.timeout(60)

RUN_ID = "tiny." + "a" * 24
TTL_S = 30.0
IDS = sorted((Identity.generate() for _ in range(3)), key=lambda i: i.peer_id)
A, B, C = (i.peer_id for i in IDS)
"""Sorted, so the provisional rule names them in this order."""
BY_PEER = {i.peer_id: i for i in IDS}


def cell_lease(peer: str, cell: Cell, now: float, claimed_at: float = 0.0) -> CellLease:
    return CellLease(
        run_id=RUN_ID,
        pipeline=cell[0],
        stage=cell[1],
        peer_id=peer,
        claimed_at=claimed_at,
        issued_at=now,
        expires_at=now + TTL_S,
    )


def shard_lease(peer: str, key: Shard, now: float, *, standby: str = "", proof: str = "") -> tuple[ShardLease, bytes]:
    lease = ShardLease(
        run_id=RUN_ID,
        stage=key[0],
        shard=key[1],
        shards=1,
        peer_id=peer,
        claimed_at=0.0,
        issued_at=now,
        expires_at=now + TTL_S,
        version=0,
        standby=standby,
        proof=proof,
    )
    return lease, lease.sign(BY_PEER[peer])


def plan(cells: tuple[tuple[str, ...], ...], servers: tuple[tuple[str, ...], ...]) -> Assignment:
    return Assignment(version=3, cells=cells, servers=servers, local_steps=1, share_micro_batches=4)


def observe(books: Books, live: set[str], assignment: Assignment) -> Books:
    books, _ = step(books, Observed(frozenset(live), assignment))
    return books


def without_notes(actions: list[Action]) -> list[Action]:
    return [a for a in actions if not isinstance(a, NoteVersions)]


def released(key: Shard, claimed_at: float, standby: str = "", proof: str = "") -> PublishShard:
    return PublishShard(key, 1, claimed_at, standby, proof, released=True)


def renewed(key: Shard, claimed_at: float, standby: str = "", proof: str = "") -> PublishShard:
    return PublishShard(key, 1, claimed_at, standby, proof, released=False)


def test_the_first_assignment_is_claimed_then_opened_once_the_pool_shows_the_claim() -> None:
    assignment = provisional([A, B], 2, 8)  # one pipeline: A at stage 0, B at stage 1
    books, actions = step(Books(own=A, live=frozenset({A})), Observed(frozenset({A, B}), assignment))
    assert actions == [Follow(assignment)]
    assert step(books, Observed(frozenset({A, B}), assignment))[1] == []  # the same assignment: nothing said

    books, actions = step(books, ShardsSeen((), B, (), now=100.0))
    assert actions == [NoteVersions({}), NoteVersions({}), StandbyChanged(), renewed((0, 0), 100.0, standby=B)]
    assert books.shard_claims == {(0, 0): 100.0} and books.standby == B

    mine = shard_lease(A, (0, 0), 100.0, standby=B)
    books, actions = step(books, ShardsSeen((mine, shard_lease(B, (1, 0), 100.0)), B, (), now=105.0))
    assert without_notes(actions) == [renewed((0, 0), 100.0, standby=B), OpenShard((0, 0))]  # the claim keeps its time
    assert actions[0] == NoteVersions({(0, 0): mine[0], (1, 0): shard_lease(B, (1, 0), 100.0)[0]})
    assert books.shard_holders[(1, 0)].peer_id == B

    assert cells_to_scan(books, serving_first=True, asked=()) == [(0, 0), (0, 1)]
    books, actions = step(books, CellsSeen((), (), frozenset(), now=105.0))
    assert actions == [PublishCell((0, 0), 105.0, released=False)]
    leases = (cell_lease(A, (0, 0), 105.0), cell_lease(B, (0, 1), 105.0))
    books, actions = step(books, CellsSeen(leases, (), frozenset(), now=110.0))
    assert actions == [PublishCell((0, 0), 105.0, released=False), OpenCell((0, 0))]
    assert books.cell_claims == {(0, 0): 105.0}
    assert {cell: lease.peer_id for cell, lease in books.cell_holders.items()} == {(0, 0): A, (0, 1): B}

    # A worker that stopped by itself is closed and opened again in the same round.
    books, actions = step(books, CellsSeen(leases, ((0, 0),), frozenset({(0, 0)}), now=115.0))
    assert actions == [PublishCell((0, 0), 105.0, released=False), CloseCell((0, 0), restart=True), OpenCell((0, 0))]


def test_a_plan_that_moves_a_cell_away_closes_it_before_releasing_it() -> None:
    before = plan(((A, B),), ((A,), (B,)))
    books = observe(Books(own=A), {A, B}, before)
    books, _ = step(books, ShardsSeen((shard_lease(A, (0, 0), 10.0),), None, (), now=10.0))
    books, _ = step(books, CellsSeen((cell_lease(A, (0, 0), 10.0),), (), frozenset(), now=10.0))
    assert books.shard_claims == {(0, 0): 10.0} and books.cell_claims == {(0, 0): 10.0}

    after = plan(((B, A),), ((B,), (A,)))  # A and B swap stages
    books, actions = step(books, Observed(frozenset({A, B}), after))
    assert actions == [Follow(after)]
    books, actions = step(books, ShardsSeen((shard_lease(B, (0, 0), 20.0),), None, ((0, 0),), now=20.0))
    close, release, claim = without_notes(actions)
    assert (close, claim) == (CloseShard((0, 0)), renewed((1, 0), 20.0))
    assert isinstance(release, PublishShard)
    assert (release.key, release.claimed_at, release.released) == ((0, 0), 10.0, True)
    # A release carries no proof: B's lease, which names nobody standby, made it unreadable
    # (ShardLease.parse: "its proof does not name it the standby"), so the pool kept A's claim.
    assert release.proof == ""
    signed = ShardLease(
        run_id=RUN_ID,
        stage=0,
        shard=0,
        shards=1,
        peer_id=A,
        claimed_at=release.claimed_at,
        issued_at=20.0,
        expires_at=20.0 + TTL_S,
        version=0,
        standby=release.standby,
        proof=release.proof,
        released=True,
    ).sign(BY_PEER[A])
    assert ShardLease.parse(signed, run_id=RUN_ID, now=21.0).released
    assert books.shard_claims == {(1, 0): 20.0}

    leases = (cell_lease(B, (0, 0), 20.0), cell_lease(A, (0, 0), 10.0, claimed_at=10.0))
    books, actions = step(books, CellsSeen(leases, ((0, 0),), frozenset(), now=20.0))
    assert actions == [
        CloseCell((0, 0)),
        PublishCell((0, 0), 10.0, released=True),
        PublishCell((0, 1), 20.0, released=False),
    ]
    assert books.cell_claims == {(0, 1): 20.0}
    assert books.cell_holders[(0, 0)].peer_id == B


def test_a_spare_takes_the_cell_whose_lease_lapsed_and_the_standby_the_shard() -> None:
    assignment = plan(((B, C),), ((B,), (C,)))  # A is a spare; C serves stage 1 with A as standby
    books = observe(Books(own=A), {A, B, C}, assignment)
    holder = shard_lease(C, (1, 0), 10.0, standby=A)
    books, actions = step(books, ShardsSeen((holder,), None, (), now=10.0))
    assert without_notes(actions) == []  # the spare claims nothing while everyone is here
    assert books.rightful[(1, 0)] == holder
    books, actions = step(books, CellsSeen((cell_lease(C, (0, 1), 10.0),), (), frozenset(), now=10.0))
    assert actions == []

    # C leaves: its leases lapse, and A takes both its cell and (as its standby) its shard.
    books = observe(books, {A, B}, assignment)
    assert cells_to_scan(books, serving_first=False, asked=()) == [(0, 0), (0, 1)]
    proof = encode_proof(holder[1])
    books, actions = step(books, ShardsSeen((holder,), None, (), now=50.0))
    assert without_notes(actions) == [renewed((1, 0), 50.0, proof=proof)]
    taken = shard_lease(A, (1, 0), 50.0, proof=proof)
    books, actions = step(books, ShardsSeen((taken,), None, (), now=55.0))
    assert without_notes(actions) == [renewed((1, 0), 50.0, proof=proof), OpenShard((1, 0))]
    assert books.proofs == {(1, 0): proof}

    lapsed = cell_lease(C, (0, 1), 10.0)  # expired at 40
    books, actions = step(books, CellsSeen((lapsed,), (), frozenset(), now=50.0))
    assert actions == [PublishCell((0, 1), 50.0, released=False)]
    books, actions = step(books, CellsSeen((lapsed, cell_lease(A, (0, 1), 50.0, 50.0)), (), frozenset(), now=55.0))
    assert actions == [PublishCell((0, 1), 50.0, released=False), OpenCell((0, 1))]

    # The coordinator's repair names A: the shard is A's by name, and its lease needs no proof.
    repaired = plan(((B, A),), ((B,), (A,)))
    books = observe(books, {A, B}, repaired)
    books, actions = step(books, ShardsSeen((taken,), None, ((1, 0),), now=60.0))
    assert without_notes(actions) == [renewed((1, 0), 50.0)]
    assert books.proofs == {}


def test_a_peer_alone_holds_every_cell_and_every_shard() -> None:
    books = observe(Books(own=A), {A}, provisional([A], 3, 8))
    keys = [(0, 0), (1, 0), (2, 0)]
    books, actions = step(books, ShardsSeen((), None, (), now=1.0))
    assert without_notes(actions) == [renewed(key, 1.0) for key in keys]
    books, actions = step(books, ShardsSeen(tuple(shard_lease(A, key, 1.0) for key in keys), None, (), now=2.0))
    assert without_notes(actions) == [renewed(key, 1.0) for key in keys] + [OpenShard(key) for key in keys]

    cells = [(0, 0), (0, 1), (0, 2)]
    assert cells_to_scan(books, serving_first=True, asked=()) == cells
    books, actions = step(books, CellsSeen((), (), frozenset(), now=2.0))
    assert actions == [PublishCell(cell, 2.0, released=False) for cell in cells]
    leases = tuple(cell_lease(A, cell, 2.0) for cell in cells)
    books, actions = step(books, CellsSeen(leases, (), frozenset(), now=3.0))
    assert actions == [PublishCell(cell, 2.0, released=False) for cell in cells] + [OpenCell(cell) for cell in cells]

    # Stopping: cells, then the reducer, then the servers; then every claim released at once.
    books, actions = step(books, Stopping(tuple(cells), tuple(keys)))
    assert actions == [
        *(CloseCell(cell) for cell in cells),
        StopReducer(),
        *(CloseShard(key) for key in keys),
        *(PublishCell(cell, 2.0, released=True) for cell in cells),
        *(released(key, 1.0) for key in keys),
    ]
    assert books.cell_claims == {} and books.shard_claims == {}
    assert step(books, Stopping((), ()))[1] == [StopReducer()]  # nothing left to release


def test_the_cells_scanned_follow_the_ledger_and_the_reduction_groups() -> None:
    assignment = Assignment(
        version=0,
        cells=((A, B), (C, C), (B, A), (C, B)),
        servers=((A,), (B,)),
        local_steps=1,
        share_micro_batches=1,
        reduce_groups=(2, 1),
    )
    books = observe(Books(own=C), {A, B, C}, assignment)
    # C is named in pipelines 1 and 3; stage 0 groups pipelines in twos, so 0 and 2 join them.
    assert cells_to_scan(books, serving_first=False, asked=()) == [(p, s) for p in range(4) for s in range(2)]
    books = observe(Books(own=A), {A, B, C}, plan(((A, B), (C, C), (B, A)), ((A,), (B,))))
    assert cells_to_scan(books, serving_first=False, asked=()) == [(0, 0), (0, 1), (2, 0), (2, 1)]
    assert cells_to_scan(books, serving_first=False, asked={1, 7}) == [(p, s) for p in range(3) for s in range(2)]
    assert cells_to_scan(books, serving_first=True, asked=()) == [(p, s) for p in range(3) for s in range(2)]


def test_the_assignment_in_force_is_provisional_until_the_swarm_can_follow_a_plan() -> None:
    assert assignment_in_force(None, {B, A}, 2, 8) == provisional([A, B], 2, 8)
    # Fewer members than stages: no plan can place the run, whatever the coordinator last said.
    unread = cast(PlanRecord, object())
    assert assignment_in_force(unread, {A, B}, 3, 8) == provisional([A, B], 3, 8)
