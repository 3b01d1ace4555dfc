"""peers/membership/probation.py: a member is planned once it stayed and a node answered; a few a round."""

from __future__ import annotations

from typing import Any

import pytest

from swarmd.peers.membership.probation import MIN_NEWCOMERS, plannable, probation_s

pytestmark = pytest.mark.timeout(30)


def view(seen_for_s: float, rtt_ms: float | None = 5.0, roles: tuple[str, ...] = ("worker",)) -> dict[str, Any]:
    return {"seen_for_s": seen_for_s, "rtt_ms": rtt_ms, "roles": list(roles)}


def test_probation_is_a_few_heartbeats_within_bounds() -> None:
    assert probation_s(1.0) == 4.0
    assert probation_s(15.0) == 60.0
    assert probation_s(0.2) == 4.0


def test_a_newcomer_waits_out_its_probation_and_needs_a_node_that_answered_our_ping() -> None:
    # "ghost" published a links record, say: its own word, which finds no node
    members = {"young": view(2.0), "ghost": view(30.0, rtt_ms=None), "real": view(30.0)}
    out = plannable(members, planned=(), own="me", probation=10.0)
    assert out.peers == {"me", "real"}
    assert (out.waiting, out.no_node) == (1, 1)


def test_planned_members_stay_and_a_flood_joins_a_quarter_a_round_longest_seen_first() -> None:
    planned = [f"p{i:02d}" for i in range(12)]
    members = {p: view(5.0, None) for p in planned}  # kept whatever their figures
    members |= {f"s{i:03d}": view(20.0 + i) for i in range(500)}
    out = plannable(members, planned, own="me", probation=10.0)
    newcomers = out.peers - set(planned) - {"me"}
    assert newcomers == {"s499", "s498", "s497"}  # 25% of 12, the longest seen
    assert out.waiting == 497


def test_a_swarm_being_born_plans_a_few_at_once() -> None:
    members = {f"n{i}": view(10.0 + i) for i in range(4)}
    out = plannable(members, planned=(), own="me", probation=4.0)
    assert len(out.peers) == 1 + MIN_NEWCOMERS and out.waiting == 4 - MIN_NEWCOMERS


def test_a_paused_member_is_planned_for_nothing_the_coordinator_too() -> None:
    planned = ["paused", "working"]
    members = {"paused": view(30.0, roles=("paused",)), "working": view(30.0), "helper": view(30.0, roles=())}
    out = plannable(members, planned, own="me", probation=4.0)
    assert out.peers == {"me", "working", "helper"}  # a planned member that paused leaves the plan
    paused_here = plannable(members, planned, own="me", probation=4.0, own_works=False)
    assert paused_here.peers == {"working", "helper"}
