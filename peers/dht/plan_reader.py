"""Plans read back from their manifests and parts, with bounded fetching and a cache by digest.

A plan of many members is a signed manifest and parts stored under their SHA-256
(``swarmd.peers.records.plan_parts``). Each scan reads the manifests (one per publisher, each
checked by the DHT's validator and again by the caller); this module fetches the parts they
name and joins each plan. What it costs stays bounded whatever strangers publish:

- a part already fetched is never fetched again while it is cached (``MAX_CACHED_PARTS``, the
  least recently used dropped first): a plan re-published with a fresh expiry costs nothing,
  and one where a member joined costs its changed device part and the role parts;
- one scan fetches at most ``MAX_FETCHES_PER_SCAN`` parts, for the plans of live members first
  (newest version first), then the others; a plan whose parts do not fit waits for a later scan;
- a part that could not be found, or failed its digest, is not asked for again for
  ``MISSING_RETRY_S``, and neither is any plan that needs it.

Pure asyncio over a ``fetch(key)`` callable: the DHT's ``get`` in ``SwarmDHT``, a dict in tests.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Collection, Mapping

from swarmd.errors import RecordError
from swarmd.peers.dht.keys import plan_part_key
from swarmd.peers.records.plan_parts import PlanManifest, open_part
from swarmd.peers.records.plan_record import PlanRecord

logger = logging.getLogger(__name__)

MAX_FETCHES_PER_SCAN = 256
"""Parts fetched in one scan at most (4 MiB): four plans of 10,000 members from scratch."""
MAX_CACHED_PARTS = 512
"""Parts kept by digest (8 MiB at most)."""
MISSING_RETRY_S = 30.0
"""A part not found (or not matching its digest) is asked for again after this long."""
MAX_MISSING = 4096
FETCH_CONCURRENCY = 16
"""Parts fetched at once: a plan of 10,000 members (about 60 parts) arrives in a few round trips."""


class PlanReader:
    """The plans of one run's manifests, their parts fetched and cached (module doc)."""

    def __init__(
        self,
        run_id: str,
        fetch: Callable[[str], Awaitable[bytes | None]],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.run_id, self._fetch, self._clock = run_id, fetch, clock
        self._parts: OrderedDict[str, bytes] = OrderedDict()
        self._missing: dict[str, float] = {}
        """digest -> when it may be asked for again."""
        self.fetched = 0
        """Parts fetched so far (for tests and the benchmark)."""

    def remember(self, parts: Mapping[str, bytes]) -> None:
        """Cache parts known to be good (this peer's own plan: it need not fetch it back)."""
        for digest, value in parts.items():
            self._keep(digest, value)

    async def assemble(self, manifests: list[PlanManifest], live: Collection[str]) -> list[PlanRecord]:
        """The plans of verified ``manifests`` whose parts could be had within this scan's
        budget, each joined and checked (``PlanRecord.from_parts``); ``live``: the members,
        whose plans are fetched first."""
        now = self._clock()
        self._missing = {d: t for d, t in self._missing.items() if t > now}
        budget = MAX_FETCHES_PER_SCAN
        plans, waiting = [], 0
        for manifest in sorted(manifests, key=lambda m: (m.peer_id not in live, -m.version, m.peer_id)):
            digests = manifest.digests()
            needed = [d for d in digests if d not in self._parts]
            if any(d in self._missing for d in needed) or len(needed) > budget:
                waiting += 1
                continue
            budget -= len(needed)
            for d in digests:  # what this plan already has must outlast what it fetches now
                if d in self._parts:
                    self._parts.move_to_end(d)
            await self._fetch_all(needed, now)
            if any(d not in self._parts for d in digests):
                continue
            parts = {d: self._parts[d] for d in digests}
            try:
                plans.append(await asyncio.to_thread(PlanRecord.from_parts, manifest, parts))
            except RecordError as e:
                logger.debug("Dropped a plan: %s", e)
        if waiting:
            logger.debug("%d plans wait for their parts (missing, or past this scan's budget)", waiting)
        return plans

    async def _fetch_all(self, digests: list[str], now: float) -> None:
        gate = asyncio.Semaphore(FETCH_CONCURRENCY)

        async def one(digest: str) -> None:
            async with gate:
                value = await self._fetch(plan_part_key(self.run_id, digest))
            self.fetched += 1
            try:
                if value is None:
                    raise RecordError("not found")
                run_id, _ = open_part(value, digest)
                if run_id != self.run_id:
                    raise RecordError(f"it is for run {run_id}")
            except RecordError as e:
                logger.debug("Plan part %s… not had: %s", digest[:16], e)
                if len(self._missing) < MAX_MISSING:
                    self._missing[digest] = now + MISSING_RETRY_S
                return
            self._keep(digest, value)

        await asyncio.gather(*(one(d) for d in digests))

    def _keep(self, digest: str, value: bytes) -> None:
        self._parts[digest] = value
        self._parts.move_to_end(digest)
        while len(self._parts) > MAX_CACHED_PARTS:
            self._parts.popitem(last=False)
