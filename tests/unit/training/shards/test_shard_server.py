"""daemon/training/shards/shard_server.py: the periodic checkpoint copy to the standby travels while
steps go on, and the standby's replica (its older copy, the log, then the new copy) rebuilds
the committed weights whichever arrives first; only the stage's cells contribute (a sum only
from a group's head), only for shares the ledger ticketed to the sender's pipelines, and a
replay is refused ``AlreadyApplied``."""

from __future__ import annotations

import asyncio
import struct
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from swarmd.errors import SwarmdError
from swarmd.models.parameter_shard import ParameterShard, ShardStep
from swarmd.models.shard_config import ShardConfig
from swarmd.peers.records.identity import Identity
from swarmd.peers.taskpool.assignment import Assignment
from swarmd.peers.taskpool.exchange import ExchangeConfig
from swarmd.peers.taskpool.tickets import ShareTicket
from swarmd.peers.wire.codecs import encode_vector
from swarmd.peers.wire.errors import AlreadyApplied, BadRequest, NotHolder, Unavailable
from swarmd.peers.wire.messages import Contribute, Pull
from swarmd.training.shards.replicas import LogEntry, ReplicaStore
from swarmd.training.shards.shard_server import ShardServer
from swarmd.training.shards.shard_sources import replay

pytestmark = pytest.mark.timeout(60)

SIZE = 300
KEY = (0, 0)
HOLDER = "holder"
RUN_ID = "tiny." + "a" * 24
CONFIG = ShardConfig(mode="gradient", lr=1e-2, weight_decay=0.0, betas=(0.9, 0.99), eps=1e-6)


class Standby:
    """The standby's end of the replication: a real ``ReplicaStore``, with copies that wait
    at a gate (a slow link) or fail, as a test says."""

    def __init__(self) -> None:
        self.sees: str | None = HOLDER
        """The shard's holder as this standby's view of the swarm has it (None: none yet)."""
        self.store = ReplicaStore(lambda key: self.sees)
        self.gate = asyncio.Event()
        self.gate.set()
        self.fail_copies = False
        self.copies_started: list[int] = []
        self.copies_ended = 0

    async def log(self, step: ShardStep, ledger: str) -> bool:
        frame = encode_vector(step.delta, "fp16")
        self.store.append(KEY, HOLDER, "lineage", LogEntry(step.version, frame, tuple(step.share_ids), ledger))
        return True

    async def copy(self, version: int, data: bytes) -> bool:
        self.copies_started.append(version)
        await self.gate.wait()
        self.copies_ended += 1
        if self.fail_copies:
            raise SwarmdError("the standby's link broke")
        self.store.store_checkpoint(KEY, HOLDER, "lineage", version, data)
        return True

    async def copies_end(self, count: int) -> None:
        while self.copies_ended < count:
            await asyncio.sleep(0.01)

    async def copies_start(self, count: int) -> None:
        while len(self.copies_started) < count:
            await asyncio.sleep(0.01)


def server(tmp_path: Path, standby: Standby, every: int, step_micro_batches: int = 1) -> ShardServer:
    shard = ParameterShard(0, SIZE, torch.zeros(SIZE), CONFIG, step_micro_batches=step_micro_batches)
    settings = ExchangeConfig(batch_micro_batches=1, share_micro_batches=1)
    return ShardServer(KEY, 1, shard, settings, "lineage", tmp_path / "shard.pt", standby.log, standby.copy, every)


async def step(srv: ShardServer, share_id: int) -> None:
    gradient = torch.randn(SIZE, generator=torch.Generator().manual_seed(share_id))
    request = Contribute(
        run_id=RUN_ID,
        stage=0,
        shard=0,
        shards=1,
        share_ids=[share_id],
        base_version=srv.version,
        micro_batches=1,
        kind="gradient",
        codec="fp32",
    )
    answer = await srv.contribute(request, encode_vector(gradient, "fp32"))
    assert answer.accepted


def weights_of(srv: ShardServer) -> torch.Tensor:
    found = srv.weights()
    assert found is not None and found[0] == srv.version
    return found[1]


def rebuilt(standby: Standby, srv: ShardServer) -> torch.Tensor:
    replica = standby.store.newest(KEY)
    assert replica is not None and replica.version == srv.version
    weights = replay(replica, CONFIG, 1, (0, SIZE)).weights()
    assert weights is not None
    return weights[1]


