"""SwarmRecordValidator (peers/dht/swarm_dht.py) on DHT records built by hand.

hivemind and py-libp2p register clashing protobuf symbols (both define ``crypto.pb.KeyType``),
so they cannot be imported into one process; py-libp2p is imported by other unit tests (LAN
discovery, peer IDs). The validator therefore runs in one helper interpreter for this module
(a plain Python child on stdin/stdout: no daemon, no network), while the records are built
here. The helper builds the DHT key, subkey and value exactly as hivemind does:
key = ``DHTID.generate(source=members_key(run_id, bucket)).to_bytes()``, subkey and value
through ``MSGPackSerializer.dumps``. Key names: ``members`` is the bucket of the subkey's peer
in the test's run, ``members:RUN`` the same in another run, ``members/N`` bucket N.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from swarmd.models.presets import DEFAULT_RUN
from swarmd.peers.records.envelope import sign_record
from swarmd.peers.records.heartbeat import KIND as HEARTBEAT_KIND
from swarmd.peers.records.heartbeat import DeviceInfo, Heartbeat
from swarmd.peers.records.identity import Identity
from swarmd.peers.records.plan_parts import open_bundle
from swarmd.peers.records.run_spec import derive_run_id, parse_spec_body, sign_run_spec

pytestmark = pytest.mark.timeout(30)

SPEC_TTL_S = 3600.0  # swarm_dht.SPEC_TTL_S (not imported here: it would load hivemind)
EXPIRY_SLACK_S = 30.0

# Reads one JSON request per line and answers {"ok": bool} or {"error": str}.
_WORKER = r"""
import base64, json, sys
from hivemind.dht.routing import DHTID
from hivemind.dht.validation import DHTRecord
from hivemind.utils.serializer import MSGPackSerializer
from swarmd.peers.dht.swarm_dht import MEMBER_BUCKETS, SwarmRecordValidator, member_bucket, members_key, spec_key

validators = {}
print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    try:
        req = json.loads(line)
        run_id = req["run_id"]
        validator = validators.setdefault(run_id, SwarmRecordValidator())
        name, sub = req["key"]["name"], req["subkey"]
        peer = sub.get("obj") if isinstance(sub.get("obj"), str) else ""
        if name == "members" or name.startswith("members:"):
            source = members_key(name.partition(":")[2] or run_id, member_bucket(peer))
        elif name.startswith("members/"):
            source = members_key(run_id, int(name.split("/")[1]) % MEMBER_BUCKETS)
        else:
            source = {"spec": spec_key(run_id)}.get(name, name)
        if "raw" in sub:
            subkey = base64.b64decode(sub["raw"])
        else:
            subkey = MSGPackSerializer.dumps(sub["obj"])
        val = req["value"]
        if "raw" in val:
            value = base64.b64decode(val["raw"])
        elif "bytes" in val:
            value = MSGPackSerializer.dumps(base64.b64decode(val["bytes"]))
        else:
            value = MSGPackSerializer.dumps(val["obj"])
        record = DHTRecord(DHTID.generate(source=source).to_bytes(), subkey, value, req["expiration"])
        answer = {"ok": validator.validate(record)}
    except Exception as e:
        answer = {"error": repr(e)}
    print(json.dumps(answer), flush=True)
"""


class Validator:
    """The helper interpreter, one request at a time."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _WORKER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        first = self.proc.stdout.readline()
        if not first:
            raise RuntimeError(f"validator helper failed to start: {self.proc.stderr.read()[-3000:]}")  # type: ignore[union-attr]
        assert json.loads(first) == {"ready": True}

    def __call__(
        self,
        run_id: str,
        *,
        value: bytes | None = None,
        expiration: float,
        key: str = "members",
        subkey: object = None,
        raw_subkey: bytes | None = None,
        raw_value: bytes | None = None,
        value_obj: object = None,
    ) -> bool:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        sub = {"raw": base64.b64encode(raw_subkey).decode()} if raw_subkey is not None else {"obj": subkey}
        if raw_value is not None:
            val: dict[str, Any] = {"raw": base64.b64encode(raw_value).decode()}
        elif value is not None:
            val = {"bytes": base64.b64encode(value).decode()}
        else:
            val = {"obj": value_obj}
        request = {
            "run_id": run_id,
            "key": {"name": key},
            "subkey": sub,
            "value": val,
            "expiration": expiration,
        }
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        answer = json.loads(self.proc.stdout.readline())
        assert "error" not in answer, answer["error"]
        return bool(answer["ok"])

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)


