"""The coordinator's check that the members it planned took up their work.

A planned member that keeps heartbeating but never takes its cell or its shard holds its whole
pipeline (or, as a shard's server, its whole stage) still: its cell is not open to spares, since
its heartbeat says it lives, and nothing replanned it. A run once sat near 0 updates a minute
for three minutes behind one such member. So the coordinator, every round, looks for the leases
of the members its plan names: a member named for a cell or a shard for ``grace_s`` (one cell
lease, ``swarmd.training.lifecycle.LEASE_TTL_S``: a working daemon claims within a round or two)
that holds no live lease on any of its tasks is **silent**. Silent members are left out of the
coordinator's next plans (its repair hands their cells and shards to others) for a penalty that
doubles with each offence, up to ``MAX_PENALTY_S``; then they may be planned again, and watched
again. A peer that holds its lease once is believed for ``grace_s`` before it is looked at
again. Scans are bounded: at most ``MAX_CHECKS`` members a round, the longest unconfirmed first.

What this does not catch: a member that claims its leases and then does nothing with them.
Contributions are what would tell (the shard servers see who contributes); see the threat model.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection
from typing import Any

from swarmd.peers.records.plan_record import PlanRecord
from swarmd.training.lifecycle import LEASE_TTL_S

logger = logging.getLogger(__name__)

MAX_CHECKS = 16
"""Members whose leases one round looks up, at most."""
PENALTY_LEASES = 10
"""A first offence keeps a silent member out of plans for this many grace periods."""
MAX_PENALTY_S = 3600.0
MAX_REMEMBERED = 4096


def named_tasks(plan: PlanRecord) -> dict[str, list[tuple[str, int, int]]]:
    """Each device's tasks in ``plan``: ``("cell", pipeline, stage)`` and ``("shard", stage, k)``."""
    tasks: dict[str, list[tuple[str, int, int]]] = {}
    for p, row in enumerate(plan.pipelines):
        for s, device in enumerate(row):
            tasks.setdefault(plan.devices[device], []).append(("cell", p, s))
    servers = plan.shard_servers or [[s] for s in plan.parameter_servers]
    for stage, row in enumerate(servers):
        for k, device in enumerate(row):
            tasks.setdefault(plan.devices[device], []).append(("shard", stage, k))
    return tasks


class SilentWatch:
    """Which planned members took up no work (module doc), as this coordinator found."""

    def __init__(self, own: str, grace_s: float = LEASE_TTL_S) -> None:
        self.own, self.grace_s = own, grace_s
        self._named_since: dict[str, float] = {}  # member -> when this coordinator first saw it named
        self._confirmed: dict[str, float] = {}  # member -> when a lease of its own was last found
        self._silent: dict[str, float] = {}  # member -> until when it stays out of plans
        self._offences: dict[str, int] = {}
        self.found_total = 0

    def excluded(self, now: float) -> frozenset[str]:
        """Members to leave out of the next plan."""
        self._silent = {p: until for p, until in self._silent.items() if until > now}
        return frozenset(self._silent)

    async def check(self, dht: Any, plan: PlanRecord | None, live: Collection[str], now: float) -> list[str]:
        """One round's look at the leases of ``plan``'s named members (the coordinator's own
        plan); the members found silent now."""
        if plan is None:
            return []
        tasks = {p: t for p, t in named_tasks(plan).items() if p != self.own and p in live}
        self._named_since = {p: self._named_since.get(p, now) for p in tasks}
        due = [
            p
            for p in tasks
            if now - self._named_since[p] >= self.grace_s
            and now - self._confirmed.get(p, -float("inf")) >= self.grace_s
            and p not in self._silent
        ]
        due.sort(key=lambda p: self._confirmed.get(p, -float("inf")))
        due = due[:MAX_CHECKS]
        held = await asyncio.gather(*(self._holds_any(dht, p, tasks[p], now) for p in due))
        found = []
        for peer, holds in zip(due, held, strict=True):
            if holds:
                self._confirmed[peer] = now
                continue
            offences = self._offences.get(peer, 0) + 1
            self._offences[peer] = offences
            penalty = min(MAX_PENALTY_S, PENALTY_LEASES * self.grace_s * 2 ** (offences - 1))
            self._silent[peer] = now + penalty
            self.found_total += 1
            found.append(peer)
            logger.warning(
                "Planned member %s took up none of its %d task(s) within %.0f s; planned out for %.0f s",
                peer,
                len(tasks[peer]),
                self.grace_s,
                penalty,
            )
        self._bound()
        return found

    async def _holds_any(self, dht: Any, peer: str, tasks: list[tuple[str, int, int]], now: float) -> bool:
        """Whether ``peer`` holds a live lease on one of its ``tasks`` (its first cell, then its
        first shard: one lease of its own shows a daemon at work)."""
        cell = next((t for t in tasks if t[0] == "cell"), None)
        if cell is not None:
            leases = await dht.scan_cell(cell[1], cell[2], now)
            if any(lease.peer_id == peer and lease.is_live(now) for lease in leases):
                return True
        shard = next((t for t in tasks if t[0] == "shard"), None)
        if shard is not None:
            scanned = await dht.scan_shards(shard[1], now)
            if any(lease.peer_id == peer and lease.is_live(now) for lease, _ in scanned):
                return True
        return False

    def _bound(self) -> None:
        for table in (self._confirmed, self._offences):
            while len(table) > MAX_REMEMBERED:
                table.pop(next(iter(table)))

    def status(self, now: float) -> dict[str, Any]:
        return {"silent": sorted(self.excluded(now)), "found": self.found_total}
