"""daemon/node/plan_choice.py: the rules every peer must compute alike from the same records: who
coordinates, and which plan to follow."""

from __future__ import annotations

import pytest

from swarmd.node.plan_choice import elect, incumbent, plan_to_follow
from swarmd.node.swarm_view import SwarmView
from swarmd.peers.membership.election import ElectionConfig
from swarmd.peers.membership.reliability import Reliability
from swarmd.peers.records.plan_record import PlanRecord

pytestmark = pytest.mark.timeout(30)

T0 = 1_800_000_000.0


def plan(by: str, version: int, expires_at: float = T0 + 60, issued_at: float = T0) -> PlanRecord:
    return PlanRecord(
        run_id="r.x",
        peer_id=by,
        issued_at=issued_at,
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


def test_the_incumbent_stays_coordinator_while_it_passes_the_thresholds() -> None:
    thresholds = ElectionConfig(min_reliability=0.5, min_relay_reliability=0.6, min_connectivity_Bps=0.0)
    scores = {"a": 0.9, "b": 0.55, "c": 0.2}
    view = SwarmView(reliability={p: Reliability(s, 2, None, None) for p, s in scores.items()})
    assert elect(view, [plan("b", 3)], {"a", "b", "c"}, T0, thresholds) == "b"  # sticky, though a scores higher
    assert elect(view, [plan("c", 3)], {"a", "b", "c"}, T0, thresholds) == "a"  # c fell below: the best takes over


def test_peers_follow_the_coordinators_plan_else_the_newest() -> None:
    plans = [plan("a", 4), plan("b", 2)]
    assert plan_to_follow(plans, "b", "c", None, None) == plans[1]  # the coordinator's, though older
    assert plan_to_follow(plans, "c", "c", None, None) == plans[0]  # the coordinator has none yet: the newest
    # the same version twice: the later issued
    later = plan("a", 4, issued_at=T0 + 5)
    assert plan_to_follow([plans[0], later], "a", "c", None, None) == later


def test_the_coordinator_follows_what_it_published_before_the_dht_returns_it() -> None:
    current, published = plan("c", 1), plan("c", 2)
    assert plan_to_follow([], None, "c", None, current) == current  # nothing seen: keep the plan in force
    assert plan_to_follow([current], "c", "c", published, current) == published
    # a peer that no longer coordinates does not prefer its own stale plan
    assert plan_to_follow([plan("a", 1)], "a", "c", published, current).peer_id == "a"