@pytest.fixture(scope="module")
def validate() -> Iterator[Validator]:
    v = Validator()
    try:
        yield v
    finally:
        v.close()


@pytest.fixture(scope="module")
def creator() -> Identity:
    return Identity.generate()


@pytest.fixture(scope="module")
def run_id(creator: Identity) -> str:
    return derive_run_id(DEFAULT_RUN["name"], creator.public_key)


@pytest.fixture(scope="module")
def member() -> Identity:
    return Identity.generate()


def heartbeat(identity: Identity, run_id: str, ttl: float = 60.0, **kw: Any) -> Heartbeat:
    now = time.time()
    fields: dict[str, Any] = dict(
        run_id=run_id,
        peer_id=identity.peer_id,
        issued_at=now,
        expires_at=now + ttl,
        addrs=["/ip4/127.0.0.1/tcp/31337"],
        device=DeviceInfo(kind="cpu", name="cpu", memory_bytes=2**30, cpus=2),
        throughput_gflops=1.0,
        version="0.1.0",
        roles=["worker"],
        uptime_s=1.0,
    )
    fields.update(kw)
    return Heartbeat(**fields)


def test_valid_heartbeat_accepted(validate: Validator, run_id: str, member: Identity) -> None:
    hb = heartbeat(member, run_id)
    assert validate(run_id, value=hb.sign(member), subkey=member.peer_id, expiration=hb.expires_at)
    assert validate(run_id, value=hb.sign(member), subkey=member.peer_id, expiration=hb.expires_at - 10)


def test_leaving_heartbeat_accepted(validate: Validator, run_id: str, member: Identity) -> None:
    # The last heartbeat of a leaving peer must spread, so that others drop it at once.
    hb = heartbeat(member, run_id, leaving=True)
    assert validate(run_id, value=hb.sign(member), subkey=member.peer_id, expiration=hb.expires_at)


def test_expiration_far_beyond_heartbeat_rejected(validate: Validator, run_id: str, member: Identity) -> None:
    hb = heartbeat(member, run_id)
    raw = hb.sign(member)
    assert not validate(run_id, value=raw, subkey=member.peer_id, expiration=hb.expires_at + 1)
    assert not validate(run_id, value=raw, subkey=member.peer_id, expiration=hb.expires_at + 86400)


def test_expired_heartbeat_left_to_the_reader(validate: Validator, run_id: str, member: Identity) -> None:
    # hivemind discards a whole member list when one record in it fails validation, so the
    # validator leaves the clock to the reader (and to the DHT's own expiration time): one
    # record that expired in flight must not hide every other member.
    old = heartbeat(member, run_id, issued_at=time.time() - 120, expires_at=time.time() - 60)
    assert validate(run_id, value=old.sign(member), subkey=member.peer_id, expiration=old.expires_at)
    assert not validate(run_id, value=old.sign(member), subkey=member.peer_id, expiration=time.time() + 60)


def test_heartbeat_of_another_run_rejected(validate: Validator, run_id: str, member: Identity) -> None:
    other_run = derive_run_id("other-run", member.public_key)
    hb = heartbeat(member, other_run)
    assert not validate(run_id, value=hb.sign(member), subkey=member.peer_id, expiration=hb.expires_at)
    # Under the key of its own run it is stored: a DHT shared by several runs serves them all
    # (readers still see only their own run).
    assert validate(
        run_id,
        key=f"members:{other_run}",
        value=hb.sign(member),
        subkey=member.peer_id,
        expiration=hb.expires_at,
    )


def test_heartbeat_in_another_bucket_rejected(validate: Validator, run_id: str, member: Identity) -> None:
    # Each peer's heartbeat has one bucket (a hash of its ID): a flood cannot pile into one
    # a reader must take whole, nor push another peer's bucket past its read bound with beats
    # that are not of that bucket.
    hb = heartbeat(member, run_id)
    ok = dict(value=hb.sign(member), subkey=member.peer_id, expiration=hb.expires_at)
    assert validate(run_id, key="members", **ok)
    accepted = [validate(run_id, key=f"members/{b}", **ok) for b in range(16)]
    assert sum(accepted) == 1, accepted


@pytest.mark.parametrize("key", ["some-other-key", "swarmd/x/members", "spec-not-members"])
def test_foreign_key_rejected(validate: Validator, run_id: str, member: Identity, key: str) -> None:
    hb = heartbeat(member, run_id)
    assert not validate(run_id, key=key, value=hb.sign(member), subkey=member.peer_id, expiration=hb.expires_at)


