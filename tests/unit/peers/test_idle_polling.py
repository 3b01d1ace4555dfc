"""The idle worker's schedule of claims, shared by the daemon's worker and the simulator."""

from __future__ import annotations

import pytest

from swarmd.peers.idle_polling import FLUSH_IDLE_S, IDLE_MAX_S, IDLE_MIN_S, flush_at, next_round

pytestmark = pytest.mark.timeout(10)


def rounds_by_loop(round_s: float, until: float) -> list[float]:
    """The daemon's loop written out: wait, a round, the wait doubled (to IDLE_MAX_S), ..."""
    starts, t, wait = [], 0.0, IDLE_MIN_S
    while t < until:
        t += wait
        starts.append(t)
        t += round_s
        wait = min(2 * wait, IDLE_MAX_S)
    return starts


@pytest.mark.parametrize("round_s", [0.0, 0.04, 0.3])
def test_the_next_round_is_the_first_of_the_loop_at_or_after_the_time(round_s: float) -> None:
    starts = rounds_by_loop(round_s, 30.0)
    for idle_for in [0.0, 0.001, 0.005, 0.0051, 0.2, 0.77, 3.0, 12.345]:
        expected = next(i for i, t in enumerate(starts) if t >= idle_for - 1e-12)
        start, before = next_round(idle_for, round_s)
        assert start == pytest.approx(starts[expected]) and before == expected


def test_rounds_come_every_round_and_the_longest_wait_once_the_waits_stop_doubling() -> None:
    a, n = next_round(100.0, 0.04)
    b, m = next_round(a + 1e-9, 0.04)
    assert b - a == pytest.approx(0.04 + IDLE_MAX_S) and m == n + 1


def test_a_worker_flushes_at_the_end_of_the_first_round_past_the_flush_time() -> None:
    assert flush_at(0.0) == pytest.approx(0.075)  # rounds end at 5, 15, 35, 75 ms
    assert flush_at(0.1) == pytest.approx(0.105)  # the first round already ends past 50 ms
    assert all(flush_at(r) >= FLUSH_IDLE_S for r in (0.0, 0.01, 0.02, 1.0))


def test_negative_times_are_refused() -> None:
    with pytest.raises(ValueError, match="must be >= 0"):
        next_round(-1.0, 0.1)
