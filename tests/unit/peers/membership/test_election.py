"""peers/membership/election.py against Sybils: fresh keys, however many and whatever their IDs,
win no role from members the others have watched for longer; a swarm of genuine newcomers still
elects one of each."""

from __future__ import annotations

import random

import pytest

from swarmd.peers.membership.election import (
    SENIOR_S,
    ElectionConfig,
    RoleCandidate,
    elect_coordinator,
    elect_relays,
    elect_standby,
    seniority,
)

pytestmark = pytest.mark.timeout(30)

T = ElectionConfig(min_reliability=0.5, min_relay_reliability=0.6, min_connectivity_Bps=1e6, hysteresis=0.1)
SYBILS = [f"0sybil{i:03d}" for i in range(500)]
"""Fresh keys whose IDs all sort before the members': the lowest ID is theirs to take."""


def sybils(connectivity_Bps: float = 1e9) -> list[RoleCandidate]:
    """Fresh keys as the others see them: no reliability, no observed uptime (heartbeats alone
    earn neither), and whatever connectivity the snapshot filled in for them."""
    return [RoleCandidate(s, 0.0, connectivity_Bps) for s in SYBILS]


def test_seniority_classes_are_a_factor_of_two_wide() -> None:
    assert [seniority(s) for s in (0.0, SENIOR_S - 1, SENIOR_S, 2 * SENIOR_S - 1, 2 * SENIOR_S, 1e6)] == [
        0,
        0,
        1,
        1,
        2,
        1 + 14,
    ]
    assert seniority(float("nan")) == 0 and seniority(float("inf")) == 0 and seniority(-5.0) == 0


def test_a_sybil_burst_never_wins_the_coordinator_in_a_young_swarm() -> None:
    members = [RoleCandidate("m1", 0.05, 2e6, 400.0), RoleCandidate("m2", 0.04, 2e6, 300.0)]
    everyone = [*sybils(), *members]
    random.Random(3).shuffle(everyone)
    assert elect_coordinator(everyone, None, T) == "m1"  # nobody eligible: the most senior, not the lowest ID
    assert elect_coordinator(everyone, "m2", T) == "m2"  # ... and an incumbent stays
    # within one class of seniority, the lowest ID, whatever the noise in the figures
    assert elect_coordinator([RoleCandidate("m2", 0.05, 2e6, 440.0), members[0]], None, T) == "m1"


def test_four_genuine_newcomers_still_elect_one_coordinator_at_once() -> None:
    rng = random.Random(11)
    for _ in range(20):  # each peer's copy of the figures differs by noise
        newcomers = [RoleCandidate(p, rng.uniform(0, 0.05), rng.uniform(1e3, 1e8), rng.uniform(0, 50)) for p in "dbca"]
        assert elect_coordinator(newcomers, None, T) == "a"


def test_a_sybil_burst_never_becomes_the_relay() -> None:
    members = [RoleCandidate("m1", 0.02, 2e6, 90.0), RoleCandidate("m2", 0.03, 5e6, 200.0)]
    # nobody eligible and no relay yet: the most senior serves, not the best-connected fresh key
    assert elect_relays([*sybils(), *members], [], T, 2) == ["m2"]
    assert elect_relays([*sybils(), *members], [], T, 2, preferred=[SYBILS[0]]) == ["m2"]  # whatever the planner says
    peers = [RoleCandidate("m1", 0.02, 2e6, 130.0), RoleCandidate("m2", 0.03, 5e6, 200.0)]  # one class
    assert elect_relays([*sybils(), *peers], [], T, 2, preferred=["m1"]) == ["m1"]  # among equals, the planner's
    eligible = [RoleCandidate("m3", 0.9, 5e6, 1e5)]
    assert elect_relays([*sybils(), *members, *eligible], [], T, 2) == ["m3"]


def test_a_sybil_burst_never_becomes_the_standby() -> None:
    """The reported case: fresh keys' heartbeats claim any uptime they like; the standby is
    elected on uptime as others observed it, and a young swarm ranks on that first."""
    need = T.min_reliability
    members = [("m1", 0.0, 150.0, 1e6), ("m2", 0.0, 400.0, 5e5)]
    fresh = [(s, 0.0, 0.0, 1e9) for s in SYBILS]
    assert elect_standby([*fresh, *members], need) == "m2"  # seniority first: m2 is up longer
    # once someone is reliable, the calibrated order: reliability, then the link from the server
    trusted = [("m1", 0.6, 3000.0, 1e6), ("m2", 0.6, 9000.0, 5e5), ("m3", 0.4, 1e5, 1e9)]
    assert elect_standby([*fresh, *trusted], need) == "m1"
