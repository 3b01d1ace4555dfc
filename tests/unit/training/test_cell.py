"""daemon/training/cell.py: a neighbour's tensor is queued only from this pipeline's neighbour in
this epoch, for a share no larger than the run's; everything else is refused and counted."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from swarmd.models.presets import DEFAULT_RUN
from swarmd.models.shape import ModelShape
from swarmd.peers.taskpool.exchange import ExchangeConfig
from swarmd.peers.wire.errors import BadRequest, NotHolder, WrongEpoch
from swarmd.peers.wire.messages import CellBackward, CellForward, Contributed
from swarmd.training.cell import CellView, CellWorker

pytestmark = pytest.mark.timeout(60)

RUN_ID = "tiny." + "a" * 24


async def never(*_: Any) -> Any:
    raise AssertionError("handle() sends nothing")


def worker() -> CellWorker:
    """Cell (0, 1) of two stages, whose previous cell is ``prev`` in epoch ``e1``; k = 2 of a
    batch of 4. ``handle`` checks and queues; nothing here computes."""
    shape = ModelShape.from_dict(DEFAULT_RUN["model"])
    settings = ExchangeConfig(batch_micro_batches=4, share_micro_batches=2)
    compute: Any = SimpleNamespace(size=100)
    cell = CellWorker((0, 1), 2, settings, compute, None, 4, RUN_ID, never, lambda _: 1e9, shape=shape, shards=1)  # type: ignore[arg-type]
    cell.update(CellView(epoch="e1", prev="prev", next=None, servers=["server"]))
    return cell


def forward(**kw: Any) -> CellForward:
    fields: dict[str, Any] = dict(
        run_id=RUN_ID,
        pipeline=0,
        stage=1,
        epoch="e1",
        share_id=1,
        share_first=8,
        share_count=2,
        round_end=True,
        attempt=0,
        micro_batch=8,
        version=0,
    )
    fields.update(kw)
    return CellForward(**fields)


def test_a_neighbours_tensor_is_queued_only_from_the_neighbour_for_a_share_of_the_runs_size() -> None:
    async def scenario() -> None:
        cell = worker()
        with pytest.raises(WrongEpoch):
            await cell.handle("stranger", forward(), b"")  # not the previous cell
        with pytest.raises(WrongEpoch):
            await cell.handle("prev", forward(epoch="e0"), b"")  # another epoch's
        with pytest.raises(WrongEpoch):
            backward = CellBackward(**{**forward().__dict__})
            await cell.handle("prev", backward, b"")  # a gradient comes from the next cell, not the previous
        assert cell.stats.refused_epoch == 3
        with pytest.raises(BadRequest, match="claims 1000000 micro-batches; a share of this run holds at most 4"):
            await cell.handle("prev", forward(share_first=10**9, share_count=10**6, micro_batch=10**9), b"")
        assert cell.stats.refused_share == 1 and cell.info()["refused_share"] == 1
        await cell.handle("prev", forward(), b"frame")
        item = await cell.flight.next_item(1.0)
        assert (item.kind, item.micro_batch, item.blob) == ("forward", 8, b"frame")

    asyncio.run(scenario())


def test_a_stopped_cells_contribution_reaches_its_shards_next_holder() -> None:
    """The plan moved the cell and the shard at once: the slice the cell could not deliver to the
    shard's old holder goes to the new one as soon as the pool shows it, and once only."""
    holders = ["old", "old", None, "new"]  # what each look at the pool shows
    sent: list[str] = []

    async def send(peer: str, request: Any, blobs: list[bytes], timeout_s: float) -> Any:
        sent.append(peer)
        if peer != "new":
            raise NotHolder(f"{peer} does not hold shard 0 (any more)")
        return Contributed(version=3, accepted=True, staleness=0, weight=1.0, duplicate=False, committed=True), []

    def servers() -> list[str | None]:
        return [holders.pop(0) if len(holders) > 1 else holders[0]]

    async def scenario() -> None:
        cell = worker()
        cell._send = send
        cell.contributions.add([5], ["t"], torch.ones(100), 2, [3])
        assert cell.contributions.undelivered() == 1
        assert await cell.contributions.deliver_rest(servers, within_s=30)
        assert cell.contributions.undelivered() == 0 and sent.count("new") == 1 and "old" in sent

    asyncio.run(scenario())


def test_a_stopped_cells_contribution_with_no_holder_is_given_up_in_time() -> None:
    async def scenario() -> None:
        cell = worker()
        cell.contributions.add([5], ["t"], torch.ones(100), 2, [3])
        assert not await cell.contributions.deliver_rest(lambda: [None], within_s=1)
        assert cell.contributions.undelivered() == 1

    asyncio.run(scenario())


def test_a_share_issued_as_the_view_lost_the_pipeline_goes_back_to_its_ledger_at_once() -> None:
    """The pool's view dropped this pipeline (no epoch) while the ledger answered: stage 0 neither
    opens the share nor keeps it until its lease lapses, it gives it back to the ledger that
    issued it (the view names none any more)."""
    told: list[tuple[str, Any]] = []

    async def send(peer: str, request: Any, blobs: list[bytes], timeout_s: float) -> Any:
        told.append((peer, request))
        return None, []

    async def scenario() -> None:
        shape = ModelShape.from_dict(DEFAULT_RUN["model"])
        settings = ExchangeConfig(batch_micro_batches=4, share_micro_batches=2)
        compute: Any = SimpleNamespace(size=100)
        cell = CellWorker((0, 0), 2, settings, compute, None, 4, RUN_ID, send, lambda _: 1e9, shape=shape, shards=1)  # type: ignore[arg-type]
        cell.update(CellView())  # no epoch, no ledger
        assert cell.feeder is not None
        assert cell.feeder._open(7, 28, 2, "ticket", "ledger-peer") is None
        await asyncio.sleep(0)  # the background send
        assert cell.flight.share is None
        assert [(peer, type(r).__name__, r.share_ids) for peer, r in told] == [("ledger-peer", "LedgerAbandon", [7])]

    asyncio.run(scenario())
