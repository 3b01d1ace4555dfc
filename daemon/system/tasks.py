"""Ending asyncio tasks for sure: the daemon's shutdown must not wait on a task that missed its cancel."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

logger = logging.getLogger(__name__)


async def cancel_all(tasks: list[asyncio.Task[Any]], timeout_s: float, owner: str) -> None:
    """Cancel ``tasks`` and wait for them to end, cancelling again those still running: a cancel
    that reaches an ``asyncio.wait_for`` just as its inner call completes is swallowed (gh-86296),
    and the task runs on into its next wait (a share's window place that never comes back hung a
    restart test's shutdown). After ``timeout_s`` the stragglers are named in the log and left."""
    pending = {t for t in tasks if not t.done()}
    deadline = time.monotonic() + timeout_s
    while pending and time.monotonic() < deadline:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=min(0.5, max(0.01, deadline - time.monotonic())))
    if pending:
        logger.warning("%s: %s did not end when cancelled", owner, ", ".join(sorted(t.get_name() for t in pending)))
