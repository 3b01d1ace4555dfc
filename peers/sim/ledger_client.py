"""The cells' side of the share ledger (``swarmd.peers.taskpool.shares.ShareLedger``, kept
with shard ``(0, 0)``): the shares each stage-0 holder holds open, their renewals, and the
shares given back before any of their work began (issuing one again is no recompute).

The ledger itself is the simulation's (``sim.ledger``): a failover of shard ``(0, 0)``
replaces it, so it is looked up at every call, never kept.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from swarmd.peers.taskpool.shares import LedgerError, Share, open_limit

if TYPE_CHECKING:
    from swarmd.peers.sim.simulator import Simulation


class LedgerClient:
    def __init__(self, sim: Simulation) -> None:
        self.sim = sim
        self.held: dict[str, set[int]] = {}
        """Ledger holder -> the shares it holds open."""
        self.unspent: set[int] = set()
        """Shares given back before any of their work began: issuing one again is no recompute."""
        self.renewed: dict[str, float] = {}
        """Ledger holder -> when it last renewed its shares (a third of their lease at most ago)."""

    def issue(self, now: float, holder: str, count: int) -> list[Share]:
        """Up to ``count`` shares for ``holder``, fewer when the ledger has no more for it;
        first its open shares are renewed if a third of their lease went by."""
        sim = self.sim
        mine = self.held.setdefault(holder, set())
        if now - self.renewed.get(holder, -math.inf) >= sim.settings.lease_s / 3:
            sim.ledger.renew(list(mine), holder, now)  # well before any lapses
            self.renewed[holder] = now
        shares = []
        for _ in range(count):
            try:
                share = sim.ledger.issue(holder, now, open_limit(sim.local_steps))
            except LedgerError:
                break
            if share.share_id in self.unspent:
                self.unspent.discard(share.share_id)
                sim.counts["reissued_unspent"] += 1
            mine.add(share.share_id)
            shares.append(share)
        return shares

    def give_back(self, holder: str, share_ids: list[int], first_begun: bool) -> None:
        """A broken segment's shares are abandoned (issued again): the first is recomputed if
        it was begun, the others go back unspent."""
        gone = set(self.sim.ledger.abandon(share_ids, holder))
        self.held.get(holder, set()).difference_update(gone)
        self.unspent.update(i for i in share_ids[1 if first_begun else 0 :] if i in gone)

    def abandon(self, holder: str, share_ids: list[int]) -> None:
        """A round's shares trained by a holder that left its cell are issued again."""
        mine = self.held.get(holder, set())
        gone = self.sim.ledger.abandon([i for i in share_ids if i in mine], holder)
        mine.difference_update(gone)

    def complete(self, holder: str, share_ids: tuple[int, ...]) -> None:
        """A round is through at every shard of stage 0: its shares are done."""
        done = self.sim.ledger.complete(list(share_ids))
        self.held.get(holder, set()).difference_update(done)

    def forget(self, holder: str) -> None:
        """``holder``'s leases lapsed: the ledger issues its shares again."""
        self.sim.ledger.drop_holder(holder)
        self.held.pop(holder, None)
        self.renewed.pop(holder, None)

    def restarted(self) -> None:
        """The ledger was rebuilt from its checkpoint: every share open before is to be issued again."""
        self.held.clear()
