"""daemon/training/cells/contributions.py: a round's slices go to their shards' holders and are kept
until committed; a cell starts no round while the last is undelivered (backpressure)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
import torch

from swarmd.peers.wire.errors import AlreadyApplied, BadRequest, NotHolder, Stale, Unavailable
from swarmd.peers.wire.messages import Contribute, Contributed, LedgerComplete, Reduce
from swarmd.training.cells.cell_facts import CellView
from swarmd.training.cells.contributions import Contributions
from tests.unit.training.cells.cell_fakes import FakeCell, facts

pytestmark = pytest.mark.timeout(60)


def taken(committed: bool = False) -> tuple[Contributed, list[bytes]]:
    """A server's answer to a slice it took (and, ``committed``, stepped on at once)."""
    return Contributed(version=3, accepted=True, staleness=0, weight=1.0, duplicate=False, committed=committed), []


def contributions(cell: FakeCell, stage: int = 1) -> Contributions:
    return Contributions(facts((0, stage)), cell, lambda _: 1e9)


async def until(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not condition():
        assert loop.time() < deadline, "the condition did not come true in time"
        await asyncio.sleep(0.01)


async def stopped(cell: FakeCell, tasks: list[asyncio.Task[None]]) -> None:
    cell.stopped = True
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def test_no_room_for_a_round_until_the_last_is_delivered_and_its_shares_stay_open_until_committed() -> None:
    async def scenario() -> None:
        release = asyncio.Event()

        async def server(peer: str, request: Any) -> Any:
            await release.wait()
            return taken()

        cell = FakeCell(answer=server)
        c = contributions(cell)
        assert await c.room()
        c.add([5, 6], ["t5", "t6"], torch.ones(100), 2, [3])
        assert not await c.room() and c.undelivered() == 1
        tasks = c.start()
        assert not await c.wait_for_room(0.2)  # the server has not answered
        release.set()
        assert await c.wait_for_room(5)
        [(peer, request, blobs)] = cell.sent
        assert peer == "server" and isinstance(request, Contribute)
        assert (request.share_ids, request.base_version, request.kind, request.micro_batches) == (
            [5, 6],
            3,
            "gradient",
            2,
        )
        assert len(blobs) == 1 and request.tickets == 0  # "t5" is no ledger's ticket: the slice goes without
        assert c.open_shares() == [5, 6] and c.pending_for(0) == [5, 6]  # delivered is not committed
        c.committed(0, {5})  # part of the round only: still open
        assert c.open_shares() == [5, 6]
        c.committed(0, {5, 6, 9})
        assert c.open_shares() == [] and c.info()["committed_rounds"] == 1
        assert cell.told == []  # only stage 0 tells the ledger
        await stopped(cell, tasks)

    asyncio.run(scenario())


def test_a_round_no_shard_stepped_on_awaits_more_rounds() -> None:
    """What a lone pipeline's wait for its step asks: whether the next step needs more rounds.
    A slice buffered unstepped, one whose shares a step had already, and one refused all do."""

    async def scenario() -> None:
        cell = FakeCell(view=CellView(epoch="e1", next="next", servers=["s0", "s1", "s2"]))
        answers: dict[str, Callable[[], Any]] = {"s0": taken, "s1": taken, "s2": taken}

        def answer(peer: str, request: Any) -> Any:
            return answers[peer]()

        def refuse(error: Exception) -> Callable[[], Any]:
            def raised() -> Any:
                raise error

            return raised

        cell.answer = answer
        c = Contributions(facts((0, 1), shards=3), cell, lambda _: 1e9)
        assert not c.step_awaits_more()  # no round yet
        tasks = c.start()
        answers["s1"] = refuse(AlreadyApplied("had shares [5] already"))
        answers["s2"] = refuse(Stale("from a lineage it cannot use"))
        c.add([5], ["t"], torch.ones(90), 2, [3, 3, 3])
        await until(lambda: c.undelivered() == 0)
        assert c.step_awaits_more()
        c.unknown(0, {5}, "s0")  # shard 0 lost it: its answer no longer counts until resent
        assert not c.step_awaits_more()
        await until(lambda: c.undelivered() == 0)
        assert c.step_awaits_more()
        answers["s0"] = lambda: taken(committed=True)
        c.add([6], ["t"], torch.ones(90), 2, [3, 3, 3])
        await until(lambda: c.undelivered() == 0)
        assert not c.step_awaits_more()  # shard 0 stepped on it: its version will come
        await stopped(cell, tasks)

    asyncio.run(scenario())


def test_stage_zero_tells_the_ledger_once_every_shard_committed_a_round() -> None:
    async def scenario() -> None:
        cell = FakeCell(view=CellView(epoch="e1", next="next", servers=["s0", "s1"], ledger="ledger"))
        cell.answer = lambda peer, request: taken(committed=peer == "s0")
        c = Contributions(facts((0, 0), shards=2), cell, lambda _: 1e9)
        c.add([5], ["t"], torch.ones(100), 2, [3, 3])
        tasks = c.start()
        await until(lambda: len(cell.sent) == 2)
        await until(lambda: c.undelivered() == 0)
        assert cell.told == []  # shard 1 has not committed it yet
        c.committed(1, {5})
        [(peer, request)] = cell.told
        assert peer == "ledger" and isinstance(request, LedgerComplete) and request.share_ids == [5]
        await stopped(cell, tasks)

    asyncio.run(scenario())


def test_a_slice_goes_again_to_a_new_holder_and_to_one_that_does_not_know_it() -> None:
    async def scenario() -> None:
        cell = FakeCell(answer=lambda peer, request: taken())
        c = contributions(cell)
        c.add([5], ["t"], torch.ones(100), 2, [3])
        tasks = c.start()
        await until(lambda: len(cell.sent) == 1)
        cell.view = CellView(epoch="e1", prev="prev", servers=["server-b"])  # the shard moved
        c.servers_changed()
        await until(lambda: len(cell.sent) == 2)
        c.unknown(0, {5}, "server-a")  # not where it was delivered: nothing to do
        c.unknown(0, {5}, "server-b")  # the new holder dropped the step it went into
        await until(lambda: len(cell.sent) == 3)
        assert [peer for peer, _, _ in cell.sent] == ["server", "server-b", "server-b"]
        assert c.info()["resent"] == 1 and c.info()["sent"] == 3 and c.open_shares() == [5]
        await stopped(cell, tasks)

    asyncio.run(scenario())


def test_a_refused_slice_is_dropped_and_one_its_head_fails_goes_to_the_server() -> None:
    async def scenario() -> None:
        def answer(peer: str, request: Any) -> Any:
            if peer == "head":
                raise Unavailable("no longer heads shard 0")
            if request.share_ids == [7]:
                raise BadRequest("malformed")
            return taken()

        cell = FakeCell(view=CellView(epoch="e1", prev="prev", servers=["server"], heads=["head"]), answer=answer)
        c = contributions(cell)
        c.add([5], ["t"], torch.ones(100), 2, [3])
        tasks = c.start()
        await until(lambda: c.undelivered() == 0)
        assert [(peer, type(r).__name__) for peer, r, _ in cell.sent] == [("head", "Reduce"), ("server", "Contribute")]
        assert isinstance(cell.sent[0][1], Reduce) and c.info()["direct"] == 1
        c.add([7], ["t"], torch.ones(100), 2, [3])
        await until(lambda: c.info()["dropped"] == 1)
        await asyncio.sleep(0.3)
        assert [peer for peer, _, _ in cell.sent[2:]] == ["head", "server"]  # refused: not sent again
        c.committed(0, {5})  # the refused round is settled too: nothing to wait for
        assert c.open_shares() == [] and c.info()["committed_rounds"] == 2
        await stopped(cell, tasks)

    asyncio.run(scenario())


def test_a_stopped_cells_contribution_reaches_its_shards_next_holder() -> None:
    """The plan moved the cell and the shard at once: the slice the cell could not deliver to the
    shard's old holder goes to the new one as soon as the pool shows it, and once only."""
    holders = ["old", "old", None, "new"]  # what each look at the pool shows

    def answer(peer: str, request: Any) -> Any:
        if peer != "new":
            raise NotHolder(f"{peer} does not hold shard 0 (any more)")
        return taken(committed=True)

    def servers() -> list[str | None]:
        return [holders.pop(0) if len(holders) > 1 else holders[0]]

    async def scenario() -> None:
        cell = FakeCell(answer=answer)
        c = contributions(cell)
        c.add([5], ["t"], torch.ones(100), 2, [3])
        assert c.undelivered() == 1
        assert await c.deliver_rest(servers, within_s=30)
        sent = [peer for peer, _, _ in cell.sent]
        assert c.undelivered() == 0 and sent.count("new") == 1 and "old" in sent

    asyncio.run(scenario())


def test_a_stopped_cells_contribution_with_no_holder_is_given_up_in_time() -> None:
    async def scenario() -> None:
        c = contributions(FakeCell())
        c.add([5], ["t"], torch.ones(100), 2, [3])
        assert not await c.deliver_rest(lambda: [None], within_s=1)
        assert c.undelivered() == 1

    asyncio.run(scenario())
