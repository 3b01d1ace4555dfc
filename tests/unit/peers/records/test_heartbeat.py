"""peers/records/heartbeat.py: what a reader accepts as another peer's heartbeat."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from swarmd.errors import RecordError
from swarmd.peers.records.envelope import sign_record
from swarmd.peers.records.heartbeat import KIND, MAX_HEARTBEAT_BYTES, MAX_TTL_S, ROLES, DeviceInfo, Heartbeat, HeldOut
from swarmd.peers.records.identity import Identity
from swarmd.peers.records.join_token import MAX_TOKEN_CHARS
from swarmd.peers.records.signed import CLOCK_SKEW_S

pytestmark = pytest.mark.timeout(30)

RUN_ID = "test-run.abcdefghijklmnopqrstuvwx"
NOW = 1_700_000_000.0


@pytest.fixture(scope="module")
def identity() -> Identity:
    return Identity.generate()


def make_heartbeat(identity: Identity, **overrides: Any) -> Heartbeat:
    fields: dict[str, Any] = dict(
        run_id=RUN_ID,
        peer_id=identity.peer_id,
        issued_at=NOW,
        expires_at=NOW + 60,
        addrs=[f"/ip4/10.0.0.1/tcp/31337/p2p/{identity.peer_id}"],
        lan_addrs=["/ip4/10.0.0.1/tcp/4001"],
        device=DeviceInfo(kind="cpu", name="Test CPU", memory_bytes=8 * 2**30, cpus=8),
        throughput_gflops=123.5,
        version="0.1.0",
        roles=["worker"],
        uptime_s=12.0,
    )
    fields.update(overrides)
    return Heartbeat(**fields)


def signed_body(identity: Identity, **overrides: Any) -> bytes:
    """Sign a heartbeat body directly, bypassing Heartbeat's own checks."""
    body = dataclasses.asdict(make_heartbeat(identity))
    body.update(overrides)
    return sign_record(identity, KIND, body)


def test_valid_heartbeat_parses(identity: Identity) -> None:
    hb = make_heartbeat(identity)
    parsed = Heartbeat.parse(hb.sign(identity), run_id=RUN_ID, now=NOW + 1, peer_id=identity.peer_id)
    assert parsed == hb
    assert parsed.is_live(NOW + 1)
    assert not parsed.is_live(NOW + 60)
    # Without a subkey to compare against, too.
    assert Heartbeat.parse(hb.sign(identity), run_id=RUN_ID, now=NOW) == hb


def test_cuda_device_and_all_roles(identity: Identity) -> None:
    hb = make_heartbeat(
        identity,
        device=DeviceInfo(kind="cuda", name="NVIDIA H200", memory_bytes=141 * 2**30, cpus=16),
        roles=["worker", "parameter_server", "relay"],
    )
    assert Heartbeat.parse(hb.sign(identity), run_id=RUN_ID, now=NOW) == hb


def test_expired_rejected(identity: Identity) -> None:
    raw = make_heartbeat(identity).sign(identity)
    with pytest.raises(RecordError, match="expired"):
        Heartbeat.parse(raw, run_id=RUN_ID, now=NOW + 60)
    with pytest.raises(RecordError, match="expired"):
        Heartbeat.parse(raw, run_id=RUN_ID, now=NOW + 10_000)


def test_clock_skew_tolerated_but_far_future_rejected(identity: Identity) -> None:
    raw = make_heartbeat(identity).sign(identity)
    Heartbeat.parse(raw, run_id=RUN_ID, now=NOW - CLOCK_SKEW_S + 1)
    with pytest.raises(RecordError, match="in the future"):
        Heartbeat.parse(raw, run_id=RUN_ID, now=NOW - CLOCK_SKEW_S - 5)
    far = make_heartbeat(identity, issued_at=NOW + 3000, expires_at=NOW + 3060).sign(identity)
    with pytest.raises(RecordError, match="in the future"):
        Heartbeat.parse(far, run_id=RUN_ID, now=NOW)