@pytest.mark.parametrize("raw_value", [b"\xc1", b"", b"\xc4\x10short", b"\x92\x01"])
def test_garbled_value_rejected(validate: Validator, run_id: str, member: Identity, raw_value: bytes) -> None:
    expiration = time.time() + 60
    assert not validate(run_id, raw_value=raw_value, subkey=member.peer_id, expiration=expiration)


@pytest.mark.parametrize("value_obj", [None, 5, "text", [1, 2], {"a": 1}])
def test_value_not_bytes_rejected(validate: Validator, run_id: str, member: Identity, value_obj: object) -> None:
    assert not validate(run_id, value_obj=value_obj, subkey=member.peer_id, expiration=time.time() + 60)


def test_value_is_not_a_record_rejected(validate: Validator, run_id: str, member: Identity) -> None:
    assert not validate(run_id, value=b"not a record", subkey=member.peer_id, expiration=time.time() + 60)


def test_subkey_mismatch_rejected(validate: Validator, run_id: str, member: Identity) -> None:
    hb = heartbeat(member, run_id)
    raw = hb.sign(member)
    other = Identity.generate()
    assert not validate(run_id, value=raw, subkey=other.peer_id, expiration=hb.expires_at)
    # Subkeys that are not peer-ID strings: a plain value (None), bytes, an int, garbled msgpack.
    assert not validate(run_id, value=raw, subkey=None, expiration=hb.expires_at)
    assert not validate(run_id, value=raw, subkey=7, expiration=hb.expires_at)
    assert not validate(run_id, value=raw, raw_subkey=b"\xc4\x05" + b"abcde", expiration=hb.expires_at)
    assert not validate(run_id, value=raw, raw_subkey=b"\xc1", expiration=hb.expires_at)


def test_heartbeat_claiming_another_peer_rejected(validate: Validator, run_id: str, member: Identity) -> None:
    victim = Identity.generate()
    body = dataclasses.asdict(heartbeat(victim, run_id))
    raw = sign_record(member, HEARTBEAT_KIND, body)  # signed by member, claims to be victim
    for subkey in (victim.peer_id, member.peer_id):
        assert not validate(run_id, value=raw, subkey=subkey, expiration=body["expires_at"])


def test_spec_valid_accepted(validate: Validator, run_id: str, creator: Identity) -> None:
    signed = sign_run_spec(creator, parse_spec_body(dict(DEFAULT_RUN)))
    assert signed.run_id == run_id
    assert validate(run_id, key="spec", value=signed.raw, expiration=time.time() + SPEC_TTL_S)


def test_spec_expiration_too_far_rejected(validate: Validator, run_id: str, creator: Identity) -> None:
    signed = sign_run_spec(creator, parse_spec_body(dict(DEFAULT_RUN)))
    expiration = time.time() + SPEC_TTL_S + EXPIRY_SLACK_S + 60
    assert not validate(run_id, key="spec", value=signed.raw, expiration=expiration)


def test_spec_impostor_rejected(validate: Validator, run_id: str) -> None:
    impostor = Identity.generate()
    forged = sign_run_spec(impostor, parse_spec_body(dict(DEFAULT_RUN, stages=4)))
    assert forged.spec.name == DEFAULT_RUN["name"]
    assert not validate(run_id, key="spec", value=forged.raw, expiration=time.time() + 60)


def test_spec_of_another_run_rejected(validate: Validator, run_id: str, creator: Identity) -> None:
    other = sign_run_spec(creator, parse_spec_body(dict(DEFAULT_RUN, name="other-run")))
    assert not validate(run_id, key="spec", value=other.raw, expiration=time.time() + 60)


def test_heartbeat_under_spec_key_rejected(validate: Validator, run_id: str, member: Identity) -> None:
    hb = heartbeat(member, run_id)
    assert not validate(run_id, key="spec", value=hb.sign(member), expiration=hb.expires_at)


def test_spec_under_a_subkey_rejected(validate: Validator, run_id: str, creator: Identity) -> None:
    signed = sign_run_spec(creator, parse_spec_body(dict(DEFAULT_RUN)))
    assert not validate(run_id, key="spec", value=signed.raw, subkey="x", expiration=time.time() + 60)


