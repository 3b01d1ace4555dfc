"""daemon/node/joining.py: joining retries with capped, doubling backoff until the join timeout, and
then gives the last reason."""

from __future__ import annotations

import asyncio

import pytest

from swarmd.node import joining
from swarmd.node.joining import retry

pytestmark = pytest.mark.timeout(30)


def test_retry_backs_off_until_a_result() -> None:
    outcomes, slept = ["no peer yet", "still none", "spec"], []

    async def attempt() -> str | int:
        outcome = outcomes.pop(0)
        return 7 if outcome == "spec" else outcome

    async def sleep(seconds: float) -> bool:
        slept.append(seconds)
        return False

    assert asyncio.run(retry(attempt, 60.0, sleep)) == 7
    assert slept == [0.5, 1.0]


def test_retry_gives_the_last_reason_at_the_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    clock, slept = [0.0], []
    monkeypatch.setattr(joining.time, "monotonic", lambda: clock[0])

    async def attempt() -> str:
        return f"no peer at {clock[0]:.1f} s"

    async def sleep(seconds: float) -> bool:
        slept.append(seconds)
        clock[0] += seconds
        return False

    assert asyncio.run(retry(attempt, 20.0, sleep)) == "no peer at 15.5 s"
    assert slept == [0.5, 1.0, 2.0, 4.0, 8.0]  # the next, 16 s, would end past the 20 s deadline
