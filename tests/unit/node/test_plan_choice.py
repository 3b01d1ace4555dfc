"""daemon/node/plan_choice.py: the rules every peer must compute alike from the same records: who
coordinates, and which plan to follow; a stranger's plan, however new, is neither."""

from __future__ import annotations

import random

import pytest

from swarmd.node.plan_choice import (
    MAX_PLAN_STEP,
    NOT_COORDINATOR,
    NOT_MEMBER,
    VERSION_JUMP,
    PlanRefusal,
    elect,
    incumbent,
    plan_to_follow,
    screen,
    within_reach,
)
from swarmd.node.swarm_view import SwarmView
from swarmd.peers.membership.election import ElectionConfig
from swarmd.peers.membership.reliability import Reliability
from swarmd.peers.records.plan_record import PlanRecord

pytestmark = pytest.mark.timeout(30)

T0 = 1_800_000_000.0
T = ElectionConfig(min_reliability=0.5, min_relay_reliability=0.6, min_connectivity_Bps=0.0)
HUGE = 2**53


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


def view_of(scores: dict[str, float], up_s: dict[str, float] | None = None) -> SwarmView:
    """A view in which others rate each peer ``scores[p]`` and saw it up ``up_s[p]`` seconds."""
    up = up_s or {}
    return SwarmView(reliability={p: Reliability(s, 2, None, None, up.get(p, 0.0)) for p, s in scores.items()})


def round_of(
    view: SwarmView, plans: list[PlanRecord], live: set[str], current: PlanRecord | None
) -> tuple[str | None, PlanRecord | None, list[PlanRefusal]]:
    """One peer's round as ``Coordination.coordinate`` makes it (this peer publishes nothing)."""
    admitted, refused = screen(plans, live, current, T0)
    coordinator = elect(view, admitted, live, T0, T)
    chosen, passed_over = plan_to_follow(admitted, coordinator, "me", None, current)
    return coordinator, chosen, refused + passed_over


def test_the_incumbent_is_the_newest_plans_publisher_among_the_established() -> None:
    view = view_of({"a": 0.9, "b": 0.8, "c": 0.7})
    plans = [plan("b", 3), plan("a", 2), plan("c", 4)]
    assert incumbent(view, plans, {"a", "b", "c"}, T0, T) == "c"
    assert incumbent(view, plans, {"a", "b"}, T0, T) == "b"  # c is gone: its plan names no coordinator
    # two that started at once publish the same version: everyone picks the lower peer ID
    assert incumbent(view, [plan("b", 5), plan("a", 5)], {"a", "b"}, T0, T) == "a"
    # an expired plan no longer makes its publisher the incumbent
    assert incumbent(view, [plan("a", 9, expires_at=T0 - 1), plan("b", 1)], {"a", "b"}, T0, T) == "b"
    assert incumbent(view, [], {"a"}, T0, T) is None


def test_a_fresh_key_never_becomes_the_incumbent_by_its_version() -> None:
    established = view_of({"a": 0.9, "b": 0.8, "x": 0.0})
    plans = [plan("a", 7), plan("x", HUGE)]
    assert incumbent(established, plans, {"a", "b", "x"}, T0, T) == "a"
    # a young swarm (nobody reliable yet): the most senior publisher, not the newest plan's
    young = view_of({"a": 0.1, "b": 0.1, "x": 0.0}, {"a": 300.0, "b": 280.0, "x": 20.0})
    assert incumbent(young, plans, {"a", "b", "x"}, T0, T) == "a"
    assert incumbent(young, [plan("b", 3), plan("0x", HUGE)], {"a", "b", "0x"}, T0, T) == "b"  # nor its low ID


def test_the_incumbent_stays_coordinator_while_it_passes_the_thresholds() -> None:
    view = view_of({"a": 0.9, "b": 0.55, "c": 0.2})
    assert elect(view, [plan("b", 3)], {"a", "b", "c"}, T0, T) == "b"  # sticky, though a scores higher
    assert elect(view, [plan("c", 3)], {"a", "b", "c"}, T0, T) == "a"  # c is not eligible: the best takes over


def test_plans_are_screened_for_membership_and_for_a_bounded_step() -> None:
    current = plan("a", 10)
    far, near, gone = plan("b", 10 + MAX_PLAN_STEP + 1), plan("c", 10 + MAX_PLAN_STEP), plan("z", 11)
    admitted, refused = screen([far, near, gone, plan("y", 3)], {"a", "b", "c"}, current, T0)
    assert admitted == [near]
    # the non-member's older plan is no event (a coordinator that left leaves one behind)
    assert refused == [PlanRefusal("b", far.version, VERSION_JUMP), PlanRefusal("z", 11, NOT_MEMBER)]
    # a peer that follows nothing yet (it just joined) has no step to bound
    assert screen([far], {"b"}, None, T0) == ([far], [])
    # nor one whose plan expired (it was away for longer than a plan lives)
    assert screen([far], {"b"}, plan("a", 10, expires_at=T0 - 1), T0) == ([far], [])


