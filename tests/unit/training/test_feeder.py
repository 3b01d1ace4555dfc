"""daemon/training/feeder.py: stage 0 asks the ledger for the next share while the current one
trains, so the round trip does not idle the pipeline; a share asked for ahead that the feeder
cannot use goes back to the ledger that issued it."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from swarmd.peers.wire.messages import Issued, LedgerAbandon, LedgerIssue
from swarmd.training.feeder import Feeder

pytestmark = pytest.mark.timeout(30)

LEDGER_S = 0.05
FEED_S = 0.02


class FakeCell:
    """What the feeder uses of a stage-0 cell: a ledger that answers after ``LEDGER_S`` and a
    pipeline that takes ``FEED_S`` a micro-batch. It stops after ``shares`` shares opened."""

    def __init__(self, shares: int) -> None:
        self.run_id, self.pipeline, self.is_last, self.stopped = "tiny." + "a" * 24, 0, True, False
        self.view = SimpleNamespace(epoch="e1", ledger="ledger-a", next=None)
        self.puller = SimpleNamespace(loaded=True)
        self.contributions = SimpleNamespace(room=self._true, open_shares=lambda: [], wait_for_room=self._true)
        self.rounds = SimpleNamespace(between_shares=self._nothing, share_begins=lambda: None, issued=lambda: False)
        self.flight = SimpleNamespace(open=self._open, feed=self._feed, settled=self._nothing, abandoned_at=-1)
        self.asked: list[tuple[float, str]] = []  # (when, ledger) of each LedgerIssue
        self.opened: list[tuple[float, int]] = []  # (when, share ID)
        self.given_back: list[tuple[str, list[int]]] = []
        self.fed_last: list[float] = []  # when each share's last micro-batch was done
        self.left, self.next_id = shares, 0
        self.done = asyncio.Event()

    async def _true(self, *_: Any) -> bool:
        return True

    async def _nothing(self) -> None:
        return None

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    async def timed(self, awaitable: Any) -> Any:
        return await awaitable

    def _open(self, share: Any) -> None:
        self.opened.append((asyncio.get_running_loop().time(), share.share_id))
        self.left -= 1
        if self.left == 0:
            self.stopped = True
            self.done.set()

    async def _feed(self, share: Any, m: int) -> bool:
        await asyncio.sleep(FEED_S)
        if m == share.first + share.count - 1:
            self.fed_last.append(asyncio.get_running_loop().time())
        return True

    async def send(self, peer: str, request: Any, blobs: list[bytes], timeout_s: float) -> tuple[Any, list[bytes]]:
        assert isinstance(request, LedgerIssue) and request.want == 1
        self.asked.append((asyncio.get_running_loop().time(), peer))
        await asyncio.sleep(LEDGER_S)
        sid = self.next_id
        self.next_id += 1
        return Issued(shares=[[sid, sid * 4, 4]], kept=[], tickets=["t"]), []

    def tell(self, peer: str, request: Any) -> None:
        assert isinstance(request, LedgerAbandon)
        self.given_back.append((peer, list(request.share_ids)))


def test_the_next_share_is_asked_for_while_the_current_one_trains() -> None:
    async def scenario() -> None:
        cell = FakeCell(shares=5)
        feeder = Feeder(cell)  # type: ignore[arg-type]
        task = asyncio.create_task(feeder.run())
        await asyncio.wait_for(cell.done.wait(), 10)
        await asyncio.wait_for(task, 10)
        # Each next share was asked for while the current one was fed, so its round trip ran
        # during that share's compute, not between the two.
        assert len(cell.asked) >= 6
        for n, (opened_at, _) in enumerate(cell.opened[:-1]):
            assert opened_at <= cell.asked[n + 1][0] < cell.fed_last[n]
        assert [sid for _, sid in cell.opened] == [0, 1, 2, 3, 4]  # in the ledger's order
        # Stopped with the sixth asked for ahead: it goes back (or, still in flight, is cancelled).
        assert cell.given_back in ([], [("ledger-a", [5])])

    asyncio.run(scenario())


def test_a_share_asked_for_ahead_of_a_ledger_that_changed_hands_goes_back_to_it() -> None:
    async def scenario() -> None:
        cell = FakeCell(shares=2)
        feeder = Feeder(cell)  # type: ignore[arg-type]
        original = cell._feed

        async def feed(share: Any, m: int) -> bool:
            if share.share_id == 0 and m == share.first:
                await asyncio.sleep(LEDGER_S * 2)  # the share asked for ahead is in by now
                cell.view.ledger = "ledger-b"  # shard (0, 0) moved: its new holder keeps the ledger
            return await original(share, m)

        cell.flight.feed = feed
        task = asyncio.create_task(feeder.run())
        await asyncio.wait_for(cell.done.wait(), 10)
        await asyncio.wait_for(task, 10)
        assert ("ledger-a", [1]) in cell.given_back  # back to the ledger that issued it
        assert [peer for _, peer in cell.asked][:3] == ["ledger-a", "ledger-a", "ledger-b"]
        assert [sid for _, sid in cell.opened] == [0, 2]

    asyncio.run(scenario())
