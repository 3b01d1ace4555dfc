"""daemon/node/services.py: a failed round is retried with capped backoff, and a stop request
ends every service at once, mid-sleep."""

from __future__ import annotations

import asyncio

import pytest

from swarmd.node.services import Services

pytestmark = pytest.mark.timeout(30)


def test_a_failed_round_is_retried_and_stop_ends_the_service() -> None:
    async def scenario() -> tuple[int, int]:
        services, rounds, recovered = Services(), [0], asyncio.Event()

        async def body() -> None:
            rounds[0] += 1
            if rounds[0] == 1:
                raise RuntimeError("DHT hiccup")
            recovered.set()

        services.spawn("test", lambda: 0.01, body)
        await asyncio.wait_for(recovered.wait(), 10)
        services.stop(exit_code=3)
        services.stop(exit_code=5)  # the first request decides the exit code
        await asyncio.wait_for(services.cancel(), 10)
        return rounds[0], services.exit_code

    rounds, code = asyncio.run(scenario())
    assert rounds >= 2 and code == 3


def test_sleep_wakes_at_once_when_asked_to_stop() -> None:
    async def scenario() -> tuple[bool, bool]:
        services = Services()
        short = await services.sleep_or_stop(0.0)
        sleeper = asyncio.create_task(services.sleep_or_stop(60.0))
        await asyncio.sleep(0)
        services.stop()
        return short, await asyncio.wait_for(sleeper, 10)

    assert asyncio.run(scenario()) == (False, True)


def test_a_service_that_waits_for_its_first_round_stops_before_it() -> None:
    async def scenario() -> int:
        services, rounds = Services(), [0]

        async def body() -> None:
            rounds[0] += 1

        services.spawn("late", lambda: 60.0, body, run_first=False)
        await asyncio.sleep(0)
        services.stop()
        await asyncio.wait_for(services.cancel(), 10)
        return rounds[0]

    assert asyncio.run(scenario()) == 0
