"""peers/membership/standing.py: who may stand for a role, whose word counts, and a coordinator
that never plans is passed over."""

from __future__ import annotations

import pytest

from swarmd.peers.membership.standing import (
    MIN_DEADLINE_S,
    PASS_OVER_ROUNDS,
    Silence,
    coordinator_deadline_s,
    electable,
    trusted_observers,
)

pytestmark = pytest.mark.timeout(30)

LIVE = {"creator", "m1", "m2", "0new"}


def test_with_a_plan_only_its_members_and_the_creator_are_believed() -> None:
    assert trusted_observers(LIVE, ["m1", "m2", "gone"], "creator") == {"m1", "m2", "creator"}
    assert trusted_observers(LIVE - {"creator"}, ["m1"], "creator") == {"m1"}
    assert trusted_observers(LIVE, None, "creator") is None  # no plan yet: every live observer


def test_with_a_plan_only_its_members_stand_those_watched_longest_first() -> None:
    up = {"m1": 120.0, "m2": 2.0, "0new": 1e9}.get

    def watched(p: str) -> float:
        return up(p) or 0.0

    seen = {p: 600.0 for p in LIVE}
    assert electable(LIVE, ["m1", "m2"], "creator", watched, seen, 4.0) == {"m1"}
    # nobody planned watched for a probation (the observers left with the last coordinator)
    assert electable(LIVE, ["m2"], "creator", watched, seen, 4.0) == {"m2"}
    # a newcomer however long it claims, or a creator no longer in the plan, does not stand
    assert "0new" not in electable(LIVE, ["m1", "m2"], "creator", watched, seen, 4.0)
    assert electable(LIVE, ["m1", "m2"], "creator", watched, seen, 4.0, passed_over={"m1"}) == {"m2"}


def test_before_any_plan_the_creator_stands_alone_else_those_seen_for_a_probation() -> None:
    seen = {"creator": 1.0, "m1": 30.0, "m2": 3.0, "0new": 3.9}
    assert electable(LIVE, None, "creator", lambda p: 1e9, seen, 4.0) == {"creator"}
    assert electable(LIVE - {"creator"}, None, "creator", lambda p: 1e9, seen, 4.0) == {"m1"}
    assert electable(LIVE, None, "creator", lambda p: 0.0, seen, 4.0, passed_over={"creator"}) == {"m1"}


def test_a_coordinator_silent_past_the_deadline_is_passed_over_for_a_while() -> None:
    assert coordinator_deadline_s(1.0) == MIN_DEADLINE_S and coordinator_deadline_s(60.0) == 240.0
    silence = Silence(30.0)
    assert not silence.note("x", None, 100.0)
    assert not silence.note("x", "old", 129.0)  # elected 29 s ago, no plan of its own yet
    assert silence.note("x", "old", 130.0)
    assert silence.passed_over(131.0) == {"x"} and silence.passed_over_total == 1
    assert silence.passed_over(130.0 + PASS_OVER_ROUNDS * 30.0) == set()
    # one that plans in time is never passed over; a new election starts the clock again
    assert not silence.note("y", None, 200.0) and not silence.note("y", "y", 300.0)
    assert not silence.note("z", None, 400.0) and not silence.note("w", None, 429.0)
    assert not silence.note("w", None, 440.0)
