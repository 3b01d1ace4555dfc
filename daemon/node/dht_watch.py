"""The DHT process's supervisor: a dead DHT is restarted, not a reason for the daemon to hang or quit.

The DHT runs in a process of its own (``swarmd.peers.dht.process``); it can die (killed, out
of memory, a hivemind bug). The watchdog round asks ``check`` each time; on a death it
restarts the process in a worker thread, so the loop goes on answering status, feeding the
service manager's watchdog and handling signals meanwhile, then lets the node re-attach what
rode on the old process (the data path's p2pd replica) and publish again what only lived
there (its heartbeat, the run's spec); a call waiting on it fails at once. Deaths past
``MAX_RESTARTS`` within ``RESTART_WINDOW_S`` stop the daemon with exit code 1: something is
wrong that a restart does not mend, and the service manager (or the operator) must look.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from swarmd.errors import SwarmdError

if TYPE_CHECKING:  # hivemind: a test that imports this module must not load it (py-libp2p clash)
    from swarmd.peers.dht.swarm_dht import SwarmDHT

logger = logging.getLogger(__name__)

MAX_RESTARTS = 5
RESTART_WINDOW_S = 600.0


class DhtWatch:
    """Notices that the DHT process died and restarts it (module doc)."""

    def __init__(
        self,
        dht: SwarmDHT,
        after_restart: Callable[[], Awaitable[None]],
        give_up: Callable[[int], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``after_restart``: re-attach and re-publish on the new process; ``give_up(1)``: stop the daemon."""
        self.dht, self.after_restart, self.give_up, self.clock = dht, after_restart, give_up, clock
        self._deaths: collections.deque[float] = collections.deque()
        self._restarting: asyncio.Task[None] | None = None

    @property
    def restarting(self) -> bool:
        return self._restarting is not None and not self._restarting.done()

    def check(self) -> None:
        """Called each watchdog round: start a restart if the DHT process is dead (never waits for it)."""
        if self.restarting or self.dht.is_alive():
            return
        now = self.clock()
        while self._deaths and now - self._deaths[0] > RESTART_WINDOW_S:
            self._deaths.popleft()
        if len(self._deaths) >= MAX_RESTARTS:
            logger.error(
                "The DHT process died %d times within %.0f s (limit %d); stopping so that the service "
                "manager restarts swarmd: see the log above for why it dies",
                len(self._deaths) + 1,
                RESTART_WINDOW_S,
                MAX_RESTARTS,
            )
            self.give_up(1)
            return
        self._deaths.append(now)
        logger.error("The DHT process (pid %s) died; restarting it with the same identity and peers", self.dht.pid)
        self._restarting = asyncio.create_task(self._restart(), name="DHT restart")

    async def _restart(self) -> None:
        try:
            await asyncio.to_thread(self.dht.restart)
        except SwarmdError as e:
            logger.error("%s; trying again at the next watchdog round", e)
            return
        logger.info("The DHT process is back (pid %s, restart %d)", self.dht.pid, self.dht.restarts)
        try:
            await self.after_restart()
        except Exception as e:  # the periodic rounds publish again anyway; only sooner is lost
            logger.warning(
                "Re-publishing after the DHT restart failed (%s: %s); the periodic rounds will", type(e).__name__, e
            )

    async def stop(self) -> None:
        """Cancel a restart in progress (shutdown): its thread finishes, its result is dropped."""
        if self._restarting is not None:
            self._restarting.cancel()
            await asyncio.gather(self._restarting, return_exceptions=True)