def test_ttl_over_max_rejected(identity: Identity) -> None:
    ok = make_heartbeat(identity, expires_at=NOW + MAX_TTL_S).sign(identity)
    Heartbeat.parse(ok, run_id=RUN_ID, now=NOW)
    too_long = make_heartbeat(identity, expires_at=NOW + MAX_TTL_S + 1).sign(identity)
    with pytest.raises(RecordError, match="expires_at"):
        Heartbeat.parse(too_long, run_id=RUN_ID, now=NOW)


def test_expires_before_issued_rejected(identity: Identity) -> None:
    raw = make_heartbeat(identity, expires_at=NOW - 1).sign(identity)
    with pytest.raises(RecordError, match="expires_at"):
        Heartbeat.parse(raw, run_id=RUN_ID, now=NOW - 10)


def test_wrong_run_rejected(identity: Identity) -> None:
    raw = make_heartbeat(identity).sign(identity)
    with pytest.raises(RecordError, match="is for run"):
        Heartbeat.parse(raw, run_id="other-run.abcdefghijklmnopqrstuvwx", now=NOW)


def test_body_claiming_another_peer_rejected(identity: Identity) -> None:
    other = Identity.generate()
    raw = signed_body(identity, peer_id=other.peer_id)  # signed by A, claims to be B
    with pytest.raises(RecordError, match="but is signed by"):
        Heartbeat.parse(raw, run_id=RUN_ID, now=NOW)
    with pytest.raises(RecordError, match="but is signed by"):
        Heartbeat.parse(raw, run_id=RUN_ID, now=NOW, peer_id=other.peer_id)


def test_sign_refuses_another_peers_heartbeat(identity: Identity) -> None:
    hb = make_heartbeat(Identity.generate())
    with pytest.raises(RecordError, match="cannot sign"):
        hb.sign(identity)


def test_stored_under_another_peers_subkey_rejected(identity: Identity) -> None:
    raw = make_heartbeat(identity).sign(identity)
    with pytest.raises(RecordError, match="another peer's key"):
        Heartbeat.parse(raw, run_id=RUN_ID, now=NOW, peer_id=Identity.generate().peer_id)


def test_unknown_role_rejected(identity: Identity) -> None:
    raw = make_heartbeat(identity, roles=["worker", "king"]).sign(identity)
    with pytest.raises(RecordError, match="unknown roles"):
        Heartbeat.parse(raw, run_id=RUN_ID, now=NOW)


def test_too_many_roles_rejected(identity: Identity) -> None:
    raw = make_heartbeat(identity, roles=["worker"] * (len(ROLES) + 1)).sign(identity)
    with pytest.raises(RecordError, match="roles"):
        Heartbeat.parse(raw, run_id=RUN_ID, now=NOW)


def test_unknown_device_kind_rejected(identity: Identity) -> None:
    device = DeviceInfo(kind="tpu", name="x", memory_bytes=1, cpus=1)
    raw = make_heartbeat(identity, device=device).sign(identity)
    with pytest.raises(RecordError, match="device kind 'tpu'"):
        Heartbeat.parse(raw, run_id=RUN_ID, now=NOW)


def test_device_extra_field_rejected(identity: Identity) -> None:
    device = dict(kind="cpu", name="x", memory_bytes=1, cpus=1, backdoor=True)
    with pytest.raises(RecordError, match="unknown fields"):
        Heartbeat.parse(signed_body(identity, device=device), run_id=RUN_ID, now=NOW)


@pytest.mark.parametrize("cpus", [0, 5000, True, 1.5])
def test_device_cpus_checked(identity: Identity, cpus: object) -> None:
    device = dict(kind="cpu", name="x", memory_bytes=1, cpus=cpus)
    with pytest.raises(RecordError, match="cpus"):
        Heartbeat.parse(signed_body(identity, device=device), run_id=RUN_ID, now=NOW)


