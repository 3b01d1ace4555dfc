"""The CPU share of ``[limits] cpu_share``: swarmd uses at most that fraction of what it computes on.

A duty cycle for the whole process, kept as a token bucket of busy seconds: every second of
wall time earns ``share`` seconds, busy time spends them, and a job starts only when the
balance is not negative (or has waited the most it may: below). So over any stretch of time
swarmd is busy at most ``share`` of it, plus ``BURST_S``: busy 0.2 s at a share of 0.5 owes
0.2 s idle. Time the compute is idle anyway (a cell waiting for a neighbour's tensor) pays the
debt, so a peer whose compute already waits on the network half the time is not slowed further
by a share of 0.5; the bucket holds at most ``BURST_S`` so that a long idle does not buy a long
burst.

What counts as busy depends on the device:

- **CPU** (``meter_cpu(cores)``, the compute's torch threads): the CPU time of the daemon and
  every process under it (its DHT process, each p2pd: ``swarmd.system.process_cpu``) over those
  cores. Compute alone would undercount: for a small model the daemon's RPC and p2pd take
  several times the forward and backward's CPU, and a volunteer's "30%" must be what the
  machine sees.
- **GPU** (``meter_cpu(0)``, the default): the time any compute runs (on one cell's worker
  thread or several at once: ``swarmd.training.cells.cell``). What the volunteer lends there
  is the GPU's time, and the CPU beside it is little.

The debt is bounded: at most the last job's length plus ``IDLE_DEBT_S``. A job's own cost is
always paid, but what the daemon spends without training (the DHT, heartbeats, a crowd of
strangers' records to check) cannot hold a job back more than ``IDLE_DEBT_S / share`` seconds
beyond what the last job's own cost owes, nor so long that the jobs get less than
``TRAINING_FLOOR`` of the share. Else a daemon whose idle costs exceed its share would stop
training, and anyone who can make a peer busy (a sybil crowd) could stop its training. It logs
that it is over its share.

The wait happens in the worker thread, before its job, never on the event loop. The share is
one for the process (``COMPUTE_LIMITS``), set at start and on a reload; a change wakes the
waiting threads, which then owe by the new share.

torch's thread count is set here too, in each worker thread before its next job: torch keeps it
per thread (a thread reads the process's count once, at its first parallel op), so a count set
from the event loop's thread would never reach a cell that already runs.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from swarmd.errors import ConfigError
from swarmd.system.process_cpu import ProcessTreeCpu

logger = logging.getLogger(__name__)

T = TypeVar("T")

BURST_S = 0.5
"""The most compute that may run beyond the share after a long idle, in seconds."""
IDLE_DEBT_S = 1.0
"""The most busy seconds owed beyond the last job's own length: the debt the idle costs may run
up. A job's own debt is never forgiven; the idle costs' excess over the share is, past this."""
TRAINING_FLOOR = 0.5
"""The fraction of the share a job's own time always gets, whatever the idle costs: a job waits
at most ``job * (1 / (share * TRAINING_FLOOR) - 1)``. With only the ``IDLE_DEBT_S`` bound, a
small model's 50 ms jobs at a share of 0.3 waited 3.5 s each under a crowd of 500 keys'
records (the hostile test): training at 1% of a core, 3 updates in 34-61 s."""
MIN_WAIT_S = 1e-3
"""Debts smaller than this are forgiven: a clock's rounding must not keep a thread waiting."""
STARVED_LOG_S = 600.0
"""How often a daemon whose idle costs exceed its share says so."""


