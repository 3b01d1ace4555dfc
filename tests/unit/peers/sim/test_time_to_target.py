"""peers/sim/time_to_target.py: when a run's effective tokens reach a target, within the
simulated hours or past them."""

from __future__ import annotations

import pytest

from swarmd.peers.sim.time_to_target import hours_text, time_to_tokens

pytestmark = pytest.mark.timeout(30)


def test_a_target_reached_inside_a_bucket_is_interpolated() -> None:
    # 10 tokens a minute for three minutes: 25 tokens half way through the third minute.
    assert time_to_tokens([10, 10, 10], 60.0, 180.0, 25.0) == (150.0, False)
    assert time_to_tokens([10, 10, 10], 60.0, 180.0, 10.0) == (60.0, False)


def test_a_slow_start_counts() -> None:
    """A run that trains nothing for its first minutes (its first plan, its first round) is
    that much later to any target."""
    assert time_to_tokens([0, 0, 10, 10], 60.0, 240.0, 15.0) == (210.0, False)


def test_past_the_horizon_it_goes_on_at_the_mean_rate() -> None:
    # 30 tokens in 4 minutes (a departure cost the third): 100 tokens take 800 s at that rate.
    seconds, extrapolated = time_to_tokens([10, 10, 0, 10], 60.0, 240.0, 100.0)
    assert extrapolated and seconds == pytest.approx(800.0)


def test_a_run_that_trained_nothing_never_gets_there() -> None:
    assert time_to_tokens([0, 0, 0], 60.0, 180.0, 1.0) == (None, True)


def test_nonsense_is_refused() -> None:
    for args in (([1], 60.0, 60.0, 0.0), ([1], 0.0, 60.0, 1.0), ([1], 60.0, 0.0, 1.0)):
        with pytest.raises(ValueError, match="must be > 0"):
            time_to_tokens(*args)


def test_the_tables_hours() -> None:
    assert hours_text(5400.0, False, 1.0) == "1.5"
    assert hours_text(36000.0, True, 1.0) == "10.0*"
    assert hours_text(None, True, 0.5) == "none in 0.5 h"  # no update committed in the simulated time
