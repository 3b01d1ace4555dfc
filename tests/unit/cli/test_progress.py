"""daemon/cli/progress.py: the share done, the time so far and the estimate left."""

from __future__ import annotations

import io

import pytest

from swarmd.cli.progress import ProgressLine, duration

pytestmark = pytest.mark.timeout(10)


def test_durations_read_as_a_person_says_them() -> None:
    assert [duration(s) for s in (4.4, 65, 3725)] == ["4 s", "1 min 05 s", "1 h 02 min"]


def test_the_estimate_scales_the_time_so_far_by_what_is_left() -> None:
    progress = ProgressLine("swarmd", io.StringIO())
    progress.started = 100.0
    assert progress.line(0.25, now=160.0) == "swarmd:  25%, 1 min 00 s so far, about 3 min 00 s left"
    assert progress.line(0.0, now=101.0) == "swarmd:   0%, 1 s so far"  # no estimate from nothing


def test_off_a_terminal_lines_come_at_most_every_few_seconds_and_the_last_says_done() -> None:
    out = io.StringIO()
    progress = ProgressLine("sim", out)
    for k in range(1, 101):  # a fast run: nothing between start and done
        progress.update(k / 100)
    progress.done("and its failure-free run")
    (line,) = out.getvalue().splitlines()
    assert line.startswith("sim: done in ") and line.endswith("; and its failure-free run")