def test_too_many_addrs_rejected(identity: Identity) -> None:
    raw = make_heartbeat(identity, addrs=[f"/ip4/10.0.0.{i}/tcp/1" for i in range(17)]).sign(identity)
    with pytest.raises(RecordError, match="17 items, over 16"):
        Heartbeat.parse(raw, run_id=RUN_ID, now=NOW)
    raw = make_heartbeat(identity, lan_addrs=[f"/ip4/10.0.0.{i}/tcp/1" for i in range(17)]).sign(identity)
    with pytest.raises(RecordError, match="lan_addrs"):
        Heartbeat.parse(raw, run_id=RUN_ID, now=NOW)


def test_unknown_field_rejected(identity: Identity) -> None:
    with pytest.raises(RecordError, match="unknown fields"):
        Heartbeat.parse(signed_body(identity, extra=1), run_id=RUN_ID, now=NOW)


def test_missing_field_rejected(identity: Identity) -> None:
    body = dataclasses.asdict(make_heartbeat(identity))
    del body["version"]
    with pytest.raises(RecordError, match="missing field 'version'"):
        Heartbeat.parse(sign_record(identity, KIND, body), run_id=RUN_ID, now=NOW)


@pytest.mark.parametrize(
    ("field", "value"),
    [("throughput_gflops", -1), ("uptime_s", "long"), ("leaving", 1), ("issued_at", True)],
)
def test_bad_field_values_rejected(identity: Identity, field: str, value: object) -> None:
    with pytest.raises(RecordError, match=field):
        Heartbeat.parse(signed_body(identity, **{field: value}), run_id=RUN_ID, now=NOW)


def test_oversized_rejected(identity: Identity) -> None:
    hb = make_heartbeat(identity, device=DeviceInfo(kind="cpu", name="x" * 128, memory_bytes=1, cpus=1))
    Heartbeat.parse(hb.sign(identity), run_id=RUN_ID, now=NOW)
    big = signed_body(identity, version="v" * MAX_HEARTBEAT_BYTES)
    with pytest.raises(RecordError, match=f"over the {MAX_HEARTBEAT_BYTES}-byte limit"):
        Heartbeat.parse(big, run_id=RUN_ID, now=NOW)


def test_wrong_record_kind_rejected(identity: Identity) -> None:
    body = dataclasses.asdict(make_heartbeat(identity))
    with pytest.raises(RecordError, match="expected a heartbeat record"):
        Heartbeat.parse(sign_record(identity, "run-spec", body), run_id=RUN_ID, now=NOW)


def test_leaving_round_trips(identity: Identity) -> None:
    hb = make_heartbeat(identity, leaving=True)
    parsed = Heartbeat.parse(hb.sign(identity), run_id=RUN_ID, now=NOW, peer_id=identity.peer_id)
    assert parsed.leaving is True
    assert parsed == hb
    assert not parsed.is_live(NOW)
    assert Heartbeat.parse(make_heartbeat(identity).sign(identity), run_id=RUN_ID, now=NOW).leaving is False


def test_device_name_with_terminal_escapes_rejected(identity: Identity) -> None:
    body = dataclasses.asdict(make_heartbeat(identity))
    body["device"]["name"] = "GPU\x1b]0;owned\x07"
    raw = sign_record(identity, KIND, body)
    with pytest.raises(RecordError, match="control characters"):
        Heartbeat.parse(raw, run_id=body["run_id"], now=body["issued_at"])


def test_join_token_carried_and_absent_when_empty(identity: Identity) -> None:
    with_token = make_heartbeat(identity, join_token="QUJD" * 100)
    assert Heartbeat.parse(with_token.sign(identity), run_id=RUN_ID, now=NOW) == with_token
    # An open run's heartbeat has no such field, so it reads the same to daemons older than it.
    raw = make_heartbeat(identity).sign(identity)
    assert "join_token" not in json.loads(json.loads(raw)["body"])
    assert Heartbeat.parse(raw, run_id=RUN_ID, now=NOW).join_token == ""
    with pytest.raises(RecordError, match=f"'join_token' is {MAX_TOKEN_CHARS + 4} characters, over {MAX_TOKEN_CHARS}"):
        Heartbeat.parse(signed_body(identity, join_token="A" * (MAX_TOKEN_CHARS + 4)), run_id=RUN_ID, now=NOW)
    with pytest.raises(RecordError, match="'join_token' has type list"):
        Heartbeat.parse(signed_body(identity, join_token=["x"]), run_id=RUN_ID, now=NOW)
    with pytest.raises(RecordError, match="cannot sign the heartbeat"):
        make_heartbeat(identity).sign(Identity.generate())


