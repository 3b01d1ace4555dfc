"""daemon/node/lan_service.py: LAN discovery's child is restarted as soon as it dies, with a
backoff that grows while it keeps failing and resets once a child has run a while."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from swarmd.errors import SwarmdError
from swarmd.node import lan_service
from swarmd.node.lan_service import LAN_RESTART_DELAYS_S, LanService

pytestmark = pytest.mark.timeout(30)


class FakeChild:
    """A started child that exits when the test says so."""

    def __init__(self) -> None:
        self.exited = asyncio.Event()
        self.stopped = False

    async def ended(self) -> None:
        await self.exited.wait()

    async def stop(self) -> None:
        self.stopped = True


class Scripted(LanService):
    """``start`` as scripted: each entry a child that starts, or an error to raise."""

    def __init__(self, script: list[FakeChild | SwarmdError]) -> None:
        super().__init__(Path("/nonexistent"), "run", "/ip4/127.0.0.1/tcp/0", dht=None)  # type: ignore[arg-type]
        self.script, self.starts = script, 0

    async def start(self, hello: Any) -> None:
        self.starts += 1
        step = self.script.pop(0)
        if isinstance(step, SwarmdError):
            raise step
        self._process = step  # type: ignore[assignment]


def test_a_dead_child_is_restarted_at_once_and_failures_back_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lan_service.random, "uniform", lambda a, b: 1.0)
    first, ceiling = LAN_RESTART_DELAYS_S

    async def scenario() -> None:
        running, restarted = FakeChild(), FakeChild()
        service = Scripted([SwarmdError("no interface"), SwarmdError("no interface"), restarted])
        service._process = running  # type: ignore[assignment]
        waits: list[float] = []

        async def sleep_or_stop(delay: float) -> bool:
            waits.append(delay)
            return service.starts == 3  # stop once the third start ran

        keeper = asyncio.create_task(service.keep(lambda: b"", sleep_or_stop))
        await asyncio.sleep(0.05)
        assert waits == [] and service.starts == 0  # a live child is left alone
        running.exited.set()
        await asyncio.sleep(0.05)
        assert running.stopped and service.starts == 3
        restarted.exited.set()
        await asyncio.wait_for(keeper, 5)
        # The first restart comes after the shortest wait, each failure in a row doubles it.
        assert waits == [first, 2 * first, 4 * first, 8 * first]
        assert max(waits) <= ceiling

    asyncio.run(scenario())


def test_the_wait_never_passes_its_ceiling(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lan_service.random, "uniform", lambda a, b: 1.0)
    first, ceiling = LAN_RESTART_DELAYS_S

    async def scenario() -> list[float]:
        service = Scripted([SwarmdError("no interface")] * 20)
        waits: list[float] = []

        async def sleep_or_stop(delay: float) -> bool:
            waits.append(delay)
            return len(waits) == 12

        await asyncio.wait_for(service.keep(lambda: b"", sleep_or_stop), 5)
        return waits

    waits = asyncio.run(scenario())
    assert waits[0] == first and waits[-1] == ceiling and sorted(waits) == waits
