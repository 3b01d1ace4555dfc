"""daemon/training/cells/feeder.py: stage 0 asks the ledger for the next share while the current one
trains, so the round trip does not idle the pipeline; a share asked for ahead that the feeder
cannot use goes back to the ledger that issued it."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from swarmd.peers.wire.messages import Issued, LedgerAbandon, LedgerIssue
from swarmd.training.cells.cell_facts import CellView
from swarmd.training.cells.feeder import Feeder
from tests.unit.training.cells.cell_fakes import FakeCell, facts

pytestmark = pytest.mark.timeout(30)

LEDGER_S = 0.05
FEED_S = 0.02


@dataclass
class Ledger:
    """Answers each ``LedgerIssue`` after ``LEDGER_S`` with the next share ID, recording when and who was asked."""

    asked: list[tuple[float, str]] = field(default_factory=list)
    next_id: int = 0

    async def __call__(self, peer: str, request: Any) -> tuple[Any, list[bytes]]:
        assert isinstance(request, LedgerIssue) and request.want == 1
        self.asked.append((asyncio.get_running_loop().time(), peer))
        await asyncio.sleep(LEDGER_S)
        sid, self.next_id = self.next_id, self.next_id + 1
        return Issued(shares=[[sid, sid * 4, 4]], kept=[], tickets=["t"]), []


@dataclass
class Pipeline:
    """The share in flight (``InFlight``): a micro-batch takes ``FEED_S``; the cell stops after
    ``left`` shares opened."""

    cell: FakeCell
    left: int
    opened: list[tuple[float, int]] = field(default_factory=list)  # (when, share ID)
    fed_last: list[float] = field(default_factory=list)  # when each share's last micro-batch was done
    abandoned_at: int = -1
    done: asyncio.Event = field(default_factory=asyncio.Event)

    def open(self, share: Any) -> None:
        self.opened.append((asyncio.get_running_loop().time(), share.share_id))
        self.left -= 1
        if self.left == 0:
            self.cell.stopped = True
            self.done.set()

    async def feed(self, share: Any, m: int) -> bool:
        await asyncio.sleep(FEED_S)
        if m == share.first + share.count - 1:
            self.fed_last.append(asyncio.get_running_loop().time())
        return True

    async def settled(self) -> None:
        return None


@dataclass
class Rounds:
    async def between_shares(self) -> None:
        return None

    def share_begins(self) -> None:
        return None

    def issued(self) -> bool:
        return False


@dataclass
class Room:
    """The contributions: always room, no shares open."""

    async def room(self) -> bool:
        return True

    async def wait_for_room(self, timeout_s: float) -> bool:
        return True

    def open_shares(self) -> list[int]:
        return []


def stage_zero(shares: int, loaded: Callable[[], bool] = lambda: True) -> tuple[Feeder, FakeCell, Ledger, Pipeline]:
    """The stage-0 cell of a one-stage pipeline whose ledger is ``ledger-a``; it stops after
    ``shares`` shares. ``loaded``: whether its weights are in."""
    ledger = Ledger()
    cell = FakeCell(view=CellView(epoch="e1", ledger="ledger-a"), answer=ledger)
    flight = Pipeline(cell, shares)
    feeder = Feeder(facts((0, 0), stages=1), cell, flight, Rounds(), Room(), loaded)  # type: ignore[arg-type]
    return feeder, cell, ledger, flight


def given_back(cell: FakeCell) -> list[tuple[str, list[int]]]:
    assert all(isinstance(r, LedgerAbandon) for _, r in cell.told)
    return [(peer, list(r.share_ids)) for peer, r in cell.told]


def test_the_next_share_is_asked_for_while_the_current_one_trains() -> None:
    async def scenario() -> None:
        feeder, cell, ledger, flight = stage_zero(shares=5)
        task = asyncio.create_task(feeder.run())
        await asyncio.wait_for(flight.done.wait(), 10)
        await asyncio.wait_for(task, 10)
        # Each next share was asked for while the current one was fed, so its round trip ran
        # during that share's compute, not between the two.
        assert len(ledger.asked) >= 6
        for n, (opened_at, _) in enumerate(flight.opened[:-1]):
            assert opened_at <= ledger.asked[n + 1][0] < flight.fed_last[n]
        assert [sid for _, sid in flight.opened] == [0, 1, 2, 3, 4]  # in the ledger's order
        # Stopped with the sixth asked for ahead: it goes back (or, still in flight, is cancelled).
        assert given_back(cell) in ([], [("ledger-a", [5])])

    asyncio.run(scenario())


def test_a_share_asked_for_ahead_of_a_ledger_that_changed_hands_goes_back_to_it() -> None:
    async def scenario() -> None:
        feeder, cell, ledger, flight = stage_zero(shares=2)
        original = flight.feed

        async def feed(share: Any, m: int) -> bool:
            if share.share_id == 0 and m == share.first:
                await asyncio.sleep(LEDGER_S * 2)  # the share asked for ahead is in by now
                cell.view.ledger = "ledger-b"  # shard (0, 0) moved: its new holder keeps the ledger
            return await original(share, m)

        flight.feed = feed  # type: ignore[method-assign]
        task = asyncio.create_task(feeder.run())
        await asyncio.wait_for(flight.done.wait(), 10)
        await asyncio.wait_for(task, 10)
        assert ("ledger-a", [1]) in given_back(cell)  # back to the ledger that issued it
        assert [peer for _, peer in ledger.asked][:3] == ["ledger-a", "ledger-a", "ledger-b"]
        assert [sid for _, sid in flight.opened] == [0, 2]

    asyncio.run(scenario())


def test_a_share_issued_as_the_view_lost_the_pipeline_goes_back_to_its_ledger_at_once() -> None:
    """The pool's view dropped this pipeline (no epoch) while the ledger answered: stage 0 neither
    opens the share nor keeps it until its lease lapses, it gives it back to the ledger that
    issued it (the view names none any more)."""
    feeder, cell, _, flight = stage_zero(shares=1)
    cell.view = CellView()  # no epoch, no ledger
    assert feeder._open(7, 28, 2, "ticket", "ledger-peer") is None
    assert flight.opened == []
    assert given_back(cell) == [("ledger-peer", [7])]
    feeder.give_back([8])  # no ledger named, none given: nobody to tell
    assert given_back(cell) == [("ledger-peer", [7])]


def test_stage_zero_asks_for_no_share_before_its_weights_are_in() -> None:
    async def scenario() -> None:
        loaded = False
        feeder, cell, ledger, flight = stage_zero(shares=1, loaded=lambda: loaded)
        task = asyncio.create_task(feeder.run())
        await asyncio.sleep(0.5)
        assert ledger.asked == [] and flight.opened == [] and cell.slept  # idle, waiting for the weights
        loaded = True
        await asyncio.wait_for(flight.done.wait(), 10)
        await asyncio.wait_for(task, 10)
        assert [sid for _, sid in flight.opened] == [0]

    asyncio.run(scenario())
