"""peers/sim/churn.py: who comes and goes, drawn once from the seed."""

from __future__ import annotations

import pytest

from swarmd.peers.sim.churn import churn_schedule, expected_departures
from tests.unit.peers.sim.small_world import scenario

pytestmark = pytest.mark.timeout(30)


def test_devices_without_an_uptime_never_leave() -> None:
    up0, events = churn_schedule(scenario(4), 10 * 3600.0, seed=1)
    assert up0.all() and events == []


def test_each_device_alternates_leaving_and_coming_back_in_time_order_and_the_seed_fixes_it() -> None:
    sc = scenario(6, availability=[0.2, 0.4, 0.5, 0.6, 0.8, 0.9])  # up and down for under an hour
    up0, events = churn_schedule(sc, 20 * 3600.0, seed=3)
    assert [e.at_s for e in events] == sorted(e.at_s for e in events)
    assert all(0 < e.at_s < 20 * 3600.0 for e in events)
    for d in range(6):
        ups = [e.up for e in events if e.device == d]
        assert ups and all(a != b for a, b in zip(ups, ups[1:], strict=False))  # alternating
        assert ups[0] == (not up0[d])  # the first change leaves the state it started in
    again_up0, again = churn_schedule(sc, 20 * 3600.0, seed=3)
    assert (again_up0 == up0).all() and again == events
    assert churn_schedule(sc, 20 * 3600.0, seed=4)[1] != events


def test_the_departures_drawn_average_what_the_uptimes_promise() -> None:
    sc = scenario(6, availability=[0.2, 0.4, 0.5, 0.6, 0.8, 0.9])
    horizon = 50 * 3600.0
    drawn = [sum(not e.up for e in churn_schedule(sc, horizon, seed)[1]) for seed in range(20)]
    assert sum(drawn) / len(drawn) == pytest.approx(expected_departures(sc, horizon), rel=0.1)
