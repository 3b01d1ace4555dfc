"""peers/membership/probes.py: which members a round of RTT probes pings."""

from __future__ import annotations

import pytest

from swarmd.peers.membership.probes import probe_batch

pytestmark = pytest.mark.timeout(10)


def test_never_pinged_members_go_first_then_the_longest_ago() -> None:
    probed = {"a": 5.0, "b": 1.0, "c": 3.0}
    assert probe_batch(["a", "b", "c", "d", "e"], probed, 3) == ["d", "e", "b"]


def test_every_member_gets_its_turn_within_a_bounded_number_of_rounds() -> None:
    members = [f"p{i:03d}" for i in range(500)]
    probed: dict[str, float] = {}
    pinged: set[str] = set()
    for now in range(16):  # 500 members, 32 a round: all pinged within 16 rounds
        batch = probe_batch(members, probed, 32)
        assert len(batch) == 32 or len(pinged) + len(batch) == len(members)
        probed.update(dict.fromkeys(batch, float(now)))
        pinged.update(batch)
    assert pinged == set(members)