def test_steps_go_on_while_a_periodic_copy_travels_and_the_standby_rebuilds_every_step(tmp_path: Path) -> None:
    async def scenario() -> None:
        standby = Standby()
        srv = server(tmp_path, standby, every=3)
        await step(srv, 1)  # the first step copies to the new standby under the lock, then logs
        assert standby.copies_started == [1]
        await step(srv, 2)
        standby.gate.clear()  # the next copy is slow
        await asyncio.wait_for(step(srv, 3), 5)  # the third step since: a copy goes, in the background
        for share in range(4, 8):  # steps commit while it is in flight (under the lock they waited)
            await asyncio.wait_for(step(srv, share), 5)
        assert srv.version == 7 and standby.copies_started == [1, 3] and standby.copies_ended == 1
        assert torch.equal(rebuilt(standby, srv), weights_of(srv))  # old copy + the log
        standby.gate.set()
        await asyncio.wait_for(srv.close(), 10)
        replica = standby.store.newest(KEY)
        assert replica is not None and replica.checkpoint_version >= 3
        assert torch.equal(rebuilt(standby, srv), weights_of(srv))  # new copy + the log after it

    asyncio.run(scenario())


def test_a_closing_server_steps_on_its_buffer_and_leaves_that_version_in_its_file(tmp_path: Path) -> None:
    """The file is the state handed to the shard's next holder (``handlers.replica_fetch``): it
    once stayed at the last periodic checkpoint while the flush's step made a newer version, and
    the next holder refused the state it was sent (four daemons, two test workers)."""

    async def scenario() -> None:
        srv = server(tmp_path, Standby(), every=10, step_micro_batches=2)
        for share in (1, 2, 3):  # a step on 1 and 2 (the new standby's copy at 1); 3 buffered
            await step(srv, share)
        assert srv.version == 1
        assert await srv.close() == 2  # stepped on the half-full buffer
        saved = ParameterShard.from_checkpoint(srv.checkpoint_path, CONFIG, step_micro_batches=2).weights()
        assert saved is not None and saved[0] == 2 and torch.equal(saved[1], weights_of(srv))

    asyncio.run(scenario())


def test_a_failed_background_copy_makes_the_next_step_copy_first(tmp_path: Path) -> None:
    async def scenario() -> None:
        standby = Standby()
        srv = server(tmp_path, standby, every=2)
        for share in (1, 2):  # copies at 1 (the new standby's first) and 2
            await step(srv, share)
        await asyncio.wait_for(standby.copies_end(2), 5)
        standby.fail_copies = True
        standby.gate.clear()
        for share in (3, 4):
            await step(srv, share)
        await asyncio.wait_for(standby.copies_start(3), 5)
        assert standby.copies_started == [1, 2, 4]  # 4 in the background, failing at the gate
        standby.gate.set()
        await asyncio.wait_for(standby.copies_end(3), 5)
        standby.fail_copies = False
        await step(srv, 5)  # the standby is not taken as ready any more: a copy first, under the lock
        assert standby.copies_started == [1, 2, 4, 5]
        assert srv.stats.unreplicated == 0
        assert torch.equal(rebuilt(standby, srv), weights_of(srv))
        await srv.close()

    asyncio.run(scenario())


def test_a_step_waits_for_a_standby_whose_view_lags_and_is_logged_once_it_sees_the_holder(tmp_path: Path) -> None:
    """A server opened after a hand-over, whose standby has not read its lease yet (NOT_HOLDER):
    the step waits, and commits replicated once the standby's view catches up."""

    async def scenario() -> None:
        standby = Standby()
        standby.sees = None
        srv = server(tmp_path, standby, every=10)
        caught_up = asyncio.get_running_loop().call_later(0.6, setattr, standby, "sees", HOLDER)
        started = time.monotonic()
        await asyncio.wait_for(step(srv, 1), 10)
        assert 0.5 < time.monotonic() - started < 5 and srv.version == 1
        assert srv.stats.unreplicated == 0 and srv.standby.lagging_waits == 1
        assert standby.store.refused >= 1 and torch.equal(rebuilt(standby, srv), weights_of(srv))
        caught_up.cancel()
        await srv.close()

    asyncio.run(scenario())


