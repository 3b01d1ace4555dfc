"""The CPU share of ``[limits] cpu_share``: compute runs at most that fraction of the time.

A duty cycle for the whole process, kept as a token bucket of busy seconds: every second of
wall time earns ``share`` seconds, every second during which any compute runs (on one cell's
worker thread or several at once: ``swarmd.training.cells.cell``) spends one, and a job starts only
when the balance is not negative. So over any stretch of time compute runs at most ``share``
of it, plus ``BURST_S``: busy 0.2 s at a share of 0.5 owes 0.2 s idle. Time the compute is idle
anyway (a cell waiting for a neighbour's tensor) pays the debt, so a peer whose compute already
waits on the network half the time is not slowed further by a share of 0.5; the bucket holds
at most ``BURST_S`` so that a long idle does not buy a long burst.

The wait happens in the worker thread, before its job, never on the event loop. The share is
one for the process (``COMPUTE_LIMITS``), set at start and on a reload; a change wakes the
waiting threads, which then wait by the new share.

torch's thread count is set here too, in each worker thread before its next job: torch keeps it
per thread (a thread reads the process's count once, at its first parallel op), so a count set
from the event loop's thread would never reach a cell that already runs.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from swarmd.errors import ConfigError

T = TypeVar("T")

BURST_S = 0.5
"""The most compute that may run beyond the share after a long idle, in seconds."""
MIN_WAIT_S = 1e-3
"""Debts smaller than this are forgiven: a clock's rounding must not keep a thread waiting."""


class ComputeLimits:
    """The fraction of the time compute may run (the module doc's bucket), and torch's threads,
    for every worker thread of this process. Thread-safe."""

    def __init__(
        self,
        share: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        wait: Callable[[threading.Condition, float], object] | None = None,
    ) -> None:
        self._changed = threading.Condition()
        self._clock = clock
        self._wait = wait if wait is not None else threading.Condition.wait
        self._share = 1.0
        self.balance = BURST_S
        self._at = clock()
        self._running = 0
        self.threads = 0
        """torch threads each worker thread computes with (0: as it found them)."""
        self.throttled_s = 0.0
        """Seconds the worker threads waited for the share, all of them together."""
        self.set(share)

    @property
    def share(self) -> float:
        return self._share

    def set(self, share: float) -> None:
        """A new share, in effect at once (the waiting threads re-check)."""
        if not 0 < share <= 1:
            raise ConfigError(f"cpu share {share} must be in (0, 1] (0.5: compute half the time)")
        with self._changed:
            self._advance(self._clock())
            self._share = share
            self._changed.notify_all()

    def wake(self) -> None:
        """Wake the waiting threads now (they re-check what they owe)."""
        with self._changed:
            self._changed.notify_all()

    def _advance(self, now: float) -> None:
        """Bring the balance to ``now`` (the lock held)."""
        elapsed = max(0.0, now - self._at)
        self._at = now
        if self._share >= 1:
            self.balance = BURST_S  # no cap: nothing owed, and a later cap starts afresh
            return
        spent = elapsed if self._running else 0.0
        self.balance = min(BURST_S, self.balance + self._share * elapsed - spent)

    def owed_s(self) -> float:
        """How long compute must stay idle from now before a job may start."""
        with self._changed:
            return self._owed(self._clock())

    def _owed(self, now: float) -> float:
        self._advance(now)
        owed = -self.balance / self._share
        return owed if owed >= MIN_WAIT_S else 0.0

    def begin(self, stopped: Callable[[], bool] = lambda: False) -> float:
        """Wait until a job may start (or ``stopped()``), then count it as running; returns the
        seconds waited. Every ``begin`` is followed by one ``end``."""
        with self._changed:
            started = self._clock()
            owed = self._owed(started)
            while owed > 0 and not stopped():
                self._wait(self._changed, owed)
                owed = self._owed(self._clock())
            now = self._clock()
            self._running += 1
            self.throttled_s += now - started
            return now - started

    def end(self) -> None:
        with self._changed:
            self._advance(self._clock())
            self._running -= 1
            self._changed.notify_all()


COMPUTE_LIMITS = ComputeLimits()
"""The daemon's one share (``swarmd.node.limits.live`` sets it from ``[limits]``)."""


class DutyCycle:
    """One worker thread's side of ``ComputeLimits``: its jobs wait for the share and take the
    thread count; a stopped cell's jobs (the flush at stop) no longer wait."""

    def __init__(
        self, limits: ComputeLimits = COMPUTE_LIMITS, set_threads: Callable[[int], None] | None = None
    ) -> None:
        self.limits = limits
        self._set_threads = set_threads if set_threads is not None else _torch_threads
        self._threads = 0
        self._stopped = False

    def run(self, fn: Callable[..., T], *args: Any) -> tuple[T, float]:
        """Wait out what the share owes, take the thread count, then ``fn(*args)``; returns its
        result and the seconds waited."""
        waited = self.limits.begin(lambda: self._stopped)
        try:
            if self.limits.threads != self._threads:
                self._threads = self.limits.threads
                if self._threads:
                    self._set_threads(self._threads)
            return fn(*args), waited
        finally:
            self.limits.end()

    def stop(self) -> None:
        self._stopped = True
        self.limits.wake()  # a thread waiting now goes on


def _torch_threads(count: int) -> None:
    import torch

    torch.set_num_threads(count)
