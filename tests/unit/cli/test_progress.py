"""daemon/cli/progress.py: the share done, the time so far and the estimate left."""

from __future__ import annotations

import io
import json
import re
import time
from pathlib import Path

import pytest

from swarmd.cli.progress import ProgressLine, duration

pytestmark = pytest.mark.timeout(30)


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


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_waiting_on_another_process_shows_the_time_so_far_and_the_most_left() -> None:
    out = _Terminal()
    progress = ProgressLine("gathering", out)
    with progress.waiting(at_most_s=150.0):
        deadline = time.monotonic() + 10
        while "so far" not in out.getvalue() and time.monotonic() < deadline:
            time.sleep(0.05)  # sync-ok: polling the ticker's output within a deadline
    assert re.search(r"gathering: \d s so far, at most 2 min (30|29|28) s left", out.getvalue()), out.getvalue()


def test_a_large_scenario_reports_its_check_and_its_plan_in_order(tmp_path: Path) -> None:
    from swarmd.peers.planning.planner import plan
    from swarmd.peers.planning.scenario import load_scenario
    from swarmd.peers.planning.scenario_gen import synthetic_scenario_dict

    path = tmp_path / "s.json"
    path.write_text(json.dumps(synthetic_scenario_dict(40)))
    checked: list[float] = []
    scenario = load_scenario(path, checked.append)
    assert len(checked) == 80 and checked == sorted(checked) and checked[-1] == 1.0
    planned: list[float] = []
    plan(scenario, progress=planned.append)
    assert planned == sorted(planned) and planned[-1] == 1.0 and 0 < planned[0] <= 0.5