def test_a_new_coordinator_outnumbers_only_the_plans_within_reach() -> None:
    in_force = plan("a", 10)
    near, far = plan("b", 10 + MAX_PLAN_STEP), plan("x", HUGE)
    assert within_reach([in_force, near, far], in_force) == [in_force, near]
    # with no plan in force (the swarm's first), nothing seen counts: the first plan is version 1
    assert within_reach([far], None) == []


def test_a_stranger_with_a_huge_plan_is_followed_by_nobody() -> None:
    """The reported takeover: a fresh key publishes a plan at version 2^53 (naming itself) and
    heartbeats, so it is live. Neither a peer that follows a plan nor one that just joined
    follows it or elects it, in an established swarm or in a young one."""
    live = {"a", "b", "x"}
    ours, theirs = plan("a", 7), plan("x", HUGE)
    for view in (
        view_of({"a": 0.9, "b": 0.8, "x": 0.0}),
        view_of({"a": 0.1, "b": 0.1, "x": 0.0}, {"a": 300.0, "b": 300.0, "x": 40.0}),
    ):
        coordinator, chosen, refused = round_of(view, [ours, theirs], live, ours)
        assert (coordinator, chosen, refused) == ("a", ours, [PlanRefusal("x", HUGE, VERSION_JUMP)])
        coordinator, chosen, refused = round_of(view, [ours, theirs], live, None)  # a late joiner
        assert (coordinator, chosen, refused) == ("a", ours, [PlanRefusal("x", HUGE, NOT_COORDINATOR)])


def test_peers_follow_only_the_coordinators_plan() -> None:
    plans = [plan("a", 4), plan("b", 2)]
    assert plan_to_follow(plans, "b", "c", None, None) == (plans[1], [PlanRefusal("a", 4, NOT_COORDINATOR)])
    # the coordinator has none yet: keep the plan in force, whatever else is newer
    current = plan("b", 1)
    assert plan_to_follow(plans, "c", "c", None, current)[0] == current
    assert plan_to_follow(plans, "c", "c", None, None)[0] is None
    # the same version twice: the later issued
    later = plan("a", 4, issued_at=T0 + 5)
    assert plan_to_follow([plans[0], later], "a", "c", None, None) == (later, [])


def test_the_coordinator_follows_what_it_published_before_the_dht_returns_it() -> None:
    current, published = plan("c", 1), plan("c", 2)
    assert plan_to_follow([], None, "c", None, current)[0] == current  # nothing seen: keep the plan in force
    assert plan_to_follow([current], "c", "c", published, current)[0] == published
    # a peer that no longer coordinates does not prefer its own stale plan
    assert plan_to_follow([plan("a", 1)], "a", "c", published, current)[0].peer_id == "a"  # type: ignore[union-attr]


def test_four_newcomers_started_at_once_agree_and_a_sybil_burst_changes_nothing() -> None:
    """The demo starts four daemons at once: nobody is reliable or senior, each peer's copy of
    the observations differs by noise, and still every one elects the same coordinator, follows
    its first plan, and keeps it when 50 fresh keys (lower IDs, huge plans) join."""
    rng = random.Random(7)
    peers = ["p1", "p2", "p3", "p4"]

    def noisy(up_s: float, extra: tuple[str, ...] = ()) -> SwarmView:
        scores = {p: rng.uniform(0.0, 0.05) for p in [*peers, *extra]}
        return view_of(scores, {p: rng.uniform(0.6, 1.0) * up_s for p in peers})

    live = set(peers)
    first = {round_of(noisy(10.0), [], live, None)[0] for _ in peers}
    assert first == {"p1"}
    v1 = plan("p1", 1)
    assert all(round_of(noisy(40.0), [v1], live, None)[:2] == ("p1", v1) for _ in peers)
    sybils = [f"0sybil{i:02d}" for i in range(50)]
    flood = [v1, *(plan(s, HUGE - i) for i, s in enumerate(sybils))]
    live |= set(sybils)
    for current in (v1, None):  # a peer that follows p1's plan, and one that joins now
        assert all(round_of(noisy(200.0, tuple(sybils)), flood, live, current)[:2] == ("p1", v1) for _ in peers)
