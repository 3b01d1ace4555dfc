"""peers/sim/world.py: the devices' state (who is up, who the membership knows, their epochs)
and what is trained, counted into the timeline's buckets."""

from __future__ import annotations

import numpy as np
import pytest

from swarmd.peers.sim.world import SimConfig, World
from tests.unit.peers.sim.small_world import scenario, world

pytestmark = pytest.mark.timeout(10)


def test_the_world_starts_with_the_devices_up_as_given_and_every_one_up_a_member() -> None:
    up0 = np.array([True, False, True])
    w = World(scenario(3), SimConfig(hours=0.5), up0)
    assert w.members() == [0, 2] and list(w.up) == [True, False, True]
    up0[0] = False  # the world keeps its own copy
    assert w.up[0] and w.member[0]
    assert w.horizon == 1800.0 and len(w.timeline) == 31  # a bucket a minute, and one past the end
    assert w.engine.up is w.up  # the engine sees every change the world makes


def test_a_departure_moves_the_epoch_on_and_a_return_does_not() -> None:
    w = world(3)
    assert w.changed(1, False) == 1 and not w.up[1]
    assert w.members() == [0, 1, 2]  # nobody has noticed yet
    assert w.changed(1, True) == 1 and w.up[1]
    assert w.changed(1, False) == 2


def test_a_notice_changes_the_membership_and_when_it_holds_from() -> None:
    w = world(3)
    w.changed(2, False)
    w.noticed(60.0, 2, False)
    assert w.members() == [0, 1] and w.member_since[2] == 60.0
    w.noticed(90.0, 2, True)
    assert w.members() == [0, 1, 2] and w.member_since[2] == 90.0


def test_what_is_trained_is_counted_in_its_minute_and_a_failover_takes_it_off() -> None:
    w = world(2, hours=0.05)  # three minutes
    w.trained(30.0, 8, 1)
    w.trained(61.0, 16, 2)
    w.trained(10_000.0, 8, 1)  # past the horizon: counted, in no bucket
    assert (w.trained_mb, w.updates) == (32, 4)
    assert w.timeline == [8, 16, 0, 0]
    w.untrained(16)
    assert w.trained_mb == 16 and w.timeline == [8, 16, 0, 0]