def test_a_standby_lagging_past_the_wait_holds_up_one_step_and_a_copy_follows_once_it_catches_up(
    tmp_path: Path,
) -> None:
    """One budget per lag: a standby that does not catch up (paused, leaving) stalls the swarm
    once, not at every step."""

    async def scenario() -> None:
        standby = Standby()
        standby.sees = "another holder"
        srv = server(tmp_path, standby, every=10)
        srv.standby.lagging_wait_s = 0.5
        srv.standby.changed()  # (the budget of a new standby's lag)
        started = time.monotonic()
        await asyncio.wait_for(step(srv, 1), 10)  # applied unreplicated after the wait, not stalled for good
        assert time.monotonic() - started >= 0.4 and srv.version == 1 and srv.stats.unreplicated == 1
        started = time.monotonic()
        await step(srv, 2)  # the same lag: no wait
        assert time.monotonic() - started < 0.3 and srv.stats.unreplicated == 2
        standby.sees = HOLDER
        await step(srv, 3)  # a copy first (at 3, with the step in it), then the log
        assert srv.stats.unreplicated == 2 and standby.copies_started[-1] == 3
        assert torch.equal(rebuilt(standby, srv), weights_of(srv))
        await srv.close()

    asyncio.run(scenario())


def test_a_closing_server_ends_a_wait_for_a_lagging_standby(tmp_path: Path) -> None:
    async def scenario() -> None:
        standby = Standby()
        standby.sees = None
        srv = server(tmp_path, standby, every=10)
        stepping = asyncio.create_task(step(srv, 1))
        while srv.standby.lagging_waits == 0:
            await asyncio.sleep(0.01)
        started = time.monotonic()
        assert await asyncio.wait_for(srv.close(), 10) == 1
        assert time.monotonic() - started < 2 and srv.stats.unreplicated == 1
        await stepping

    asyncio.run(scenario())


def test_a_standby_that_fails_otherwise_is_not_waited_for(tmp_path: Path) -> None:
    async def scenario() -> None:
        standby = Standby()
        standby.fail_copies = True  # its link is broken: no view will mend that
        srv = server(tmp_path, standby, every=10)
        started = time.monotonic()
        await step(srv, 1)
        assert time.monotonic() - started < 1 and srv.stats.unreplicated == 1 and srv.standby.lagging_waits == 0
        await srv.close()

    asyncio.run(scenario())


# --- who may contribute, and replays ------------------------------------------------------------


KEEPER = Identity.generate()
"""The ledger's keeper (shard (0, 0)'s holder): it signs the shares' tickets."""


@dataclass
class Pool:
    """What ``admit`` reads of the trainer: the assignment in force, the resolved holders and
    whose tickets it believes."""

    assignment: Assignment | None
    holders: dict[tuple[int, int], str] = field(default_factory=dict)
    keepers: list[str] = field(default_factory=lambda: [KEEPER.peer_id])

    def cell_holder(self, cell: tuple[int, int]) -> str | None:
        return self.holders.get(cell)

    def ledger_keepers(self) -> list[str]:
        return self.keepers


def grid(pipelines: int, group: int = 1) -> Assignment:
    """``pipelines`` pipelines of one stage, cell (p, 0) named ``cell-p``, one shard."""
    cells = tuple((f"cell-{p}",) for p in range(pipelines))
    groups = (group,) if group > 1 else ()
    return Assignment(0, cells, ((HOLDER,),), 1, 2, reduce_groups=groups)


def ticket(share_id: int, pipeline: int, *, count: int = 2, by: Identity = KEEPER) -> bytes:
    return ShareTicket.sign(
        by, RUN_ID, share_id=share_id, first=count * share_id, count=count, pipeline=pipeline, now=time.time()
    ).pack()


def contribution(share_ids: list[int], micro_batches: int = 1, parts: int = 1, base: int = 0) -> Contribute:
    return Contribute(
        run_id=RUN_ID,
        stage=0,
        shard=0,
        shards=1,
        share_ids=share_ids,
        base_version=base,
        micro_batches=micro_batches,
        kind="gradient",
        codec="fp32",
        parts=parts,
        tickets=len(share_ids),
    )


def admit(srv: ShardServer, sender: str, request: Contribute, pool: Pool, pipelines: list[int] | None = None) -> None:
    """``request`` with its tickets: each share issued to ``pipelines`` (the sender's cell's by
    default: ``cell-p`` holds pipeline p's)."""
    own = int(sender.rsplit("-", 1)[1]) if sender.startswith("cell-") else 3
    at = pipelines or [own] * len(request.share_ids)
    tickets = b"".join(ticket(i, p) for i, p in zip(request.share_ids, at, strict=True))
    asyncio.run(srv.admit(sender, request, tickets, pool))


