"""Counts and mean times per operation, as ``swarmd status`` and the simulator report them."""

from __future__ import annotations

import pytest

from swarmd.peers.sim.op_times import OpTimes

pytestmark = pytest.mark.timeout(10)


def test_counts_and_means_per_operation_with_runs_added_one_or_many_at_a_time() -> None:
    times = OpTimes()
    times.add("push", 1.0)
    times.add("push", 2.0)
    times.add("claim", 0.04, times=1000)  # a thousand fruitless rounds' claims at once
    times.add("put", 0.5, times=0)
    assert times.status() == {"claim": {"n": 1000, "mean_ms": 40.0}, "push": {"n": 2, "mean_ms": 1500.0}}
