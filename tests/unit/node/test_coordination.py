"""daemon/node/coordination.py: a round over the swarm's records as the DHT returns them. The
reported takeover (a fresh key's heartbeat, plus a plan at version 2^53 naming it server and
relay) gets it followed by nobody, believed as relay by nobody, and counted in the status."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from swarmd.models.presets import DEFAULT_RUN
from swarmd.node.coordination import Coordination
from swarmd.node.measurements import Measurements
from swarmd.peers.membership.election import ElectionConfig
from swarmd.peers.membership.reliability import KIND as OBSERVATIONS_KIND
from swarmd.peers.membership.reliability import Observations
from swarmd.peers.records.identity import Identity
from swarmd.peers.records.links import KIND as LINKS_KIND
from swarmd.peers.records.links import ProbeBudget
from swarmd.peers.records.plan_record import KIND as PLAN_KIND
from swarmd.peers.records.plan_record import PlanRecord
from swarmd.peers.records.run_spec import parse_spec_body, sign_run_spec

pytestmark = pytest.mark.timeout(30)

ME = Identity.generate()
SPEC = sign_run_spec(ME, parse_spec_body(dict(DEFAULT_RUN)))
HUGE = 2**53


class RecordsDHT:
    """The DHT as coordination reads it: the verified records of each kind, as set by the test."""

    def __init__(self) -> None:
        self.records: dict[str, list[Any]] = {LINKS_KIND: [], OBSERVATIONS_KIND: [], PLAN_KIND: []}
        self.published: list[Any] = []

    async def scan_peer_records(self, kind: str, now: float | None) -> list[Any]:
        return list(self.records[kind])

    async def publish_peer_record(self, kind: str, peer: str, raw: bytes, expires_at: float) -> None:
        self.published.append((kind, peer))


def plan(by: str, version: int, devices: list[str], now: float) -> PlanRecord:
    return PlanRecord(
        run_id=SPEC.run_id,
        peer_id=by,
        issued_at=now,
        expires_at=now + 300,
        version=version,
        kind="full",
        devices=devices,
        pipelines=[[0, 1]],
        layers_per_stage=[3, 1],
        parameter_servers=[0, 1],
        relays=[devices.index(by)],
    )


def observed(observer: str, up_s: dict[str, float], now: float) -> Observations:
    peers = {p: (s, s, 0) for p, s in up_s.items()}
    return Observations(run_id=SPEC.run_id, peer_id=observer, issued_at=now, expires_at=now + 300, peers=peers)


def heartbeat(peer: str, seen_for_s: float = 0.0) -> dict[str, Any]:
    # a fresh key may claim any uptime it likes in its own heartbeat: nothing reads it for a role
    device = {"memory_bytes": 16 << 30}
    return {"peer_id": peer, "uptime_s": 1e9, "throughput_gflops": 1000.0, "device": device, "seen_for_s": seen_for_s}


def test_a_strangers_plan_and_a_sybil_burst_take_no_role(tmp_path: Path) -> None:
    now = time.time()
    dht = RecordsDHT()
    measurements = Measurements(SPEC.run_id, ME, dht, tmp_path, ProbeBudget(), lambda: (10.0, 16.0), 5.0)
    thresholds = ElectionConfig()
    coordination = Coordination(SPEC, ME, dht, measurements, thresholds, lambda: (10.0, 16.0), probation_s=4.0)
    member, stranger = "m-coordinator", "0-stranger"
    sybils = [f"0-sybil-{i:03d}" for i in range(100)]
    # this peer has seen the member's and the stranger's heartbeats for a minute, the Sybils' for nothing
    measurements.observe([heartbeat(member, 60.0), heartbeat(stranger, 60.0), *map(heartbeat, sybils)])
    ours = plan(member, 5, [ME.peer_id, member, stranger], now)
    theirs = plan(stranger, HUGE, [stranger, ME.peer_id, member], now)
    dht.records[PLAN_KIND] = [ours, theirs]
    # a young swarm: nobody is reliable yet, the member has been seen up for ten minutes, this
    # peer for two, the fresh keys for nothing
    dht.records[OBSERVATIONS_KIND] = [
        observed(ME.peer_id, {member: 600.0, stranger: 0.0}, now),
        observed(member, {ME.peer_id: 120.0}, now),
    ]
    for _ in range(3):  # the refusals are counted once, however many rounds the plan stays
        asyncio.run(coordination.coordinate())
        assert coordination.coordinator == member and coordination.plan_record() == ours
        assert coordination.relays() == [member]
        assert coordination.is_relay(member) and not coordination.is_relay(stranger)
    assert coordination.status()["plans_refused"] == {"not_coordinator": 1}
    assert coordination.standby_for(ME.peer_id) == member  # not the fresh key claiming 1e9 s of uptime
    # a member the plan does not name, or one seen for less than a probation, never stands by
    measurements.observe([heartbeat(member, 60.0), heartbeat(stranger, 60.0), heartbeat(sybils[0], 3.0)])
    coordination.plan = plan(ME.peer_id, 6, [ME.peer_id, sybils[0]], now)
    assert coordination.standby_for(ME.peer_id) is None
    assert dht.published == []  # nor did this peer think itself the coordinator
    # the relay leaves: named in the plan still, but no longer believed
    measurements.observe([heartbeat(p) for p in [stranger, *sybils]])
    assert not coordination.is_relay(member)


def test_winning_and_losing_the_coordinator_role_is_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    dht = RecordsDHT()
    measurements = Measurements(SPEC.run_id, ME, dht, tmp_path, ProbeBudget(), lambda: (10.0, 16.0), 5.0)
    coordination = Coordination(SPEC, ME, dht, measurements, ElectionConfig(), lambda: (10.0, 16.0), probation_s=4.0)
    with caplog.at_level("INFO", logger="swarmd.node.coordination"):
        for _ in range(2):  # alone: this peer coordinates, and says so once
            asyncio.run(coordination.coordinate())
        coordination.coordinator, coordination.plan = "someone-else", None
        coordination._log_roles()
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Role")]
    assert lines[0] == "Role won: coordinator" and lines.count("Role won: coordinator") == 1, lines
    assert "Role lost: coordinator" in lines[1:], lines