def test_only_a_cell_of_the_stage_contributes_and_only_a_head_sends_a_sum(tmp_path: Path) -> None:
    srv = server(tmp_path, Standby(), every=100)
    pool = Pool(grid(4, group=2), {(3, 0): "spare"})
    admit(srv, "cell-1", contribution([1]), pool)  # named by the plan
    admit(srv, "spare", contribution([1]), pool)  # resolved by the pool (a spare standing in)
    with pytest.raises(NotHolder, match="holds no cell of stage 0"):
        admit(srv, "stranger", contribution([1]), pool)
    # Shard 0's head in the group {0, 1} is pipeline 0, in {2, 3} pipeline 2.
    admit(srv, "cell-0", contribution([1, 2], micro_batches=2, parts=2), pool, [0, 1])
    with pytest.raises(NotHolder, match="only from its reduction head"):
        admit(srv, "cell-1", contribution([1, 2], micro_batches=2, parts=2), pool)
    with pytest.raises(BadRequest, match="has only 2 cells"):
        admit(srv, "cell-0", contribution([1, 2, 3], micro_batches=3, parts=3), pool)
    # k = 2 (the batch is 1): one share holds two micro-batches at most.
    admit(srv, "cell-1", contribution([1], micro_batches=2), pool)
    with pytest.raises(BadRequest, match="claims 1000 micro-batches; at most 2 per share"):
        admit(srv, "cell-1", contribution([1], micro_batches=1000), pool)
    with pytest.raises(Unavailable):
        admit(srv, "cell-1", contribution([1]), Pool(None))
    assert srv.stats.refused_by == {"not_holder": 2, "parts": 1, "micro_batches": 1}
    assert srv.info()["refused_by"] == srv.stats.refused_by and srv.stats.refused == 4


def test_only_shares_the_ledger_ticketed_to_the_senders_pipelines_are_taken(tmp_path: Path) -> None:
    # Issue 26: a member contributed made-up share IDs (in [2^39, 2^40)) claiming 4 x 1024
    # micro-batches, and squatted the next 1,023 IDs; every such contribution is refused now,
    # counted by reason, before its tensor is read.
    srv = server(tmp_path, Standby(), every=100)
    pool = Pool(grid(4, group=2))
    made_up = 2**39 + 5
    cases: list[tuple[str, Contribute, bytes, str]] = [
        ("cell-1", contribution([made_up]), b"", "ticket"),  # no ticket at all
        ("cell-1", contribution([made_up]), ticket(made_up, 1, by=Identity.generate()), "ticket_signature"),
        ("cell-1", contribution([7]), ticket(7, 2), "ticket_pipeline"),  # pipeline 2's share: a squat
        ("cell-1", contribution([7], micro_batches=2), ticket(7, 1, count=1), "micro_batches"),
        ("cell-1", contribution([7, 8]), ticket(8, 1) + ticket(7, 1), "ticket"),  # tickets of other shares
        ("cell-1", contribution([7]), ticket(7, 1), ""),  # its own: taken
        ("cell-0", contribution([7, 8], parts=2), ticket(7, 0) + ticket(8, 1), ""),  # the head: its group's
        ("cell-0", contribution([7, 9], parts=2), ticket(7, 0) + ticket(9, 2), "ticket_pipeline"),  # not its group
    ]
    for sender, request, tickets, reason in cases:
        if not reason:
            asyncio.run(srv.admit(sender, request, tickets, pool))
            continue
        with pytest.raises(BadRequest, match=reason):
            asyncio.run(srv.admit(sender, request, tickets, pool))
    assert srv.stats.refused_by == {"ticket": 2, "ticket_signature": 1, "ticket_pipeline": 2, "micro_batches": 1}
    # A ticket of a keeper this server no longer believes is refused too.
    with pytest.raises(BadRequest, match="ticket_signature"):
        asyncio.run(srv.admit("cell-1", contribution([7]), ticket(7, 1), Pool(grid(4, group=2), keepers=["other"])))


