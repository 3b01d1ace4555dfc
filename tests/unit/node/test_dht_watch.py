"""DhtWatch (daemon/node/dht_watch.py): a dead DHT process is restarted off the loop, the node
re-attached, and only a process that keeps dying stops the daemon; a child gone halfway through
taking a shared buffer is logged in one line, not printed as a traceback."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import sys
import threading
import time
from multiprocessing import resource_sharer

import pytest

from swarmd.errors import JoinError
from swarmd.node.dht_watch import MAX_RESTARTS, RESTART_WINDOW_S, DhtWatch, quiet_handoff_failures

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


def test_a_child_gone_halfway_through_a_handoff_is_one_line_not_a_traceback(
    caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    """The real resource sharer's thread, and a "child" that connects to it and is gone before it
    answers the challenge (what a DHT process killed mid-call does)."""
    previous = sys.excepthook
    read_end, write_end = os.pipe()
    try:
        quiet_handoff_failures()
        quiet_handoff_failures()  # once a process: not two hooks in a chain
        assert getattr(sys.excepthook, "quiets_handoffs", False) and sys.excepthook is not previous
        shared = resource_sharer.DupFd(read_end)  # starts the sharer's thread, as a pickled shared tensor does
        address, _ = shared._id  # type: ignore[attr-defined]  # where a child takes it from
        with caplog.at_level(logging.WARNING, logger="swarmd.node.dht_watch"):
            child = socket.socket(socket.AF_UNIX)
            child.connect(address)
            deadline = time.monotonic() + 10
            while not child.recv(1, socket.MSG_PEEK) and time.monotonic() < deadline:  # the challenge came
                pass
            child.close()  # unread: the sharer's read fails (reset, or the end of the stream)
            deadline = time.monotonic() + 10
            while "went away" not in caplog.text and time.monotonic() < deadline:
                time.sleep(0.02)  # sync-ok: polling the sharer's thread, bounded
        assert "A child process went away while taking a shared buffer" in caplog.text
        assert "Traceback" not in capsys.readouterr().err
    finally:
        sys.excepthook = previous
        resource_sharer.stop()
        os.close(read_end)
        os.close(write_end)
