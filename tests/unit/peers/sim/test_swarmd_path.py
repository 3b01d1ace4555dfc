"""peers/sim/swarmd_path.py in a small world: the path built on its first plan, the assignment
a repair sees, the roles, whom it plans, where a lost shard starts again, and a plan of
another stage count, which it does not follow."""

from __future__ import annotations

import pytest

from swarmd.peers.planning.plan_cost import Plan
from swarmd.peers.sim.swarmd_path import SwarmdPath
from tests.unit.peers.sim.small_world import world

pytestmark = pytest.mark.timeout(20)

SERVED = Plan(
    pipelines=((0, 1), (2, 3)),
    layers_per_stage=(2, 2),
    parameter_servers=(4, 4),
    relays=(5,),
    share_micro_batches=4,
    local_steps=2,
)


def test_the_run_takes_its_sizes_from_the_first_plan_and_the_assignment_is_what_holds_what() -> None:
    w = world(6)
    path = SwarmdPath(w, SERVED)
    assert (path.sizes.share_micro_batches, path.sizes.local_steps, path.sizes.workload.stages) == (4, 2, 2)
    assert path.sizes.exchange.mode == "local"
    current = path.assignment()
    assert current.pipelines == ((0, 1), (2, 3)) and current.parameter_servers == (4, 4)
    assert current.relays == (5,) and current.local_steps == 2 and current.share_micro_batches == 4


def test_roles_name_every_cell_shard_and_standby_and_only_those_are_planned() -> None:
    w = world(6, [0.9, 0.9, 0.9, 0.9, 0.9, 0.99])
    path = SwarmdPath(w, SERVED)
    roles = path.roles()
    pid = path.pipelines.pipelines[0].pid
    assert roles[0] == [f"cell {pid}/0"] and roles[4] == ["shard 0/0", "shard 1/0"]
    assert roles[5] == ["standby 0/0", "standby 1/0"]  # the most reliable stands by
    assert path.planned(0) and path.planned(4) and not path.planned(5)


def test_a_lost_shard_restarts_on_the_plans_server_while_a_member_else_on_the_likeliest_to_stay() -> None:
    w = world(6, [0.9, 0.8, 0.95, 0.9, 0.9, 0.7])
    path = SwarmdPath(w, SERVED)
    assert path.restart_server(1) == 4
    w.noticed(10.0, 4, False)
    assert path.restart_server(1) == 2


def test_a_plan_of_another_stage_count_is_in_force_but_not_followed() -> None:
    w = world(6)
    path = SwarmdPath(w, SERVED)
    other = Plan(pipelines=((0,), (2,)), layers_per_stage=(4,), parameter_servers=(4,), relays=(1,))
    path.follow(0.0, other)
    assert path.plan is other and path.pipelines.grid() == ((0, 1), (2, 3))


def test_a_new_plan_of_the_runs_shape_is_followed_with_its_relays() -> None:
    w = world(6)
    path = SwarmdPath(w, SERVED)
    swapped = Plan(pipelines=((2, 3), (0, 1)), layers_per_stage=(2, 2), parameter_servers=(4, 4), relays=(1,))
    path.follow(0.0, swapped)
    current = path.assignment()
    assert current.pipelines == ((2, 3), (0, 1)) and current.relays == (1,)
    assert current.local_steps == 2  # H and k stay the first plan's