def test_a_replayed_contribution_is_refused_as_already_applied_and_counted(tmp_path: Path) -> None:
    async def scenario() -> None:
        srv = server(tmp_path, Standby(), every=100)
        blob = encode_vector(torch.randn(SIZE, generator=torch.Generator().manual_seed(1)), "fp32")
        answer = await srv.contribute(contribution([5]), blob, sender="cell-0")
        assert answer.accepted and answer.committed and srv.version == 1
        weights = weights_of(srv)
        for _ in range(2):  # the captured request, replayed as it was
            with pytest.raises(AlreadyApplied, match="not applied again"):
                await srv.contribute(contribution([5]), blob, sender="cell-0")
        assert srv.version == 1 and torch.equal(weights_of(srv), weights)
        assert srv.stats.duplicates == 2 and srv.shard.counters.applied == 1
        nan = encode_vector(torch.zeros(SIZE), "fp32")[:-4] + struct.pack("<f", float("nan"))  # the last value
        with pytest.raises(BadRequest):
            await srv.contribute(contribution([6], base=1), nan, sender="cell-0")
        assert srv.stats.refused_by == {"codec": 1}  # fp32 frames are checked finite as they are decoded
        await srv.close()

    asyncio.run(scenario())


def test_a_non_finite_step_is_not_logged_or_served_and_a_pull_learns_its_shares_are_unknown_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def scenario() -> None:
        standby = Standby()
        srv = server(tmp_path, standby, every=100)
        await step(srv, 1)
        logged = standby.store.newest(KEY)
        assert logged is not None and srv.version == 1
        honest_step = srv.shard._optimizer.step

        def nan_step() -> None:
            honest_step()
            srv.shard._param.data[0] = float("nan")

        monkeypatch.setattr(srv.shard._optimizer, "step", nan_step)
        pull = Pull(run_id=RUN_ID, stage=0, shard=0, shards=1, have_version=1, pending_share_ids=[2], wait_s=30.0)
        waiting = asyncio.create_task(srv.pull(pull, "cell-0"))
        while not srv._new_version._waiters:  # type: ignore[attr-defined]  # the poll waits before the drop
            await asyncio.sleep(0.01)
        await step(srv, 2)
        answer, blobs = await asyncio.wait_for(waiting, 10.0)  # woken by the drop, not by its 30 s
        assert (answer.version, answer.kind, answer.committed, answer.unknown, blobs) == (1, "none", [], [2], [])
        # Told once: the same sender's next poll waits. A sender not told yet (a reduction head
        # whose poll left after the drop) learns it at once. An ID never seen here (a
        # contribution on its way) ends no wait: answering it at once would spin the polls.
        again = asyncio.create_task(srv.pull(pull, "cell-0"))
        never_seen = Pull(run_id=RUN_ID, stage=0, shard=0, shards=1, have_version=1, pending_share_ids=[9], wait_s=30.0)
        on_its_way = asyncio.create_task(srv.pull(never_seen, "cell-1"))
        told_late, _ = await asyncio.wait_for(srv.pull(pull, "head"), 1.0)
        assert told_late.unknown == [2]
        await asyncio.sleep(0.1)
        assert not again.done() and not on_its_way.done()
        assert srv.info()["dropped_steps"] == 1 and srv.info()["steps"] == 1 and srv.version == 1
        replica = standby.store.newest(KEY)
        assert replica is not None and replica.version == 1  # nothing logged at the standby
        assert bool(torch.isfinite(weights_of(srv)).all())
        monkeypatch.setattr(srv.shard._optimizer, "step", honest_step)
        await step(srv, 2)  # the cell's resend is taken afresh
        assert srv.version == 2 and srv.shard.committed([2]) == {2}
        assert (await asyncio.wait_for(again, 1.0))[0].committed == [2]  # woken by the version
        assert (await asyncio.wait_for(on_its_way, 1.0))[0].unknown == [9]

    asyncio.run(scenario())


def test_no_copy_of_the_weights_is_taken_while_a_step_changes_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A step changes the slice in place on a worker thread; an export or a held-out score that
    copied it then would hold neither version. Until the step is done there is no copy."""

    async def scenario() -> None:
        srv = server(tmp_path, Standby(), every=100)
        before = weights_of(srv)
        inside, release = threading.Event(), threading.Event()
        honest_step = srv.shard._optimizer.step

        def slow_step() -> None:
            honest_step()  # the weights have changed here, the version not yet
            inside.set()
            release.wait(10)

        monkeypatch.setattr(srv.shard._optimizer, "step", slow_step)
        stepping = asyncio.create_task(step(srv, 1))
        await asyncio.to_thread(inside.wait, 10)
        assert srv.version == 0 and srv.weights() is None
        release.set()
        await asyncio.wait_for(stepping, 10)
        version, after = srv.weights() or (None, before)
        assert version == 1 and not torch.equal(after, before)
        await srv.close()

    asyncio.run(scenario())
