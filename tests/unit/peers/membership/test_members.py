"""peers/membership/members.py: bookkeeping over synthetic heartbeat scans (no network)."""

from __future__ import annotations

import copy

import pytest

from swarmd.models.presets import DEFAULT_RUN
from swarmd.peers.membership.members import Membership
from swarmd.peers.records.heartbeat import DeviceInfo, Heartbeat
from swarmd.peers.records.identity import Identity
from swarmd.peers.records.run_spec import parse_spec_body, sign_run_spec

pytestmark = pytest.mark.timeout(30)

RUN_ID = "test-run.abcdefghijklmnopqrstuvwx"
ME = "12D3KooWMe"
A = "12D3KooWPeerA"
B = "12D3KooWPeerB"
T0 = 1_000_000.0
OPEN_RUN = sign_run_spec(Identity.generate(), parse_spec_body(copy.deepcopy(DEFAULT_RUN)))


def members() -> Membership:
    """This peer's membership of an open run (private runs: test_admission.py)."""
    m = Membership(ME)
    m.follow(OPEN_RUN)
    return m


def hb(peer_id: str, issued_at: float = T0, ttl: float = 60.0, leaving: bool = False, **kw: object) -> Heartbeat:
    fields: dict[str, object] = dict(
        run_id=RUN_ID,
        peer_id=peer_id,
        issued_at=issued_at,
        expires_at=issued_at + ttl,
        addrs=[f"/ip4/10.0.0.1/tcp/31337/p2p/{peer_id}"],
        device=DeviceInfo(kind="cuda", name="GPU", memory_bytes=2**34, cpus=4),
        throughput_gflops=1234.567,
        version="0.1.0",
        roles=["worker"],
        uptime_s=99.99,
        leaving=leaving,
    )
    fields.update(kw)
    return Heartbeat(**fields)  # type: ignore[arg-type]


def test_join_reported_once() -> None:
    m = members()
    assert m.update([hb(A), hb(B)], [], T0) == ([A, B], [])
    assert set(m.peers) == {A, B}
    assert m.update([hb(A, T0 + 10), hb(B, T0 + 10)], [], T0 + 10) == ([], [])


def test_own_peer_id_ignored() -> None:
    m = members()
    assert m.update([hb(ME), hb(A)], [], T0) == ([A], [])
    assert ME not in m.peers


def test_dead_heartbeats_in_scan_ignored() -> None:
    m = members()
    # Expired, or leaving: never joins.
    assert m.update([hb(A, T0 - 100), hb(B, leaving=True)], [], T0) == ([], [])
    assert m.peers == {}


def test_leaving_peer_dropped_at_once() -> None:
    m = members()
    m.update([hb(A), hb(B)], [], T0)
    joined, left = m.update([hb(B, T0 + 1)], [A], T0 + 1)
    assert (joined, left) == ([], [A])
    assert set(m.peers) == {B}


def test_missing_from_one_scan_but_unexpired_kept() -> None:
    m = members()
    m.update([hb(A, ttl=60)], [], T0)
    assert m.update([], [], T0 + 30) == ([], [])
    assert A in m.peers
    # Seen again: not reported as joining a second time.
    assert m.update([hb(A, T0 + 40)], [], T0 + 40) == ([], [])


def test_missing_and_expired_dropped() -> None:
    m = members()
    m.update([hb(A, ttl=60)], [], T0)
    assert m.update([], [], T0 + 60) == ([], [A])
    assert m.peers == {}
    # Coming back later is a new join.
    assert m.update([hb(A, T0 + 100)], [], T0 + 100) == ([A], [])
    assert m.peers[A].first_seen == T0 + 100


def test_latest_heartbeat_wins() -> None:
    m = members()
    newer, older = hb(A, T0 + 5, uptime_s=5.0), hb(A, T0, uptime_s=0.0)
    m.update([newer, older], [], T0 + 5)
    assert m.peers[A].heartbeat == newer
    # A stale scan does not replace a newer heartbeat already held.
    m.update([older], [], T0 + 6)
    assert m.peers[A].heartbeat == newer
    newest = hb(A, T0 + 20)
    m.update([newest], [], T0 + 20)
    assert m.peers[A].heartbeat == newest
    assert m.peers[A].first_seen == T0 + 5


def test_expired_dropped_on_the_next_scan_even_if_missing() -> None:
    m = members()
    m.update([hb(A, ttl=10), hb(B, ttl=100)], [], T0)
    assert m.update([], [], T0 + 5) == ([], [])
    assert m.update([], [], T0 + 10) == ([], [A])
    assert set(m.peers) == {B}


def test_rtt_smoothing() -> None:
    m = members()
    m.update([hb(A)], [], T0)
    m.record_rtt(A, None)
    assert m.peers[A].rtt_s is None
    m.record_rtt(A, 5.0)  # the first ping includes dialling the peer: ignored
    assert m.peers[A].rtt_s is None
    m.record_rtt(A, 0.100)
    assert m.peers[A].rtt_s == pytest.approx(0.100)
    m.record_rtt(A, 0.900)
    assert m.peers[A].rtt_s == pytest.approx(0.875 * 0.100 + 0.125 * 0.900)
    m.record_rtt(A, None)  # a lost ping does not change the figure
    assert m.peers[A].rtt_s == pytest.approx(0.2)
    m.record_rtt(B, 0.5)  # unknown peers are ignored
    assert B not in m.peers


def test_snapshot_fields() -> None:
    m = members()
    m.update([hb(B, T0 - 2), hb(A, T0 - 1)], [], T0)
    m.record_rtt(A, 1.0)  # the dial
    m.record_rtt(A, 0.012345)
    snap = m.snapshot(T0 + 10)
    assert [p["peer_id"] for p in snap] == [A, B]  # sorted
    a = snap[0]
    assert a == {
        "peer_id": A,
        "age_s": 11.0,
        "clock_offset_s": 11.0,
        "rtt_ms": 12.35,
        "seen_for_s": 10.0,
        "addrs": [f"/ip4/10.0.0.1/tcp/31337/p2p/{A}"],
        "roles": ["worker"],
        "device": {"kind": "cuda", "name": "GPU", "memory_bytes": 2**34},
        "throughput_gflops": 1234.6,
        "free_memory_bytes": 0,  # the heartbeat's probe said none (before probes carried it)
        "precision": "",
        "uptime_s": 110.99,  # 99.99 s when it sent its heartbeat, 11 s ago
        "version": "0.1.0",
        "holds": [],
        "held_out": None,
    }
    assert snap[1]["rtt_ms"] is None


def test_peers_keep_their_order_by_uptime_whenever_each_last_sent_a_heartbeat() -> None:
    m = members()
    # A started 0.5 s before B; B's heartbeat is newer, so as of the heartbeats B looked older
    m.update([hb(A, T0 - 0.9, uptime_s=99.7), hb(B, T0 - 0.1, uptime_s=100.0)], [], T0)
    a = {p["peer_id"]: p["uptime_s"] for p in m.snapshot(T0)}
    assert a[A] > a[B]


def test_snapshot_age_never_negative_and_the_clock_offset_shows_the_skew() -> None:
    m = members()
    m.update([hb(A, T0 + 20)], [], T0)  # issued in our future (clock skew)
    assert m.snapshot(T0)[0]["age_s"] == 0.0 and m.snapshot(T0)[0]["clock_offset_s"] == -20.0


def test_no_scan_before_the_spec_is_known() -> None:
    # Admitting without the spec's access rule would let anyone into a private run.
    with pytest.raises(RuntimeError, match="before follow"):
        Membership(ME).update([hb(A)], [], T0)
