"""daemon/training/cells/cell.py: a neighbour's tensor is queued only from this pipeline's neighbour in
this epoch, for a share no larger than the run's; everything else is refused and counted."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import pytest

from swarmd.models.presets import DEFAULT_RUN
from swarmd.models.shape import ModelShape
from swarmd.peers.taskpool.exchange import ExchangeConfig
from swarmd.peers.wire.errors import BadRequest, WrongEpoch
from swarmd.peers.wire.messages import CellBackward, CellForward
from swarmd.training.cells.cell import CellView, CellWorker
from swarmd.training.cells.in_flight import ShareInFlight

pytestmark = pytest.mark.timeout(60)

RUN_ID = "tiny." + "a" * 24


async def never(*_: Any) -> Any:
    raise AssertionError("handle() sends nothing")


@dataclass
class Compute:
    """What a cell's compute is asked outside a micro-batch: the size of its stage's parameters,
    and to drop the share in flight."""

    size: int = 100
    dropped: int = 0

    def drop_share(self) -> None:
        self.dropped += 1


def worker(cell: tuple[int, int] = (0, 1), send: Any = never) -> CellWorker:
    """Cell (0, 1) of two stages, whose previous cell is ``prev`` in epoch ``e1``; k = 2 of a
    batch of 4. ``handle`` checks and queues; nothing here computes."""
    worker = CellWorker(
        cell,
        2,
        ExchangeConfig(batch_micro_batches=4, share_micro_batches=2),
        Compute(),  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]  # no data: nothing here reads tokens
        4,
        RUN_ID,
        send,
        lambda _: 1e9,
        shape=ModelShape.from_dict(DEFAULT_RUN["model"]),
        shards=1,
    )
    worker.update(CellView(epoch="e1", prev="prev", next=None, servers=["server"]))
    return worker


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


def test_a_new_epoch_drops_the_share_in_flight_and_stage_zero_gives_it_back_to_its_ledger() -> None:
    told: list[tuple[str, Any]] = []

    async def send(peer: str, request: Any, blobs: list[bytes], timeout_s: float) -> Any:
        told.append((peer, request))
        return None, []

    async def scenario() -> None:
        cell = worker((0, 0), send)
        cell.update(CellView(epoch="e1", next="next", servers=["server"], ledger="ledger-a"))
        cell.flight.open(ShareInFlight(7, 28, 2, False, "e1", 1, "t7"))
        cell.update(CellView(epoch="e2", next="next", servers=["server"], ledger="ledger-b"))
        await asyncio.sleep(0.2)  # the background send and the worker thread's drop
        assert cell.flight.share is None and cell.stats.abandoned == 1
        assert isinstance(cell.compute, Compute) and cell.compute.dropped == 1
        assert [(peer, type(r).__name__, r.share_ids) for peer, r in told] == [("ledger-a", "LedgerAbandon", [7])]
        await cell.stop(1.0)

    asyncio.run(scenario())
