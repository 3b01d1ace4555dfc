"""daemon/system/tasks.py: tasks end on cancel even when one cancel is swallowed."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import pytest

from swarmd.system.tasks import cancel_all

pytestmark = pytest.mark.timeout(10)


async def swallows_one_cancel(started: asyncio.Event) -> None:
    """As a task in a wait_for whose inner call completed with the cancel (gh-86296): the first
    cancel is lost, and the task goes on into a wait nothing will end."""
    started.set()
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.sleep(60)  # sync-ok: the wait the first cancel interrupts
    await asyncio.Event().wait()


def test_a_task_that_swallowed_its_cancel_is_cancelled_again() -> None:
    async def main() -> bool:
        started = asyncio.Event()
        task = asyncio.create_task(swallows_one_cancel(started))
        await started.wait()
        await cancel_all([task], 5.0, "test")
        return task.cancelled()

    assert asyncio.run(main())


def test_a_task_that_will_not_end_is_named_and_left_after_the_timeout(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> bool:
        released = asyncio.Event()

        async def stubborn() -> None:  # ignores every cancel until the test lets it go
            while not released.is_set():
                with contextlib.suppress(asyncio.CancelledError):
                    await released.wait()

        task = asyncio.create_task(stubborn(), name="stubborn")
        await asyncio.sleep(0)  # sync-ok: let the task start
        await cancel_all([task], 0.3, "owner")
        left = not task.done()
        released.set()
        await task
        return left

    with caplog.at_level(logging.WARNING):
        assert asyncio.run(main())
    assert "owner: stubborn did not end when cancelled" in caplog.text
