"""daemon/training/cells/puller.py: a cell's weights come whole, then as deltas, and are taken up only
between shares; the pulls report the contributions' commits, and a holder behind the cell
sends it back to a whole pull."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

from swarmd.peers.wire.codecs import encode_vector
from swarmd.peers.wire.messages import Pull, Pulled, PullFromHead
from swarmd.training.cells.cell_facts import CellView
from swarmd.training.cells.puller import POLL_WAIT_S, Puller
from tests.unit.training.cells.cell_fakes import FakeCell, facts

pytestmark = pytest.mark.timeout(60)

SIZE = 8


@dataclass
class Compute:
    """A stage's parameters as the puller loads them: the global copy, and what was asked of it."""

    size: int = SIZE
    global_vector: torch.Tensor = field(default_factory=lambda: torch.zeros(SIZE))
    local: torch.Tensor | None = None
    calls: list[str] = field(default_factory=list)

    def load_global(self, lo: int, vector: torch.Tensor) -> None:
        self.global_vector[lo : lo + len(vector)] = vector
        self.calls.append("whole")

    def apply_deltas(self, lo: int, deltas: list[tuple[int, torch.Tensor]]) -> None:
        for _, delta in deltas:
            self.global_vector[lo : lo + len(delta)] += delta.float()
        self.calls.append(f"deltas {[v for v, _ in deltas]}")

    def load_flat(self, vector: torch.Tensor) -> None:
        self.local = vector.clone()
        self.calls.append("start")

    def rebase(self) -> None:
        self.calls.append("rebase")


@dataclass
class Books:
    """The contributions, as the pulls ask about and report to them."""

    pending: list[int] = field(default_factory=lambda: [5, 6])
    committed_: list[set[int]] = field(default_factory=list)
    unknown_: list[tuple[set[int], str]] = field(default_factory=list)

    def pending_for(self, k: int) -> list[int]:
        return list(self.pending)

    def committed(self, k: int, share_ids: set[int]) -> None:
        self.committed_.append(share_ids)

    def unknown(self, k: int, share_ids: set[int], server: str) -> None:
        self.unknown_.append((share_ids, server))


@dataclass
class Relay:
    """The reducer of a peer whose cell heads the shard for its group."""

    members: list[int] = field(default_factory=lambda: [90])
    offered: list[Pulled] = field(default_factory=list)

    def asked(self, stage: int, shard: int) -> list[int]:
        return list(self.members)

    async def offer(self, stage: int, shard: int, answer: Pulled, blobs: list[bytes]) -> None:
        self.offered.append(answer)


def whole(version: int, vector: torch.Tensor) -> tuple[Pulled, list[bytes]]:
    return Pulled(version=version, kind="full", versions=[version], committed=[]), [
        bytes(encode_vector(vector, "fp32"))
    ]


def deltas(
    versions: list[int], committed: tuple[int, ...] = (), unknown: tuple[int, ...] = ()
) -> tuple[Pulled, list[bytes]]:
    """Each version one step of +1 on every parameter."""
    blobs = [bytes(encode_vector(torch.ones(SIZE), "fp16")) for _ in versions]
    answer = Pulled(
        version=versions[-1], kind="deltas", versions=versions, committed=list(committed), unknown=list(unknown)
    )
    return answer, blobs


