"""The cells' side of the share ledger (``swarmd.peers.taskpool.shares.ShareLedger``).

The ledger is kept with shard ``(0, 0)``; its cells' side holds the shares each stage-0 holder
holds open, their renewals, and the shares given back before any of their work began (issuing
one again is no recompute).

The client owns the ledger too (``ledger``): a failover of shard ``(0, 0)`` rebuilds it from
its checkpoint's metadata (``restarted``), as the daemon's standby does.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from swarmd.peers.taskpool.shares import LedgerError, Share, ShareLedger, open_limit

if TYPE_CHECKING:
    from swarmd.peers.sim.workload import RunSizes
    from swarmd.peers.sim.world import World


class LedgerClient:
    def __init__(self, world: World, sizes: RunSizes) -> None:
        self.world, self.sizes = world, sizes
        self.ledger = ShareLedger(sizes.share_micro_batches, world.settings.lease_s)
        """The ledger at shard (0, 0)'s holder."""
        self.held: dict[str, set[int]] = {}
        """Ledger holder -> the shares it holds open."""
        self.unspent: set[int] = set()
        """Shares given back before any of their work began: issuing one again is no recompute."""
        self.renewed: dict[str, float] = {}
        """Ledger holder -> when it last renewed its shares (a third of their lease at most ago)."""

    def issue(self, now: float, holder: str, count: int) -> list[Share]:
        """Up to ``count`` shares for ``holder``, fewer when the ledger has no more for it;
        first its open shares are renewed if a third of their lease went by."""
        mine = self.held.setdefault(holder, set())
        if now - self.renewed.get(holder, -math.inf) >= self.world.settings.lease_s / 3:
            self.ledger.renew(list(mine), holder, now)  # well before any lapses
            self.renewed[holder] = now
        shares = []
        for _ in range(count):
            try:
                share = self.ledger.issue(holder, now, open_limit(self.sizes.local_steps))
            except LedgerError:
                break
            if share.share_id in self.unspent:
                self.unspent.discard(share.share_id)
                self.world.counts["reissued_unspent"] += 1
            mine.add(share.share_id)
            shares.append(share)
        return shares

    def give_back(self, holder: str, share_ids: list[int], first_begun: bool) -> None:
        """A broken segment's shares are abandoned (issued again): the first is recomputed if
        it was begun, the others go back unspent."""
        gone = set(self.ledger.abandon(share_ids, holder))
        self.held.get(holder, set()).difference_update(gone)
        self.unspent.update(i for i in share_ids[1 if first_begun else 0 :] if i in gone)

    def abandon(self, holder: str, share_ids: list[int]) -> None:
        """A round's shares trained by a holder that left its cell are issued again."""
        mine = self.held.get(holder, set())
        gone = self.ledger.abandon([i for i in share_ids if i in mine], holder)
        mine.difference_update(gone)

    def complete(self, holder: str, share_ids: tuple[int, ...]) -> None:
        """A round is through at every shard of stage 0: its shares are done."""
        done = self.ledger.complete(list(share_ids))
        self.held.get(holder, set()).difference_update(done)

    def forget(self, holder: str) -> None:
        """``holder``'s leases lapsed: the ledger issues its shares again."""
        self.ledger.drop_holder(holder)
        self.held.pop(holder, None)
        self.renewed.pop(holder, None)

    def restarted(self) -> None:
        """Shard (0, 0) failed over: the ledger is rebuilt from its checkpoint's metadata, and
        every share open before is to be issued again."""
        self.ledger = ShareLedger.from_metadata(
            self.ledger.to_metadata(), self.sizes.share_micro_batches, self.world.settings.lease_s
        )
        self.held.clear()
