"""Joining a run: starting the DHT on the initial peers, and finding the run's spec.

Either may have to wait for other daemons (an initial peer restarting, the creator not up
yet), so each is retried with capped backoff until ``[swarm] join_timeout_s``; a join that
still fails says why (no initial peers, none reached, or none serving this run).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from swarmd.config import SwarmConfig
from swarmd.errors import BootstrapError, JoinError
from swarmd.node.services import DHT_CALL_TIMEOUT_S, dht_call
from swarmd.peers.records.run_spec import SignedRunSpec
from swarmd.system import systemd
from swarmd.system.state_dir import load_cached_spec, save_spec, spec_cache_path

if TYPE_CHECKING:  # hivemind: a test that imports this module must not load it (py-libp2p clash)
    from swarmd.peers.dht.swarm_dht import SwarmDHT

logger = logging.getLogger(__name__)

T = TypeVar("T")

MAX_RETRY_DELAY_S = 30.0

Sleep = Callable[[float], Awaitable[bool]]
"""Sleep so many seconds (True when the node was asked to stop meanwhile)."""


async def retry(attempt: Callable[[], Awaitable[T | str]], timeout: float, sleep: Sleep) -> T | str:
    """Call ``attempt`` until it returns a result, backing off while it returns a reason.

    Returns the last reason once ``timeout`` has passed. While joining, systemd is asked to
    extend the start timeout, so a long join is not mistaken for a hung start.
    """
    deadline, delay = time.monotonic() + timeout, 0.5
    while True:
        outcome = await attempt()
        if not isinstance(outcome, str) or time.monotonic() + delay > deadline:
            return outcome
        logger.info("%s; retrying in %.0f s", outcome, delay)
        systemd.sd_notify(f"EXTEND_TIMEOUT_USEC={int((delay + DHT_CALL_TIMEOUT_S) * 1e6)}")
        await sleep(delay)
        delay = min(delay * 2, MAX_RETRY_DELAY_S)


class Joining:
    """This node's way into one run's swarm, and its share in keeping the run's spec served."""

    def __init__(self, dht: SwarmDHT, state_dir: Path, run_id: str, swarm: SwarmConfig, sleep: Sleep) -> None:
        self.dht, self.state_dir, self.run_id, self.swarm, self.sleep = dht, state_dir, run_id, swarm, sleep

    async def start_dht(self) -> None:
        """Start the DHT; while no initial peer answers (it may be restarting), retry until the join timeout."""
        dht = self.dht

        async def attempt() -> bool | str:
            try:
                await asyncio.to_thread(dht.start)
            except BootstrapError as e:
                return str(e)
            return True

        outcome = await retry(attempt, self.swarm.join_timeout_s, self.sleep)
        if isinstance(outcome, str):
            timeout = self.swarm.join_timeout_s
            raise JoinError(f"cannot join run {self.run_id} within {timeout:.0f} s: {outcome}")

    async def find_spec(self) -> SignedRunSpec:
        """Find the run's spec: from the local cache (the creator's, or an earlier join), else the DHT."""
        dht = self.dht
        cached = load_cached_spec(self.state_dir, self.run_id)
        if cached is not None:
            logger.info("Serving the spec of run %s from %s", self.run_id, spec_cache_path(self.state_dir, self.run_id))
            await self.publish_spec(cached)
            return cached

        async def attempt() -> SignedRunSpec | str:
            return await dht_call(dht.fetch_spec()) or f"no peer has served the spec of run {self.run_id} yet"

        outcome = await retry(attempt, self.swarm.join_timeout_s, self.sleep)
        if not isinstance(outcome, str):
            save_spec(self.state_dir, outcome)
            logger.info(
                "Joined run %s (model %s, created by %s)", self.run_id, outcome.spec.model.family, outcome.creator
            )
            return outcome
        known = await dht_call(dht.known_peers())
        swarm = self.swarm
        if not swarm.initial_peers and not swarm.mdns:
            hint = "no --initial-peers were given and mDNS is off; pass the address of a peer in the run"
        elif known == 0:
            given = ", ".join(swarm.initial_peers) or "none given"
            hint = f"no peer was reached (initial peers: {given}); check the addresses and that those daemons run"
        else:
            hint = f"{known} peer(s) answered but none serves this run; check the run ID"
        raise JoinError(f"run {self.run_id} is not served by any peer after {swarm.join_timeout_s:.0f} s: {hint}")

    async def publish_spec(self, spec: SignedRunSpec) -> None:
        """Every member keeps the run's spec alive in the DHT: the run outlives its creator."""
        if not await dht_call(self.dht.publish_spec(spec.raw)):
            logger.debug("Spec of run %s is stored only locally for now (no other DHT node yet)", self.run_id)
