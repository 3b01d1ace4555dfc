"""The CPU time used by this process and every process under it.

That is what swarmd costs its owner's machine: the daemon, its DHT process and each p2pd.

A process's own time (``time.process_time``: every thread, user and system) is exact and cheap
to read. Its descendants are found by walking the process table, which costs milliseconds, so
the list is refreshed every ``RELIST_S``; each known descendant's counters are read on every call
(one ``/proc`` file each on Linux). The total never goes down: a descendant that exits keeps the
last time read from it. Time it spent after that last read, and all of a descendant that lived
less than ``RELIST_S`` unseen, is missed; for swarmd's children, which live as long as the daemon,
that is nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import psutil

RELIST_S = 5.0
"""How often the descendants are listed anew (a p2pd restarted is counted from then)."""
REREAD_S = 0.02
"""Readings closer together than this return the last one: the kernel counts a child's time in
10 ms ticks, and a throttle that reads it before every job need not pay for each read."""


class ProcessTreeCpu:
    """``seconds()``: CPU seconds used so far by this process and its descendants."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._me = psutil.Process()
        self._children: dict[tuple[int, float], psutil.Process] = {}
        self._last: dict[tuple[int, float], float] = {}
        self._gone_s = 0.0
        self._listed_at = -RELIST_S
        self._read_at = -REREAD_S
        self._total = 0.0

    def seconds(self) -> float:
        now = self._clock()
        if now - self._read_at < REREAD_S:
            return self._total
        self._read_at = now
        if now - self._listed_at >= RELIST_S:
            self._listed_at = now
            self._relist()
        for key, child in list(self._children.items()):
            try:
                times = child.cpu_times()
            except psutil.Error:  # exited (or no longer ours to read): its last reading stays counted
                self._gone_s += self._last.pop(key, 0.0)
                del self._children[key]
                continue
            self._last[key] = times.user + times.system
        self._total = max(self._total, time.process_time() + self._gone_s + sum(self._last.values()))
        return self._total

    def _relist(self) -> None:
        try:
            found = self._me.children(recursive=True)
        except psutil.Error:
            return
        for child in found:
            try:
                key = (child.pid, child.create_time())
            except psutil.Error:
                continue
            self._children.setdefault(key, child)
