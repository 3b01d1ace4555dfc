"""daemon/node/coordination.py: the pure parts every peer must compute alike (who coordinates, which
plan to follow) and the round trip between a published plan and the planner's Plan."""

from __future__ import annotations

import pytest

from swarmd.node.coordination import incumbent, record_plan
from swarmd.peers.records.plan_record import PlanRecord

pytestmark = pytest.mark.timeout(30)

T0 = 1_800_000_000.0


def plan(by: str, version: int, expires_at: float = T0 + 60) -> PlanRecord:
    return PlanRecord(
        run_id="r.x",
        peer_id=by,
        issued_at=T0,
        expires_at=expires_at,
        version=version,
        kind="full",
        devices=["a", "b", "c"],
        pipelines=[[0, 1]],
        layers_per_stage=[3, 1],
        parameter_servers=[0, 1],
        relays=[2],
    )


def test_the_incumbent_is_the_live_publisher_of_the_newest_plan() -> None:
    plans = [plan("b", 3), plan("a", 2), plan("c", 4)]
    assert incumbent(plans, {"a", "b", "c"}, T0) == "c"
    assert incumbent(plans, {"a", "b"}, T0) == "b"  # c is gone: its plan names no coordinator
    # two that started at once publish the same version: everyone picks the lower peer ID
    assert incumbent([plan("b", 5), plan("a", 5)], {"a", "b"}, T0) == "a"
    # an expired plan no longer makes its publisher the incumbent
    assert incumbent([plan("a", 9, expires_at=T0 - 1), plan("b", 1)], {"a", "b"}, T0) == "b"
    assert incumbent([], {"a"}, T0) is None


def test_a_published_plan_goes_back_to_the_planner_unchanged() -> None:
    p = record_plan(plan("a", 1))
    assert p.pipelines == ((0, 1),) and p.layers_per_stage == (3, 1)
    assert p.parameter_servers == (0, 1) and p.relays == (2,)
