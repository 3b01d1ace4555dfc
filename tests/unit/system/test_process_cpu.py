"""The CPU time of a process and its descendants, read from the real process table."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from swarmd.system.process_cpu import RELIST_S, REREAD_S, ProcessTreeCpu

pytestmark = pytest.mark.timeout(30)

BURN = "import time\nt = time.process_time()\nwhile time.process_time() - t < {seconds}: pass\n"


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_childs_cpu_counts_and_stays_counted_after_it_exits() -> None:
    clock = Clock()
    tree = ProcessTreeCpu(clock)
    script = BURN.format(seconds=0.5) + "print('burnt', flush=True)\ninput()"
    child = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        clock.now += RELIST_S
        before, mine = tree.seconds(), time.process_time()  # the child listed, before it burns much
        assert child.stdout is not None and child.stdout.readline() == b"burnt\n"
        clock.now += 2 * REREAD_S
        burnt = tree.seconds() - before - (time.process_time() - mine)
        assert burnt >= 0.3  # of the child's 0.5 s (less what it burnt before the first reading)
    finally:
        child.communicate(b"\n", timeout=10)
    clock.now += 2 * REREAD_S
    assert tree.seconds() >= before + burnt  # gone, and still counted


def test_readings_closer_than_the_reread_interval_are_the_last_one() -> None:
    clock = Clock()
    tree = ProcessTreeCpu(clock)
    first = tree.seconds()
    t = time.process_time()
    while time.process_time() - t < 0.05:
        pass
    assert tree.seconds() == first
    clock.now += 2 * REREAD_S
    assert tree.seconds() >= first + 0.04