def test_heartbeat_with_the_largest_token_fits(identity: Identity) -> None:
    raw = make_heartbeat(identity, join_token="A" * MAX_TOKEN_CHARS).sign(identity)
    assert len(raw) < MAX_HEARTBEAT_BYTES


def test_holds_carried_and_absent_when_empty(identity: Identity) -> None:
    holding = make_heartbeat(identity, holds=["dataset", "init"])
    assert Heartbeat.parse(holding.sign(identity), run_id=RUN_ID, now=NOW) == holding
    # A peer that holds none of the run's files signs what daemons from before files signed.
    raw = make_heartbeat(identity).sign(identity)
    assert "holds" not in json.loads(json.loads(raw)["body"])
    assert Heartbeat.parse(raw, run_id=RUN_ID, now=NOW).holds == []
    with pytest.raises(RecordError, match=r"holds \['weights'\], not any of"):
        Heartbeat.parse(signed_body(identity, holds=["weights"]), run_id=RUN_ID, now=NOW)
    with pytest.raises(RecordError, match="'holds' has 4 items, over 3"):
        Heartbeat.parse(signed_body(identity, holds=["dataset"] * 4), run_id=RUN_ID, now=NOW)


def test_held_out_score_carried_and_checked(identity: Identity) -> None:
    scoring = make_heartbeat(identity, held_out=HeldOut(version=120, loss=2.25))
    assert Heartbeat.parse(scoring.sign(identity), run_id=RUN_ID, now=NOW) == scoring
    assert "held_out" not in json.loads(json.loads(make_heartbeat(identity).sign(identity))["body"])
    with pytest.raises(RecordError, match="'loss' = -1.0 is outside"):
        Heartbeat.parse(signed_body(identity, held_out={"version": 1, "loss": -1.0}), run_id=RUN_ID, now=NOW)
    with pytest.raises(RecordError, match="unknown fields"):
        Heartbeat.parse(signed_body(identity, held_out={"version": 1, "loss": 1.0, "x": 1}), run_id=RUN_ID, now=NOW)


def test_the_probes_figures_are_carried_and_absent_before_a_measurement(identity: Identity) -> None:
    probed = make_heartbeat(identity, throughput_gflops=412_000.0, free_memory_bytes=75 * 2**30, precision="bf16")
    assert Heartbeat.parse(probed.sign(identity), run_id=RUN_ID, now=NOW) == probed
    # Not measured: the body is what daemons from before the probe's fields signed and read.
    raw = make_heartbeat(identity, throughput_gflops=0.0).sign(identity)
    body = json.loads(json.loads(raw)["body"])
    assert "free_memory_bytes" not in body and "precision" not in body
    parsed = Heartbeat.parse(raw, run_id=RUN_ID, now=NOW)
    assert parsed.free_memory_bytes == 0 and parsed.precision == "" and parsed.throughput_gflops == 0.0
    with pytest.raises(RecordError, match=r"computes in 'fp16', not one of \('bf16', 'fp32'\)"):
        Heartbeat.parse(signed_body(identity, precision="fp16"), run_id=RUN_ID, now=NOW)
    with pytest.raises(RecordError, match="'free_memory_bytes' = -1 is outside"):
        Heartbeat.parse(signed_body(identity, free_memory_bytes=-1), run_id=RUN_ID, now=NOW)
    with pytest.raises(RecordError, match="'free_memory_bytes' has type float"):
        Heartbeat.parse(signed_body(identity, free_memory_bytes=1.5), run_id=RUN_ID, now=NOW)
