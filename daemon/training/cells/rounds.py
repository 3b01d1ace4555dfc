"""The end of a share at one cell, and of the round it closes: the contribution, and the sync.

A round is H shares (``local_steps``); stage 0 marks the last one ``round_end``. When that
share is done here the cell takes its contribution (the round's mean gradient, or its
pseudo-gradient) and hands it to ``Contributions``, then goes on at once. A contribution that
is not finite never leaves the cell: the round is dropped and stage 0 gives its shares back to
the ledger, to be trained again.

Between two shares, nothing is in flight at the cell: the weights that arrived are applied
then. In gradient mode the next round first waits, at most ``SYNC_WAIT_S``, for the step its
contribution went into.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

import torch

from swarmd.models.cell_compute import CellCompute
from swarmd.peers.taskpool.exchange import SYNC_WAIT_S
from swarmd.training.cells.cell_facts import CellFacts, Views, Works
from swarmd.training.cells.cell_stats import CellStats
from swarmd.training.cells.contributions import Contributions
from swarmd.training.cells.in_flight import ShareInFlight
from swarmd.training.cells.puller import Puller

logger = logging.getLogger(__name__)


def _non_finite(vector: torch.Tensor) -> int:
    """How many of the values are NaN or infinite (0 for a contribution fit to send)."""
    return int(vector.numel() - torch.isfinite(vector).sum())


def named_once(share_ids: list[int], tickets: list[str]) -> tuple[list[int], list[str]]:
    """A round's shares, each named once with the ticket of its last issue, in the order they
    were last done. A share whose lease lapsed while its round ran (a pipeline stalled past
    ``LEASE_S``) is issued again, often to the same pipeline, and trained twice in one round;
    a contribution naming an ID twice is refused by the wire's schema, and its cell stopped."""
    last = {share_id: i for i, share_id in enumerate(share_ids)}
    keep = sorted(last.values())
    return [share_ids[i] for i in keep], [tickets[i] for i in keep]


class RoundsCell(Views, Works, Protocol):
    """What the rounds use of their cell: whether it stopped, its worker thread, its waits."""


class CellRounds:
    def __init__(
        self,
        facts: CellFacts,
        cell: RoundsCell,
        compute: CellCompute,
        stats: CellStats,
        puller: Puller,
        contributions: Contributions,
        give_back: Callable[[list[int]], None],
    ) -> None:
        """``give_back`` hands a dropped round's shares back to the ledger (stage 0 only: the
        stage-0 feeder does it; elsewhere it does nothing)."""
        self.facts, self.cell, self.compute, self.stats = facts, cell, compute, stats
        self.puller, self.contributions, self.give_back = puller, contributions, give_back
        self._shares: list[int] = []  # the shares done here this round
        self._tickets: list[str] = []  # and their tickets, in the same order
        self._issued = 0  # stage 0: the shares fed this round, less those abandoned
        self._sync_after: list[int] | None = None  # gradient mode: the bases of the round just contributed

    def share_begins(self) -> None:
        """A share opens here; the first of a round takes the weights applied just now as its base."""
        if not self._shares:
            self.puller.round_started()

    def issued(self) -> bool:
        """Stage 0 feeds another share this round; True when it is the round's last."""
        self._issued += 1
        return self._issued >= self.facts.settings.local_steps

    def abandoned(self) -> None:
        """The share in flight was dropped: stage 0 feeds another in its place this round."""
        self._issued = max(0, self._issued - 1)

    async def share_done(self, share: ShareInFlight) -> None:
        """Every micro-batch of ``share`` ran its backward here: the compute ends the share, and
        the round with it when the share is its last."""
        cell, contributions = self.cell, self.contributions
        while share.round_end and not cell.stopped and not await contributions.room():
            await cell.timed(contributions.wait_for_room(1.0))  # backpressure: the last round is not delivered yet
        self.stats.shares += 1
        # Local mode's inner step, numbered as the swarm's: the rounds behind the weights here,
        # H steps each, and the shares of this one.
        inner_step = self.puller.version * self.facts.settings.local_steps + len(self._shares)
        await cell.in_thread(self.compute.end_share, inner_step)
        self._shares.append(share.share_id)
        self._tickets.append(share.ticket)
        if share.round_end:
            await self._end_round()

    async def _end_round(self) -> None:
        cell = self.cell
        vector, micro_batches = await cell.in_thread(self.compute.contribution)
        self.stats.rounds += 1
        share_ids, tickets = named_once(self._shares, self._tickets)
        self._shares, self._tickets, self._issued = [], [], 0
        non_finite = await cell.in_thread(_non_finite, vector)
        if non_finite:
            self._drop(share_ids, non_finite, vector.numel())
            return
        bases = self.puller.round_bases()
        self.contributions.add(share_ids, tickets, vector, micro_batches, bases)
        if self.facts.settings.mode == "gradient":
            self._sync_after = bases

    def _drop(self, share_ids: list[int], non_finite: int, elements: int) -> None:
        """A round whose contribution is not finite never leaves this cell (no codec carries it,
        and a server must not step on it): its shares go back to the ledger to be trained
        again. Left open there, they held the pipeline's quota until their lease lapsed
        (``LEASE_S``, ten minutes) and the pipeline stood still."""
        self.stats.dropped_rounds += 1
        logger.warning(
            "cell %s: the round of shares %s came out with %d non-finite values of %d (weights at version %s); "
            "dropping it: its shares are trained again",
            self.facts.cell,
            share_ids,
            non_finite,
            elements,
            self.puller.version,
        )
        self.give_back(share_ids)

    async def between_shares(self) -> None:
        """Apply the weights that arrived: no micro-batch is in flight here now. In gradient mode
        the next round waits (at most ``SYNC_WAIT_S``) for the step its contribution went into:
        H = 1 is chosen where the exchange is cheap next to the compute, and so the rounds are
        synchronous SGD, each on the weights of every pipeline's previous round, at little cost."""
        if self._sync_after is not None:
            bases, self._sync_after = self._sync_after, None
            with self.stats.timing("sync"):
                if not await self.puller.wait_past(bases, SYNC_WAIT_S, self._step_awaits_this_cell):
                    self.stats.sync_timeouts += 1
        await self.puller.apply()

    def _step_awaits_this_cell(self) -> bool:
        """Alone in the assignment, with every shard's answer to the round no step on it, the next
        step waits for this cell's next round, so waiting for it would stall for ``SYNC_WAIT_S``:
        the batch was cut into shares of a smaller k before a re-plan left one pipeline (each
        round fills half a step), or the round's shares were in a step already (a share given
        back and trained again) or refused."""
        return self.cell.view.pipelines == 1 and self.contributions.step_awaits_more()
