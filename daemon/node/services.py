"""How the node's services run: periodic rounds on one loop, one stop that ends them all.

A round that fails (a DHT hiccup) is retried with capped backoff rather than ending its
service: only the watchdog decides that the daemon must stop. Every sleep wakes at once when
the node is asked to stop, so that shutdown never waits out a round's interval.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from swarmd.system.tasks import cancel_all

logger = logging.getLogger(__name__)

T = TypeVar("T")

DHT_CALL_TIMEOUT_S = 10.0
MAX_ROUND_DELAY_S = 60.0
SERVICES_CANCEL_S = 10.0
"""How long the services may take to end once cancelled (the daemon's shutdown waits no longer)."""


async def dht_call(call: Awaitable[T]) -> T:
    """A DHT request with a deadline: a dead or wedged DHT process must not wedge the loop."""
    return await asyncio.wait_for(call, DHT_CALL_TIMEOUT_S)


class Services:
    """The node's periodic tasks, and the stop request that ends them."""

    def __init__(self) -> None:
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self.exit_code = 0
        """What the process exits with: set by the first stop request."""

    def stop(self, exit_code: int = 0) -> None:
        if not self._stop.is_set():
            logger.info("Stopping (announcing leave, then stopping every component)")
            self.exit_code = exit_code
            self._stop.set()

    async def stopped(self) -> None:
        """Return once a stop was requested."""
        await self._stop.wait()

    def spawn(
        self, name: str, interval: Callable[[], float], body: Callable[[], Awaitable[None]], run_first: bool = True
    ) -> None:
        """Run ``body`` every ``interval()`` seconds (re-read each round, so config can pace it)."""
        self._tasks.append(asyncio.create_task(self._periodic(name, interval, body, run_first), name=name))

    def spawn_once(self, name: str, body: Callable[[], Awaitable[None]]) -> None:
        """Run ``body`` until it succeeds once; a failed try is retried with capped backoff."""

        async def until_done() -> None:
            failures = 0
            while True:
                try:
                    await body()
                    return
                except Exception as e:
                    failures += 1
                    delay = min(2.0**failures, MAX_ROUND_DELAY_S)
                    logger.warning("%s failed (%s: %s); retrying in %.0f s", name, type(e).__name__, e, delay)
                if await self.sleep_or_stop(delay):
                    return

        self._tasks.append(asyncio.create_task(until_done(), name=name))

    async def _periodic(
        self, name: str, interval: Callable[[], float], body: Callable[[], Awaitable[None]], run_first: bool
    ) -> None:
        """Run ``body`` every ``interval()`` seconds; a failed round is retried with capped backoff."""
        failures = 0
        if not run_first and await self.sleep_or_stop(interval()):
            return
        while True:
            try:
                await body()
                failures, delay = 0, interval()
            except Exception as e:
                failures += 1
                delay = min(interval() * 2**failures, MAX_ROUND_DELAY_S)
                logger.warning("%s failed (%s: %s); retrying in %.0f s", name, type(e).__name__, e, delay)
            if await self.sleep_or_stop(delay):
                return

    async def sleep_or_stop(self, seconds: float) -> bool:
        """Sleep ``seconds``; True when the node was asked to stop meanwhile."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop.wait(), seconds)
        return self._stop.is_set()

    async def cancel(self) -> None:
        """End every service now, mid-round if need be, and wait until all have."""
        await cancel_all(list(self._tasks), SERVICES_CANCEL_S, "services")
