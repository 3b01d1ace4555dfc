"""Stage 0's shares from the ledger: asked for, fed into the pipeline, given back when dropped.

The stage-0 cell asks the ledger (the holder of shard (0, 0)) for one share at a time,
renewing with the same request the shares whose contributions are not committed yet. It feeds
the share's micro-batches at most ``window`` at once and waits until the share is over here
(stage 0 runs each micro-batch's backward last) before it starts the next. It asks for the
next share as soon as one opens, so the ledger's round trip hides behind the share's compute
rather than idling the pipeline between shares (across regions it was a sixth of a share's
time); a share asked for ahead that cannot be used (the ledger changed hands, or it waited
past ``AHEAD_MAX_S``) goes back. A share its pipeline could not finish, or a round dropped as
not finite, goes back to the ledger (``LedgerAbandon``), which issues it again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from swarmd.peers.wire.errors import RpcError
from swarmd.peers.wire.messages import LedgerAbandon, LedgerIssue
from swarmd.training.cells.cell_facts import CellFacts, CellHandle
from swarmd.training.cells.contributions import Contributions
from swarmd.training.cells.in_flight import InFlight, ShareInFlight
from swarmd.training.cells.rounds import CellRounds

logger = logging.getLogger(__name__)

ISSUE_RETRY_S = 0.5
AHEAD_MAX_S = 60.0
"""A share asked for ahead and not started within this long goes back and a fresh one is asked
for: its lease (ten minutes) must not run out while the pipeline waits (paused, or no room)."""
ABANDON_BACKOFF_S = (0.25, 5.0)
"""Stage 0's wait after a share its pipeline could not finish, doubling while they fail: a
neighbour that is not ready yet is asked again soon, not hundreds of times a second."""


Issued = tuple[int, int, int, str, str]
"""A share from the ledger: its ID, first micro-batch, count, ticket, and the ledger that issued it."""


class Feeder:
    def __init__(
        self,
        facts: CellFacts,
        cell: CellHandle,
        flight: InFlight,
        rounds: CellRounds,
        contributions: Contributions,
        loaded: Callable[[], bool],
    ) -> None:
        """``loaded`` says whether the cell's weights are in (``Puller.loaded``): it feeds none before."""
        self.facts, self.cell, self.flight = facts, cell, flight
        self.rounds, self.contributions, self.loaded = rounds, contributions, loaded
        self._attempts = 0  # shares fed so far
        self._ahead: asyncio.Task[Issued | None] | None = None
        self._ahead_at = 0.0

    async def run(self) -> None:
        try:
            await self._run()
        finally:
            await self._drop_ahead()

    async def _run(self) -> None:
        cell = self.cell
        backoff = 0.0  # after a share the pipeline could not finish (a neighbour not ready yet)
        while not cell.stopped:
            if backoff:
                await cell.sleep(backoff)
            await self.rounds.between_shares()  # the first whole pull too: nothing is in flight here now
            if not await self._ready():
                await self._idle()
                continue
            issued = await self._next()
            if cell.stopped:  # stopped while the ledger answered (its share is issued again on expiry)
                break
            if issued is None:
                await cell.sleep(ISSUE_RETRY_S)
                continue
            share = self._open(*issued)
            if share is None:
                continue
            self._ahead, self._ahead_at = asyncio.create_task(self._issue()), time.monotonic()
            for m in range(share.first, share.first + share.count):
                if not await self.flight.feed(share, m):
                    break
            await self.flight.settled()
            finished = self.flight.abandoned_at != share.share_id
            backoff = 0.0 if finished else min(max(2 * backoff, ABANDON_BACKOFF_S[0]), ABANDON_BACKOFF_S[1])

    def _open(self, share_id: int, first: int, count: int, ticket: str, ledger: str) -> ShareInFlight | None:
        """The share the ledger issued, opened here; None when the pool's view lost this
        pipeline while the ledger answered (its epoch is gone): the share goes back to that
        ledger at once, else it would wait out its lease before anyone trained it."""
        epoch = self.cell.view.epoch
        if epoch is None:
            self.give_back([share_id], ledger)
            return None
        self.rounds.share_begins()
        round_end = self.rounds.issued()
        # Increasing across this cell's restarts too: a downstream cell may still hold an older try.
        self._attempts = max(self._attempts + 1, int(time.time() * 10))
        share = ShareInFlight(share_id, first, count, round_end, epoch, self._attempts, ticket)
        self.flight.open(share)
        return share

    def give_back(self, share_ids: list[int], ledger: str | None = None) -> None:
        """Tell the ledger (``ledger``, else the one the view names) these shares will not be
        finished here: it issues them again."""
        cell = self.cell
        ledger = ledger or cell.view.ledger
        if ledger is not None:
            request = LedgerAbandon(run_id=self.facts.run_id, pipeline=self.facts.pipeline, share_ids=list(share_ids))
            cell.tell(ledger, request)

    async def _ready(self) -> bool:
        v = self.cell.view
        return (
            v.epoch is not None
            and v.ledger is not None
            and (self.facts.is_last or v.next is not None)
            and self.loaded()
            and await self.contributions.room()
        )

    async def _next(self) -> Issued | None:
        """The share asked for ahead, if it is still good to start now; else one asked for now."""
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            issued = await ahead
            if issued is not None:
                if issued[4] == self.cell.view.ledger and time.monotonic() - self._ahead_at <= AHEAD_MAX_S:
                    return issued
                self.give_back([issued[0]], issued[4])
        return await self._issue()

    async def _drop_ahead(self) -> None:
        """Stopping: a share asked for ahead goes back (a request still out is cancelled; the
        ledger issues its share again once the lease lapses)."""
        ahead, self._ahead = self._ahead, None
        if ahead is None:
            return
        if not ahead.done():
            ahead.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await ahead
            return
        issued = None if ahead.cancelled() or ahead.exception() is not None else ahead.result()
        if issued is not None:
            self.give_back([issued[0]], issued[4])

    async def _issue(self) -> Issued | None:
        """The next share from the ledger, its ticket (which every cell of the pipeline sends
        with its contribution), and the ledger that issued it."""
        cell = self.cell
        ledger = cell.view.ledger
        if ledger is None:
            return None
        request = LedgerIssue(
            run_id=self.facts.run_id, pipeline=self.facts.pipeline, renew=self.contributions.open_shares(), want=1
        )
        try:
            answer, _ = await cell.send(ledger, request, [], 30.0)
        except RpcError as e:
            logger.debug("cell %s: no share from the ledger at %s (%s)", self.facts.cell, ledger, e)
            return None
        if not answer.shares:
            return None
        share_id, first, count = answer.shares[0]
        return share_id, first, count, answer.tickets[0] if answer.tickets else "", ledger

    async def _idle(self) -> None:
        """Stage 0 cannot feed yet: wait for what it lacks (room to contribute, weights, a view),
        woken as soon as the contributions move on, else after a short while."""
        cell = self.cell
        if self.loaded() and cell.view.epoch is not None and cell.view.ledger is not None:
            await cell.timed(self.contributions.wait_for_room(0.5))
        else:
            await cell.sleep(0.2)
