"""peers/records/plan_parts.py: a plan of any size as a small signed manifest and parts under
their digests, every value within PART_BYTES, every part checked before its plan is read."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import zlib

import pytest

from swarmd.errors import RecordError
from swarmd.peers.records import plan_parts
from swarmd.peers.records.identity import Identity, peer_id_from_public_key
from swarmd.peers.records.plan_parts import PART_BYTES, PlanManifest, open_bundle, open_part
from swarmd.peers.records.plan_record import PlanRecord
from swarmd.peers.records.run_spec import derive_run_id

pytestmark = pytest.mark.timeout(60)

T0 = 1_800_000_000.0
A, B = Identity.generate(), Identity.generate()
RUN = derive_run_id("parts", A.public_key)
OTHER_RUN = derive_run_id("other", A.public_key)


def peer_ids(n: int, seed: int = 0) -> list[str]:
    """``n`` peer IDs, the same for one seed (where parts are cut depends on them)."""
    keys = (hashlib.sha256(f"{seed}/{i}".encode()).digest() for i in range(n))
    return sorted(peer_id_from_public_key(key) for key in keys)


def grid_plan(devices: list[str], stages: int = 8, run_id: str = RUN) -> PlanRecord:
    """A plan of every device in pipelines of ``stages`` (the shape the planner gives a big swarm)."""
    pipes = len(devices) // stages
    return PlanRecord(
        run_id=run_id,
        peer_id=A.peer_id,
        issued_at=T0,
        expires_at=T0 + 300,
        version=7,
        kind="full",
        devices=devices,
        pipelines=[list(range(p * stages, (p + 1) * stages)) for p in range(pipes)],
        layers_per_stage=[3] * stages,
        parameter_servers=list(range(stages)),
        relays=list(range(0, len(devices), 97)),
        predicted={"tokens_per_s": 1234.5},
        shard_servers=[list(range(s, s + 2 * stages, stages)) for s in range(stages)],
        spares=list(range(pipes * stages, len(devices))),
    )


def manifest_of(raw: bytes) -> PlanManifest:
    return PlanManifest.parse(open_bundle(raw).manifest, run_id=RUN, now=None)


@pytest.mark.parametrize("n", [16, 1000, 10_000])
def test_a_plan_round_trips_and_no_value_exceeds_a_part(n: int) -> None:
    plan = grid_plan(peer_ids(n))
    raw = plan.sign(A)
    bundle = open_bundle(raw)
    assert PlanRecord.parse(raw, run_id=RUN, now=T0, peer_id=A.peer_id) == plan
    assert max(len(v) for v in [bundle.manifest, *bundle.parts.values()]) <= PART_BYTES
    manifest = manifest_of(raw)
    if n == 16:  # small: the whole plan inline, nothing to fetch
        assert manifest.inline and not bundle.parts
    else:
        assert not manifest.inline and set(manifest.digests()) == set(bundle.parts)
        assert PlanRecord.from_parts(manifest, bundle.parts) == plan


def test_a_join_changes_one_device_part_and_a_new_expiry_none() -> None:
    devices = peer_ids(3000)
    before = manifest_of(grid_plan(devices).sign(A))
    renewed = manifest_of(dataclasses.replace(grid_plan(devices), issued_at=T0 + 60, expires_at=T0 + 360).sign(A))
    assert renewed.digests() == before.digests()  # re-published unchanged: every part cached
    joined = manifest_of(grid_plan(sorted([*devices, *peer_ids(1, seed=1)])).sign(A))
    changed = set(d for d, _ in joined.devices) - set(d for d, _ in before.devices)
    # The part the newcomer lands in, and the next where a cut forced by size shifts (a handful
    # where whole-stream compression would change every one of the two dozen).
    assert 1 <= len(changed) <= 3 and len(before.devices) >= 16


def test_the_largest_manifest_fits_one_part() -> None:
    digest = "ab" * 32
    parts = [(f"{i:064x}", PART_BYTES) for i in range(plan_parts.MAX_PLAN_PARTS)]
    head = dict(run_id=RUN, peer_id=A.peer_id, issued_at=T0, expires_at=T0 + 300)
    big = PlanManifest(**head, version=2**53, size=plan_parts.MAX_PLAN_BYTES, devices=parts[:-1], roles=parts[-1:])
    assert len(big.sign(A)) <= PART_BYTES
    inline = "A" * (4 * -(-plan_parts.INLINE_BYTES // 3))
    assert len(PlanManifest(**head, version=2**53, size=1, inline=inline).sign(A)) <= PART_BYTES
    with pytest.raises(RecordError, match="not both"):
        PlanManifest.parse(
            PlanManifest(**head, version=1, size=1, inline="eA==", roles=[(digest, 9)]).sign(A), run_id=RUN, now=T0
        )
    too_many = [(f"{i:064x}", 9) for i in range(plan_parts.MAX_PLAN_PARTS + 1)]
    with pytest.raises(RecordError, match="over"):
        PlanManifest.parse(
            PlanManifest(**head, version=1, size=1, devices=too_many[:1], roles=too_many[1:]).sign(A),
            run_id=RUN,
            now=T0,
        )


def tampered(raw: bytes, change: dict[str, object], parts: dict[str, bytes] | None = None) -> bytes:
    """``raw``'s bundle with its manifest's fields changed and signed again (by A), and ``parts``
    in place of its own when given."""
    bundle = open_bundle(raw)
    manifest = dataclasses.replace(manifest_of(raw), **change)  # type: ignore[arg-type]
    return plan_parts.pack_bundle(manifest.sign(A), bundle.parts if parts is None else parts)


def test_parts_are_checked_against_the_signed_manifest() -> None:
    raw = grid_plan(peer_ids(1000)).sign(A)
    bundle, manifest = open_bundle(raw), manifest_of(raw)
    first = manifest.devices[0][0]
    with pytest.raises(RecordError, match="missing"):
        PlanRecord.from_parts(manifest, {d: v for d, v in bundle.parts.items() if d != first})
    forged = plan_parts.make_part(RUN, zlib.compress(b'["12D3KooWmallory"]'))
    with pytest.raises(RecordError, match="SHA-256"):
        PlanRecord.from_parts(manifest, {**bundle.parts, first: forged})
    elsewhere = plan_parts.make_part(OTHER_RUN, zlib.compress(b'["x"]'))
    digest = plan_parts.part_digest(elsewhere)
    devices = [(digest, len(elsewhere)), *manifest.devices[1:]]
    with pytest.raises(RecordError, match="for run"):
        PlanRecord.parse(tampered(raw, {"devices": devices}, {**bundle.parts, digest: elsewhere}), run_id=RUN, now=T0)
    with pytest.raises(RecordError, match="signed by|bad signature"):
        manifest_raw = open_bundle(tampered(raw, {})).manifest
        PlanManifest.parse(manifest_raw.replace(b'\\"version\\":7', b'\\"version\\":8'), run_id=RUN, now=T0)


def test_a_decompression_bomb_stops_at_the_signed_size() -> None:
    bomb = zlib.compress(b"[" + b" " * (8 << 20) + b"]", 9)  # 8 MiB of JSON in a few KiB
    assert len(bomb) < PART_BYTES // 2
    raw = grid_plan(peer_ids(16)).sign(A)
    inline = base64.b64encode(bomb).decode()
    with pytest.raises(RecordError, match="decompresses past"):
        PlanRecord.parse(tampered(raw, {"inline": inline, "size": plan_parts.MAX_PLAN_BYTES}), run_id=RUN, now=T0)
    raw = grid_plan(peer_ids(1000)).sign(A)
    manifest = manifest_of(raw)
    value = plan_parts.make_part(RUN, bomb)
    digest = plan_parts.part_digest(value)
    parts = {**open_bundle(raw).parts, digest: value}
    with pytest.raises(RecordError, match="decompresses past"):
        PlanRecord.parse(tampered(raw, {"roles": [(digest, len(value))]}, parts), run_id=RUN, now=T0)
    with pytest.raises(RecordError, match="bytes, not"):  # a size that undersells nothing: exact only
        PlanRecord.parse(tampered(raw, {"size": manifest.size + 1}), run_id=RUN, now=T0)


def test_parts_and_bundles_are_bounded_before_they_are_read() -> None:
    with pytest.raises(RecordError, match="over the"):
        open_part(plan_parts.make_part(RUN, b"x" * PART_BYTES))
    with pytest.raises(RecordError, match="part marker"):
        open_part(b"anything")
    with pytest.raises(RecordError, match="no valid run"):
        open_part(plan_parts.make_part("not-a-run", b"x"))
    assert open_part(plan_parts.make_part(RUN, b"xyz")) == (RUN, b"xyz")
    with pytest.raises(RecordError, match="plan bundle"):
        open_bundle(b"{}")
    raw = grid_plan(peer_ids(1000)).sign(A)
    with pytest.raises(RecordError, match="cut short"):
        open_bundle(raw[:-1])
    with pytest.raises(RecordError, match="over the"):
        open_bundle(raw + bytes(plan_parts.MAX_BUNDLE_BYTES))
    with pytest.raises(RecordError, match="key of"):
        grid_plan(peer_ids(16)).sign(B)
