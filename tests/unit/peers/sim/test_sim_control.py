"""peers/sim/control.py in a small world, with a recording target for its plans: the most
reliable member coordinates, plans at its own round after a change is noticed, a coordinator
that leaves before its round or while planning publishes nothing, and relays are elected."""

from __future__ import annotations

import pytest

from swarmd.peers.planning.plan_cost import Plan
from swarmd.peers.planning.scenario import Scenario
from swarmd.peers.sim.control import Control, median_rates
from swarmd.peers.sim.simulator import Strategy
from swarmd.peers.sim.world import World
from tests.unit.peers.sim.small_world import world

pytestmark = pytest.mark.timeout(10)

RELIABLE = [0.9, 0.6, 0.7, 0.95, 0.8]
"""d3 is the most reliable: it coordinates; d0 next."""
PLAN = Plan(pipelines=((0,), (1,)), layers_per_stage=(4,), parameter_servers=(2,), share_micro_batches=4)


class Target:
    """Records the plans published, and offers the first one as the assignment."""

    def __init__(self) -> None:
        self.followed: list[tuple[float, Plan]] = []

    def follow(self, now: float, plan: Plan) -> None:
        self.followed.append((now, plan))

    def assignment(self) -> Plan:
        return PLAN


def control(w: World, mend: object = None) -> tuple[Control, Target]:
    def full(view: Scenario) -> Plan:
        return Plan(pipelines=((0,), (1,)), layers_per_stage=(4,), parameter_servers=(0,), share_micro_batches=4)

    strategy = Strategy("test", full, mend)  # type: ignore[arg-type]
    target = Target()
    return Control(w, strategy, target), target


def test_the_most_reliable_member_coordinates_and_the_first_plan_has_its_relays() -> None:
    w = world(5, RELIABLE)
    c, _ = control(w)
    first = c.start()
    assert c.coordinator == 3 and c.plan is first
    assert first.pipelines == ((0,), (1,)) and first.relays == (3,)  # one relay for five members
    assert c.relays == [3] and w.engine.relays == [3]
    assert [e.kind for e in c.events] == ["full"]


def test_a_noticed_change_is_planned_at_the_coordinators_next_round_and_published() -> None:
    w = world(5, RELIABLE, coordinate_s=10.0)
    c, target = control(w)
    c.start()
    w.engine.run_until(25.0, 100)
    c.want_plan(25.0)
    c.want_plan(25.0)  # the round to come sees this change too: one plan
    w.engine.run_until(60.0, 100)
    assert len(target.followed) == 1 and 25.0 <= target.followed[0][0] <= 35.0 + 1.0
    assert [e.kind for e in c.events] == ["full", "replan"]


def test_a_coordinator_gone_before_its_round_plans_nothing_until_the_next_is_elected() -> None:
    w = world(5, RELIABLE)
    c, target = control(w)
    c.start()
    c.want_plan(0.0)
    w.changed(3, False)  # it left; nobody knows yet
    w.engine.run_until(30.0, 100)
    assert target.followed == [] and c.wanted
    w.noticed(30.0, 3, False)
    c.elect()
    assert c.coordinator == 0 and w.counts["coordinator_changes"] == 1
    c.want_plan(30.0)
    w.engine.run_until(60.0, 100)
    assert len(target.followed) == 1


def test_a_plan_whose_coordinator_left_while_computing_it_is_lost() -> None:
    w = world(5, RELIABLE)

    def mend(view: Scenario, previous: Plan, ids: list[str]) -> Plan:
        # The coordinator leaves while the planner runs: before the plan is ready.
        w.engine.at(w.engine.now, lambda now, _: w.changed(3, False), None)
        return previous

    c, target = control(w, mend)
    c.start()
    c.want_plan(0.0)
    w.engine.run_until(30.0, 100)
    assert target.followed == [] and w.counts["plans_lost"] == 1 and c.events[-1].kind == "repair"


def test_a_devices_connectivity_is_the_median_of_its_links() -> None:
    rates = median_rates(world(3).scenario.bandwidth_Bps)
    assert list(rates) == [1e9, 1e9, 1e9]
