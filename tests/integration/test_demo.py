"""``swarmd demo``, the README's first command: a local swarm that trains, shown, then stopped cleanly."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def test_demo_trains_with_two_daemons_and_stops_them() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "swarmd", "demo", "--peers", "2", "--duration", "25"],
        capture_output=True,
        text=True,
        timeout=280,
    )
    out = result.stdout
    state = re.search(r"state and logs in (\S+)\)", out)
    if state:
        shutil.rmtree(state.group(1), ignore_errors=True)
    assert result.returncode == 0, out[-3000:] + result.stderr[-3000:]
    progress = [(int(m.group(1)), float(m.group(2))) for m in re.finditer(r"update\s+(\d+)\s+loss ([\d.]+)", out)]
    assert len(progress) >= 2, out[-3000:]
    assert progress[-1][0] > progress[0][0]  # updates grow while it runs
    # Each daemon works a cell of the pipeline (the plan puts 2 stages on 2 peers).
    for daemon in ("d0", "d1"):
        assert re.search(daemon + r": cell \(0, \d\) \d+ shares", out), out[-3000:]
    assert re.search(r"plan v\d+ \((full|repair)\) by d\d: 1 pipeline\(s\) x 2 stages", out), out[-3000:]
    assert "stopped 2 daemons, exit codes [0, 0]" in out
    assert "gathered every stage's weights from the shards" in out and "swarmd export --run-id" in out
    assert "Traceback" not in result.stderr