async def until(condition: Any, timeout_s: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not condition():
        assert loop.time() < deadline, "the condition did not come true in time"
        await asyncio.sleep(0.01)


@dataclass
class Server:
    """Answers each pull with the next answer the test queued, waiting for one if none is."""

    answers: asyncio.Queue[tuple[Pulled, list[bytes]]] = field(default_factory=asyncio.Queue)

    async def __call__(self, peer: str, request: Any) -> tuple[Pulled, list[bytes]]:
        return await self.answers.get()

    def will(self, *answers: tuple[Pulled, list[bytes]]) -> None:
        for answer in answers:
            self.answers.put_nowait(answer)


def puller(view: CellView | None = None, relay: Relay | None = None) -> tuple[Puller, FakeCell, Compute, Books, Server]:
    """Cell (0, 1) of one shard, whose server answers the pulls in the order the test queues them."""
    server = Server()
    cell = FakeCell(answer=server, **({"view": view} if view else {}))
    compute, books = Compute(), Books()
    p = Puller(facts((0, 1)), cell, compute, books, relay)  # type: ignore[arg-type]
    return p, cell, compute, books, server


def test_weights_come_whole_then_as_deltas_and_are_taken_up_only_between_shares() -> None:
    async def scenario() -> None:
        p, cell, compute, books, server = puller()
        tasks = p.start()
        server.will(whole(3, torch.arange(SIZE, dtype=torch.float32)), deltas([4, 5], committed=(5,)))
        assert await p.wait_past([4], 10)
        await until(lambda: books.committed_ == [set(), {5}])
        assert compute.calls == [] and not p.loaded  # nothing taken up while a share may be in flight
        await p.apply()  # between two shares
        assert compute.calls == ["whole", "deltas [4, 5]", "start"] and p.loaded and p.version == 5
        assert compute.local is not None and torch.equal(compute.local, torch.arange(SIZE) + 2.0)
        assert p.round_bases() == [5]

        server.will(deltas([6]))
        assert await p.wait_past([5], 10)
        assert p.version == 5 and len(compute.calls) == 3  # arrived, not applied
        await p.apply()
        assert compute.calls[3:] == ["deltas [6]", "rebase"] and p.version == 6
        assert p.round_bases() == [5]  # gradient mode: the round's base moves when a round starts
        p.round_started()
        assert p.round_bases() == [6]

        pulls = [r for _, r, _ in cell.sent]
        assert all(isinstance(r, Pull) and r.pending_share_ids == [5, 6] for r in pulls)
        assert [(r.have_version, r.wait_s) for r in pulls[:4]] == [
            (-1, 0.0),
            (3, POLL_WAIT_S),
            (5, POLL_WAIT_S),
            (6, POLL_WAIT_S),
        ]
        assert p.info()["full_pulls"] == 1 and p.info()["delta_pulls"] == 2
        for task in tasks:
            task.cancel()

    asyncio.run(scenario())


def test_a_holder_behind_the_cell_sends_it_back_to_a_whole_pull_and_unknown_shares_go_again() -> None:
    async def scenario() -> None:
        p, cell, _, books, server = puller()
        tasks = p.start()
        lineage = (
            Pulled(version=2, kind="none", versions=[], committed=[]),
            [],
        )  # the shard's new holder could not replay everything
        server.will(whole(3, torch.zeros(SIZE)), deltas([4], unknown=(6,)), lineage)
        await until(lambda: len(cell.sent) == 4)
        assert books.unknown_ == [({6}, "server")]
        assert [r.have_version for _, r, _ in cell.sent] == [-1, 3, 4, -1]
        for task in tasks:
            task.cancel()

    asyncio.run(scenario())


def test_a_cell_heading_its_shard_asks_for_its_members_and_offers_them_what_came() -> None:
    async def scenario() -> None:
        relay = Relay()
        view = CellView(epoch="e1", servers=["server"], heads=["here"], head_pipelines=[0])
        p, cell, _, _, server = puller(view, relay)
        tasks = p.start()
        server.will(whole(3, torch.zeros(SIZE)), deltas([4]))
        await until(lambda: len(relay.offered) == 2)
        [(peer, first, _), (_, second, _), *_] = cell.sent
        assert peer == "server" and isinstance(first, Pull) and not isinstance(first, PullFromHead)
        assert first.pending_share_ids == [90, 5, 6] and second.pending_share_ids == [90, 5, 6]
        assert [a.kind for a in relay.offered] == ["full", "deltas"]
        for task in tasks:
            task.cancel()

    asyncio.run(scenario())


def test_a_wait_for_a_step_ends_once_it_waits_in_vain_and_else_times_out() -> None:
    async def scenario() -> None:
        p, _, _, _, server = puller()
        tasks = p.start()
        server.will(whole(3, torch.zeros(SIZE)))
        await until(lambda: p.shards[0].fetched == 3)
        vain = False
        loop = asyncio.get_running_loop()

        async def turn_vain() -> None:
            nonlocal vain
            await asyncio.sleep(0.2)
            vain = True

        started = loop.time()
        turned = asyncio.create_task(turn_vain())
        assert await p.wait_past([3], 10, lambda: vain)  # ended, not timed out
        assert loop.time() - started < 2
        await turned
        assert not await p.wait_past([3], 0.3)  # nothing says in vain: the timeout
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    asyncio.run(scenario())
