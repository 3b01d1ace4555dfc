"""daemon/cli.py's status lines for training: what happened across epoch changes shows only
once something did."""

from __future__ import annotations

from typing import Any

import pytest

from swarmd.cli import _fmt_training

pytestmark = pytest.mark.timeout(30)


def training(worker: dict[str, int], host: dict[str, int]) -> dict[str, Any]:
    w = {"tasks": {"forward": 3, "backward": 2, "last": 1}, "pushes": 4, "pushes_refused": 0, "weight_pulls": 5,
         "carried_pushes": 0, "carried_dropped": 0, "output_only": 0, **worker}  # fmt: skip
    h = {"carried_pushes": 0, "already_applied": 0, "applied_twice": 0, **host}
    return {"state": "training", "hosting": [1], "stage_versions": [3, 3], "worker": w, "hosts": {"1": {"host": h}}}


def test_epoch_change_counters_show_once_they_count_something() -> None:
    quiet = "\n".join(_fmt_training(training({}, {})))
    assert "epoch changes" not in quiet and "pushes 4 (0 refused)" in quiet
    busy = "\n".join(_fmt_training(training({"carried_pushes": 2, "output_only": 1}, {"applied_twice": 1})))
    assert "across epoch changes: 2 sum(s) pushed after, 0 not taken; 1 task(s) run for output only" in busy
    assert (
        "stage 1   across epoch changes: 0 carried push(es) applied, 0 recompute(s) not pushed, 1 applied twice" in busy
    )