class ComputeLimits:
    """The share (the module doc's bucket), how busy time is metered, and torch's threads, for
    every worker thread of this process. Thread-safe."""

    def __init__(
        self,
        share: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        wait: Callable[[threading.Condition, float], object] | None = None,
        cpu_seconds: Callable[[], float] | None = None,
    ) -> None:
        self._changed = threading.Condition()
        self._clock = clock
        self._wait = wait if wait is not None else threading.Condition.wait
        self._cpu_seconds = cpu_seconds
        """CPU seconds used so far, by the daemon's process tree unless given (made on first use)."""
        self._cores = 0
        self._cpu_at = 0.0
        self._share = 1.0
        self.balance = BURST_S
        self._at = clock()
        self._running: list[float] = []
        """When each job running now began."""
        self._job_s = 0.0
        """How long the last job ran: its own debt, which the bound never forgives."""
        self._starved_said_at = -STARVED_LOG_S
        self.threads = 0
        """torch threads each worker thread computes with (0: as it found them)."""
        self.throttled_s = 0.0
        """Seconds the worker threads waited for the share, all of them together."""
        self.set(share)

    @property
    def share(self) -> float:
        return self._share

    @property
    def cores(self) -> int:
        """The cores whose CPU time is metered (0: compute's running time is)."""
        return self._cores

    def set(self, share: float) -> None:
        """A new share, in effect at once (the waiting threads re-check)."""
        if not 0 < share <= 1:
            raise ConfigError(f"cpu share {share} must be in (0, 1] (0.5: at most half of what it computes on)")
        with self._changed:
            self._advance(self._clock())
            if self._share >= 1 and self._cores:
                self._cpu_at = self._cpu()  # what it used uncapped is nobody's debt
            self._share = share
            self._changed.notify_all()

    def meter_cpu(self, cores: int) -> None:
        """From now on spend the CPU time of the daemon's processes over ``cores`` (compute on
        the CPU with that many threads); 0: spend the time compute runs (compute on a GPU)."""
        if cores < 0:
            raise ValueError(f"cores {cores} must be 0 or more")
        with self._changed:
            self._advance(self._clock())
            self._cores = cores
            if cores:
                self._cpu_at = self._cpu()
            self._changed.notify_all()

    def wake(self) -> None:
        """Wake the waiting threads now (they re-check what they owe)."""
        with self._changed:
            self._changed.notify_all()

    def _cpu(self) -> float:
        if self._cpu_seconds is None:  # made on first use: the process that meters it is the daemon
            self._cpu_seconds = ProcessTreeCpu().seconds
        return self._cpu_seconds()

    def _advance(self, now: float) -> None:
        """Bring the balance to ``now`` (the lock held)."""
        elapsed = max(0.0, now - self._at)
        self._at = now
        if self._share >= 1:
            self.balance = BURST_S  # no cap: nothing owed, and a later cap starts afresh
            return
        if self._cores:
            cpu = self._cpu()
            spent = (cpu - self._cpu_at) / self._cores
            self._cpu_at = cpu
        else:
            spent = elapsed if self._running else 0.0
        longest = max(self._job_s, now - min(self._running, default=now))
        self.balance = max(-(longest + IDLE_DEBT_S), min(BURST_S, self.balance + self._share * elapsed - spent))

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
        seconds waited. Every ``begin`` is followed by one ``end``. A job waits at most until the
        debt is at its bound and the time to pay it has passed: the idle costs keep it there."""
        with self._changed:
            started = self._clock()
            owed = self._owed(started)
            while owed > 0 and not stopped():
                waited, longest = self._clock() - started, self._longest_wait()
                if waited >= longest:
                    self._starved(waited)
                    break
                self._wait(self._changed, min(owed, longest - waited))
                owed = self._owed(self._clock())
            now = self._clock()
            self._running.append(now)
            self.throttled_s += now - started
            return now - started

    def _longest_wait(self) -> float:
        debt_paid = (self._job_s + IDLE_DEBT_S) / self._share
        if self._job_s <= 0:  # no job ran yet: its length, which the floor scales with, is unknown
            return debt_paid
        return min(debt_paid, self._job_s * (1 / (self._share * TRAINING_FLOOR) - 1))

    def end(self) -> None:
        with self._changed:
            now = self._clock()
            self._advance(now)
            began = min(self._running)  # which job ended is not told: the earliest start can only lengthen the bound
            self._running.remove(began)
            self._job_s = now - began
            self._changed.notify_all()

    def _starved(self, waited: float) -> None:
        now = self._clock()
        if now - self._starved_said_at < STARVED_LOG_S:
            return
        self._starved_said_at = now
        logger.warning(
            "[limits] cpu_share %g: a compute job waited %.1f s, the most it may, and went on with its debt "
            "unpaid: swarmd's processes use more than the share even between jobs, so this peer is over "
            "its share and its training slow. "
            "Raise the share ('swarmd config set limits.cpu_share 0.5')",
            self._share,
            waited,
        )


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
