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
from swarmd.peers.membership.standing import Silence
from swarmd.peers.records.identity import Identity
from swarmd.peers.records.links import KIND as LINKS_KIND
from swarmd.peers.records.links import LinksRecord, ProbeBudget
from swarmd.peers.records.plan_record import KIND as PLAN_KIND
from swarmd.peers.records.plan_record import PlanRecord
from swarmd.peers.records.run_spec import parse_spec_body, sign_run_spec

pytestmark = pytest.mark.timeout(30)

ME = Identity.generate()
SPEC = sign_run_spec(Identity.generate(), parse_spec_body(dict(DEFAULT_RUN)))
"""A run someone else created, whose creator is away: before a plan, peers seen for a probation stand."""
OWN_SPEC = sign_run_spec(ME, parse_spec_body(dict(DEFAULT_RUN)))
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
    coordination = Coordination(
        OWN_SPEC, ME, dht, measurements, ElectionConfig(), lambda: (10.0, 16.0), probation_s=4.0
    )
    with caplog.at_level("INFO", logger="swarmd.node.coordination"):
        for _ in range(2):  # alone: this peer coordinates, and says so once
            asyncio.run(coordination.coordinate())
        coordination.coordinator, coordination.plan = "someone-else", None
        coordination._log_roles()
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Role")]
    assert lines[0] == "Role won: coordinator" and lines.count("Role won: coordinator") == 1, lines
    assert "Role lost: coordinator" in lines[1:], lines


def links(by: str, bandwidth: dict[str, float], now: float) -> LinksRecord:
    table = {p: (0.001, b, 1.0) for p, b in bandwidth.items()}
    return LinksRecord(
        run_id=SPEC.run_id, peer_id=by, issued_at=now, expires_at=now + 300, tflops=1e3, memory_gib=80.0, links=table
    )


@pytest.mark.parametrize("keys", [5, 50, 500])
def test_fresh_keys_with_any_records_they_like_win_no_role(tmp_path: Path, keys: int) -> None:
    """The reported takeover: fresh keys (their IDs sorting first) publish heartbeats, made-up
    observations of each other (up for years, the members down), links records claiming
    terabytes a second, and plans of their own. With a plan in force, none stands."""
    now = time.time()
    dht = RecordsDHT()
    measurements = Measurements(SPEC.run_id, ME, dht, tmp_path, ProbeBudget(), lambda: (10.0, 16.0), 5.0)
    coordination = Coordination(SPEC, ME, dht, measurements, ElectionConfig(), lambda: (10.0, 16.0), probation_s=4.0)
    creator, member = SPEC.creator, "m-member"
    sybils = [f"0-sybil-{i:03d}" for i in range(keys)]
    honest = [ME.peer_id, creator, member]
    # this peer has watched them all for ten minutes (the Sybils, too, stayed for that long)
    measurements.observe([heartbeat(creator, 600.0), heartbeat(member, 600.0), *(heartbeat(s, 600.0) for s in sybils)])
    ours = plan(creator, 5, honest, now)
    coordination.plan = ours
    forged = {s: 1e9 for s in sybils} | {p: 0.0 for p in honest}
    dht.records[PLAN_KIND] = [ours, *(plan(s, 6, [s, *sybils[:2]], now) for s in sybils[:50])]
    dht.records[OBSERVATIONS_KIND] = [
        observed(ME.peer_id, {creator: 600.0, member: 600.0, **{s: 600.0 for s in sybils[:100]}}, now),
        observed(creator, {ME.peer_id: 600.0, member: 600.0}, now),
        observed(member, {ME.peer_id: 600.0, creator: 600.0}, now),
        *(observed(s, {p: v for p, v in forged.items() if p != s}, now) for s in sybils[:20]),
    ]
    dht.records[LINKS_KIND] = [
        links(creator, {ME.peer_id: 5e6, member: 5e6}, now),
        *(links(s, {p: 1e12 for p in [*honest, *sybils[:50]] if p != s}, now) for s in sybils[:20]),
    ]
    for _ in range(2):
        asyncio.run(coordination.coordinate())
        assert coordination.coordinator == creator and coordination.plan_record() == ours
        assert coordination.electable <= set(honest)
        assert not set(coordination.relays()) & set(sybils)
        assert coordination.standby_for(ME.peer_id) in (creator, member)
        # their word moved no honest peer's standing and won them none: only what members saw counts
        assert coordination.view.observed_up_s(creator) == 600.0
        assert coordination.view.observed_up_s(sybils[0]) == 600.0 and coordination.score_of(sybils[0]) < 0.5
        assert coordination.view.connectivity[sybils[0]] == 0.0
    assert dht.published == []


def test_a_newcomer_with_the_lowest_peer_id_does_not_coordinate_before_the_first_plan(tmp_path: Path) -> None:
    """No plan exists yet: the run's creator is live and stands alone, whatever sorts first."""
    now = time.time()
    dht = RecordsDHT()
    measurements = Measurements(SPEC.run_id, ME, dht, tmp_path, ProbeBudget(), lambda: (10.0, 16.0), 5.0)
    coordination = Coordination(SPEC, ME, dht, measurements, ElectionConfig(), lambda: (10.0, 16.0), probation_s=4.0)
    newcomer = "0000-newcomer"
    measurements.observe([heartbeat(SPEC.creator, 5.0), heartbeat(newcomer, 600.0)])
    dht.records[PLAN_KIND] = [plan(newcomer, 1, [newcomer, ME.peer_id], now)]
    dht.records[OBSERVATIONS_KIND] = [observed(newcomer, {SPEC.creator: 0.0, ME.peer_id: 0.0}, now)]
    asyncio.run(coordination.coordinate())
    assert coordination.coordinator == SPEC.creator and coordination.plan_record() is None


def test_a_coordinator_that_publishes_no_plan_is_passed_over(tmp_path: Path) -> None:
    """The elected creator stays silent (its daemon never plans): past the deadline every peer
    passes it over and elects the next; it stands again only after ``pass_over_s``."""
    dht = RecordsDHT()
    measurements = Measurements(SPEC.run_id, ME, dht, tmp_path, ProbeBudget(), lambda: (10.0, 16.0), 5.0)
    coordination = Coordination(SPEC, ME, dht, measurements, ElectionConfig(), lambda: (10.0, 16.0), probation_s=4.0)
    coordination.silence = Silence(0.0)  # the deadline passes between two rounds
    coordination.silence.pass_over_s = 600.0
    coordination._started -= 60.0  # this peer has been up for a probation
    measurements.observe([heartbeat(SPEC.creator, 600.0)])
    asyncio.run(coordination.coordinate())
    assert coordination.coordinator == SPEC.creator
    asyncio.run(coordination.coordinate())  # silent past the deadline: passed over
    assert coordination.status()["passed_over"] == [SPEC.creator]
    asyncio.run(coordination.coordinate())
    assert coordination.coordinator == ME.peer_id  # the next in line
