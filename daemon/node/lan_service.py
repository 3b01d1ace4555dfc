"""LAN discovery in the node: peers of our run found on the LAN are introduced to the DHT.

LAN discovery only introduces peers; the DHT is the source of truth, so its failure is not
fatal: the node goes on without it, and ``keep`` restarts it later. The mDNS host itself runs
in a child process (``swarmd.node.lan_process``); this is the node's side of it.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING

from swarmd.errors import RecordError, SwarmdError
from swarmd.node.lan_process import LanDiscoveryProcess
from swarmd.peers.records.heartbeat import Heartbeat

if TYPE_CHECKING:  # a type only: importing the DHT's module loads hivemind, which its unit test must not
    from swarmd.peers.dht.swarm_dht import SwarmDHT

logger = logging.getLogger(__name__)

# LAN peers introduced to the DHT at once; more hellos than this wait for the next minute.
MAX_LAN_DIALS = 8
LAN_RESTART_DELAYS_S = (1.0, 60.0)
"""The wait before restarting LAN discovery after its child died or failed to start: the
first, doubled with each failure in a row, up to the second (a child that keeps crashing
costs a start a minute at most)."""
LAN_STABLE_S = 60.0
"""A child that ran this long before it died counts as a first failure again."""


class LanService:
    """The LAN-discovery child while it runs, what it answers hellos with, and the dials it led to."""

    def __init__(self, state_dir: Path, run_id: str, listen_maddr: str, dht: SwarmDHT) -> None:
        self.state_dir, self.run_id, self.listen_maddr, self.dht = state_dir, run_id, listen_maddr, dht
        self._process: LanDiscoveryProcess | None = None  # while started
        self._dials: set[asyncio.Task[int]] = set()

    @property
    def listen_maddrs(self) -> list[str]:
        """Where LAN peers reach us; none while discovery is not running."""
        return self._process.listen_maddrs if self._process is not None else []

    def set_hello(self, raw: bytes) -> None:
        """Answer LAN peers' hellos with this signed heartbeat from now on."""
        if self._process is not None:
            self._process.set_hello(raw)

    async def start(self, hello: Callable[[], bytes]) -> None:
        """Start the child; ``hello()`` signs our heartbeat once it knows its LAN addresses."""
        process = LanDiscoveryProcess(self.state_dir, self.run_id, self.listen_maddr, self._on_hello)
        await process.start()
        self._process = process
        # Answer hellos from the start: a LAN peer greets us once a minute at most.
        process.set_hello(hello())
        logger.info("LAN discovery (mDNS) on %s", " ".join(process.listen_maddrs))

    async def keep(self, hello: Callable[[], bytes], sleep_or_stop: Callable[[float], Awaitable[bool]]) -> None:
        """Restart LAN discovery whenever its child dies or failed to start, after a backoff
        (``LAN_RESTART_DELAYS_S``), until ``sleep_or_stop`` says the node is stopping."""
        failures = 0
        while True:
            started = time.monotonic()
            if self._process is not None:
                await self._process.ended()
                await self._process.stop()
                self._process = None
                logger.warning("LAN discovery's child exited; restarting it")
            failures = 1 if time.monotonic() - started >= LAN_STABLE_S else failures + 1
            first, ceiling = LAN_RESTART_DELAYS_S
            delay = min(ceiling, first * 2 ** (failures - 1)) * random.uniform(0.8, 1.2)
            if await sleep_or_stop(delay):
                return
            try:
                await self.start(hello)
            except SwarmdError as e:
                logger.warning("%s; going on without it, retrying", e)

    async def cancel_dials(self) -> None:
        for task in self._dials:
            task.cancel()
        await asyncio.gather(*self._dials, return_exceptions=True)

    async def stop(self) -> None:
        if self._process is not None:
            await self._process.stop()

    def _on_hello(self, peer_id: str, payload: bytes) -> None:
        """A peer found on the LAN sent its heartbeat: if it is of our run, reach it through the DHT."""
        try:
            heartbeat = Heartbeat.parse(payload, run_id=self.run_id, now=time.time(), peer_id=peer_id)
        except RecordError as e:
            logger.debug("Ignoring LAN peer %s: %s", peer_id[:60], e)
            return
        if not heartbeat.addrs or len(self._dials) >= MAX_LAN_DIALS:
            return
        logger.info("Found %s on the LAN; connecting its DHT node", peer_id)
        task = asyncio.create_task(self.dht.add_peers(heartbeat.peer_id, heartbeat.addrs))
        self._dials.add(task)
        task.add_done_callback(self._dial_done)

    def _dial_done(self, task: asyncio.Task[int]) -> None:
        self._dials.discard(task)
        # Best effort (failures are logged inside); retrieve the outcome so none goes unobserved.
        if not task.cancelled() and task.exception() is not None:
            logger.debug("Introducing a LAN peer failed: %r", task.exception())