def test_links_and_plan_records_under_their_own_keys_only(validate: Validator, run_id: str, member: Identity) -> None:
    from swarmd.peers.records.links import LinkEstimate, make_record
    from swarmd.peers.records.plan_record import PlanRecord

    now = time.time()
    links = make_record(run_id, member.peer_id, now, 60, 5.0, 8.0, {"QmOther": LinkEstimate(0.01, 1e6, now, 1)})
    raw = links.sign(member)
    ok = dict(value=raw, subkey=member.peer_id, expiration=links.expires_at)
    assert validate(run_id, key=f"swarmd/{run_id}/links", **ok)
    assert not validate(run_id, key=f"swarmd/{run_id}/plan", **ok)
    assert not validate(run_id, key="members", **ok)
    assert not validate(run_id, key=f"swarmd/{run_id}/links", value=raw, subkey="QmOther", expiration=links.expires_at)
    plan = PlanRecord(
        run_id=run_id,
        peer_id=member.peer_id,
        issued_at=now,
        expires_at=now + 60,
        version=1,
        kind="full",
        devices=[member.peer_id],
        pipelines=[[0]],
        layers_per_stage=[4],
        parameter_servers=[0],
    )
    bundle = plan.sign(member)
    raw = open_bundle(bundle).manifest
    assert validate(run_id, key=f"swarmd/{run_id}/plan", value=raw, subkey=member.peer_id, expiration=now + 60)
    assert not validate(run_id, key=f"swarmd/{run_id}/plan", value=raw, subkey=member.peer_id, expiration=now + 600)
    assert not validate(run_id, key=f"swarmd/{run_id}/links", value=raw, subkey=member.peer_id, expiration=now + 60)
    # The bundle is what the publisher splits; the old one-record form is no manifest.
    assert not validate(run_id, key=f"swarmd/{run_id}/plan", value=bundle, subkey=member.peer_id, expiration=now + 60)
    whole = sign_record(member, "plan", dataclasses.asdict(plan))
    assert not validate(run_id, key=f"swarmd/{run_id}/plan", value=whole, subkey=member.peer_id, expiration=now + 60)


def test_a_plan_part_only_under_the_digest_of_its_bytes(validate: Validator, run_id: str, member: Identity) -> None:
    from swarmd.peers.records.plan_parts import make_part, part_digest

    now = time.time()
    part = make_part(run_id, b"compressed plan bytes")
    key = f"swarmd/{run_id}/plan-part/{part_digest(part)}"
    assert validate(run_id, key=key, value=part, expiration=now + 300)
    assert not validate(run_id, key=key, value=part, expiration=now + 3600)  # past a plan's longest life
    assert not validate(run_id, key=key, value=part + b"!", expiration=now + 300)  # not its digest
    assert not validate(run_id, key=key, value=part, subkey=member.peer_id, expiration=now + 300)
    other = derive_run_id("another", member.public_key)
    assert not validate(run_id, key=key, value=make_part(other, b"compressed plan bytes"), expiration=now + 300)
    huge = make_part(run_id, bytes(16 * 1024))
    assert not validate(run_id, key=f"swarmd/{run_id}/plan-part/{part_digest(huge)}", value=huge, expiration=now + 60)


def test_pool_leases_under_their_own_pipeline_or_stage_key_only(
    validate: Validator, run_id: str, member: Identity
) -> None:
    from swarmd.peers.taskpool.cells import CellLease
    from swarmd.peers.taskpool.servers import ShardLease

    now = time.time()
    cell = CellLease(
        run_id=run_id, pipeline=2, stage=1, peer_id=member.peer_id, claimed_at=now, issued_at=now, expires_at=now + 30
    )
    shard = ShardLease(
        run_id=run_id,
        stage=1,
        shard=0,
        shards=2,
        peer_id=member.peer_id,
        claimed_at=now,
        issued_at=now,
        expires_at=now + 30,
        version=7,
    )
    for lease, right, wrong in [(cell, "cells/2/1", "cells/2/0"), (shard, "shards/1", "shards/0")]:
        raw = lease.sign(member)
        ok = dict(value=raw, subkey=member.peer_id, expiration=lease.expires_at)
        assert validate(run_id, key=f"swarmd/{run_id}/{right}", **ok)
        assert not validate(run_id, key=f"swarmd/{run_id}/{wrong}", **ok)
        assert not validate(
            run_id, key=f"swarmd/{run_id}/{right}", value=raw, subkey="someone-else", expiration=lease.expires_at
        )
        assert not validate(
            run_id, key=f"swarmd/{run_id}/{right}", value=raw, subkey=member.peer_id, expiration=lease.expires_at + 60
        )
