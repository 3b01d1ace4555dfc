"""DhtWatch (daemon/node/dht_watch.py): a dead DHT process is restarted off the loop, the node
re-attached, and only a process that keeps dying stops the daemon."""

from __future__ import annotations

import asyncio
import threading

import pytest

from swarmd.errors import JoinError
from swarmd.node.dht_watch import MAX_RESTARTS, RESTART_WINDOW_S, DhtWatch

pytestmark = pytest.mark.timeout(20)


class FakeDht:
    """A SwarmDHT stand-in: dies when told, and its restart blocks until released."""

    def __init__(self) -> None:
        self.alive, self.pid, self.restarts = True, 100, 0
        self.release = threading.Event()
        self.fail_next = False

    def is_alive(self) -> bool:
        return self.alive

    def restart(self) -> None:
        assert self.release.wait(10), "the test never released the restart"
        if self.fail_next:
            self.fail_next = False
            raise JoinError("the DHT process could not be restarted: p2pd failed")
        self.alive, self.pid, self.restarts = True, self.pid + 1, self.restarts + 1


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def make() -> tuple[FakeDht, DhtWatch, list[str], list[int], Clock]:
    dht, after, stops, clock = FakeDht(), [], [], Clock()

    async def after_restart() -> None:
        after.append(f"pid {dht.pid}")

    return dht, DhtWatch(dht, after_restart, stops.append, clock), after, stops, clock  # type: ignore[arg-type]


async def settle(watch: DhtWatch) -> None:
    while watch.restarting:
        await asyncio.sleep(0.01)


def test_a_live_dht_is_left_alone() -> None:
    async def main() -> None:
        dht, watch, after, stops, _ = make()
        watch.check()
        assert not watch.restarting and after == [] and stops == []

    asyncio.run(main())


def test_a_dead_dht_is_restarted_while_the_loop_keeps_running() -> None:
    async def main() -> None:
        dht, watch, after, stops, _ = make()
        dht.alive = False
        watch.check()
        assert watch.restarting
        # The restart blocks its thread, not the loop: other work (status, the watchdog) goes on.
        ticks = 0
        for _ in range(5):
            await asyncio.sleep(0.01)
            ticks += 1
            watch.check()  # a round during the restart starts no second one
        assert ticks == 5 and watch.restarting
        dht.release.set()
        await settle(watch)
        assert dht.restarts == 1 and after == ["pid 101"] and stops == []

    asyncio.run(main())


def test_a_failed_restart_is_tried_again_next_round() -> None:
    async def main() -> None:
        dht, watch, after, stops, _ = make()
        dht.alive, dht.fail_next = False, True
        dht.release.set()
        watch.check()
        await settle(watch)
        assert not dht.alive and after == []
        watch.check()
        await settle(watch)
        assert dht.alive and after == ["pid 101"] and stops == []

    asyncio.run(main())


def test_a_dht_that_keeps_dying_stops_the_daemon() -> None:
    async def main() -> None:
        dht, watch, after, stops, clock = make()
        dht.release.set()
        for _ in range(MAX_RESTARTS):
            dht.alive = False
            watch.check()
            await settle(watch)
            clock.now += 1
        assert dht.restarts == MAX_RESTARTS and stops == []
        dht.alive = False
        watch.check()
        assert stops == [1] and not watch.restarting
        # Deaths spread wider than the window are each restarted.
        dht2, watch2, _, stops2, clock2 = make()
        dht2.release.set()
        for _ in range(MAX_RESTARTS + 2):
            dht2.alive = False
            watch2.check()
            await settle(watch2)
            clock2.now += RESTART_WINDOW_S / (MAX_RESTARTS - 1)
        assert stops2 == [] and dht2.restarts == MAX_RESTARTS + 2

    asyncio.run(main())
