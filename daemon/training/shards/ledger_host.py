"""The share ledger, served: what the holder of shard (0, 0) answers pipelines' stage-0 cells.

The bookkeeping is ``swarmd.peers.taskpool.shares.ShareLedger``; here it meets the network. A
pipeline's stage-0 cell asks for shares (renewing those it still trains or waits to see
committed), reports them complete once its contribution is committed at every shard of stage
0, or abandons them when its pipeline lost a cell. Only the live holder of that pipeline's
stage-0 cell may speak for it (``stage0_holder``), and it may hold at most a round of shares
and one more open. Every share issued comes with a ticket this peer signs
(``swarmd.peers.taskpool.tickets``): the pipeline's cells send it with their contributions, and
every shard server takes a contribution only for shares ticketed to the sender's pipeline. The
ledger's state travels with every step of shard (0, 0) to its standby (``state``), and comes
back with a take-over (``from_state``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from swarmd.peers.taskpool.shares import LedgerError, Share, ShareLedger
from swarmd.peers.wire.errors import NotHolder, OverQuota
from swarmd.peers.wire.messages import Completed, Issued, LedgerAbandon, LedgerComplete, LedgerIssue

logger = logging.getLogger(__name__)

SignTicket = Callable[[Share, int, float], str]
"""A share's ticket for a pipeline at a time, as text (``ShareTicket.sign(...).text()``)."""

LEASE_S = 600.0
"""How long an issued share stays a pipeline's without a renewal (a round of H shares renews it
at every share it asks for, and while it waits for its contribution to be committed)."""


class LedgerHost:
    def __init__(
        self,
        ledger: ShareLedger,
        stage0_holder: Callable[[int], str | None],
        open_limit: Callable[[], int],
        sign_ticket: SignTicket,
    ) -> None:
        self.ledger = ledger
        self.stage0_holder = stage0_holder
        self.open_limit = open_limit
        self.sign_ticket = sign_ticket

    @classmethod
    def from_state(
        cls,
        state: str,
        share_micro_batches: int,
        stage0_holder: Callable[[int], str | None],
        open_limit: Callable[[], int],
        sign_ticket: SignTicket,
    ) -> LedgerHost:
        ledger = (
            ShareLedger.from_metadata(state, share_micro_batches, LEASE_S)
            if state
            else ShareLedger(share_micro_batches, LEASE_S)
        )
        return cls(ledger, stage0_holder, open_limit, sign_ticket)

    def state(self) -> str:
        return self.ledger.to_metadata()

    def follow(self, share_micro_batches: int) -> None:
        """New shares take the assignment's k (a share issued before keeps its own): after a
        re-plan from two pipelines to one, shares of the old k = batch / 2 made every other
        gradient round wait out the synchronous wait for a batch that was not complete."""
        if share_micro_batches >= 1:
            self.ledger.share_micro_batches = share_micro_batches

    def _holder(self, sender: str, pipeline: int) -> str:
        holder = self.stage0_holder(pipeline)
        if holder != sender:
            raise NotHolder(
                f"{sender[:16]} does not hold stage 0 of pipeline {pipeline} here ({str(holder)[:16]}); "
                "only that cell asks for its shares"
            )
        return f"{pipeline}/{sender}"

    def issue(self, sender: str, request: LedgerIssue, now: float) -> Issued:
        holder = self._holder(sender, request.pipeline)
        self._drop_changed_hands(lambda pipeline, peer: pipeline == request.pipeline and peer != sender)
        kept = self.ledger.renew(list(request.renew), holder, now)
        shares = []
        try:
            for _ in range(request.want):
                shares.append(self.ledger.issue(holder, now, self.open_limit()))
        except LedgerError as e:
            if not shares:
                raise OverQuota(str(e)) from None
        return Issued(
            shares=[[s.share_id, s.first, s.count] for s in shares],
            kept=kept,
            tickets=[self.sign_ticket(s, request.pipeline, now) for s in shares],
        )

    def complete(self, sender: str, request: LedgerComplete) -> Completed:
        self._holder(sender, request.pipeline)
        return Completed(done=self.ledger.complete(list(request.share_ids)))

    def abandon(self, sender: str, request: LedgerAbandon) -> None:
        self.ledger.abandon(list(request.share_ids), self._holder(sender, request.pipeline))

    def tick(self, now: float, live: set[str]) -> None:
        """Shares of lapsed leases, of holders that left the swarm, and of pipelines whose
        stage-0 cell changed hands (or that the assignment no longer has) are issued again: their
        old holder cannot report them complete any more. A step that took some of them already
        takes their recompute as a duplicate (share IDs), so none is applied twice."""
        self._drop_changed_hands(lambda pipeline, peer: peer not in live or self.stage0_holder(pipeline) != peer)
        lapsed = self.ledger.expire(now)
        if lapsed:
            logger.info("ledger: %d share(s) lapsed; they will be trained again", len(lapsed))

    def _drop_changed_hands(self, gone: Callable[[int, str], bool]) -> None:
        """Put the open shares of (pipeline, peer) holders that are ``gone`` back first in line.
        Issuing asks it too, of the asking pipeline's earlier holders: a pipeline whose stage-0
        cell moved (its abandon lost as the cell closed) would otherwise be issued the next share
        before the one it dropped, and the swarm would train two batches out of order (on this
        project's miniature model, that alone moves the loss at 114 updates by up to 0.3 nats).
        A ledger that moves issues every share open in it again anyway (``from_metadata``)."""
        for holder in {holder for _, holder in self.ledger.open_shares()}:
            pipeline, peer = holder.split("/", 1)
            if gone(int(pipeline), peer):
                dropped = self.ledger.drop_holder(holder)
                logger.info(
                    "ledger: pipeline %s's stage 0 is no longer %s; its %d open share(s) will be trained again",
                    pipeline,
                    peer[:16],
                    len(dropped),
                )

    def info(self) -> dict[str, object]:
        c = self.ledger.counters
        return {
            "cursor": self.ledger.cursor,
            "done_below": self.ledger.done_below(),
            "open": len(self.ledger.open_shares()),
            "waiting": self.ledger.waiting,
            "issued": c.issued,
            "reissued": c.reissued,
            "completed": c.completed,
            "abandoned": c.abandoned,
            "expired": c.expired,
        }
