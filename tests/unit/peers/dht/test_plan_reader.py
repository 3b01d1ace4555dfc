"""peers/dht/plan_reader.py and peers/dht/keys.py: plans joined from manifests and parts
fetched by digest, with the cache, the per-scan budget and the retry delay, over a dict
standing in for the DHT (no hivemind here)."""

from __future__ import annotations

import asyncio
import os

import pytest

from swarmd.peers.dht import plan_reader
from swarmd.peers.dht.keys import plan_key, plan_part_key
from swarmd.peers.dht.plan_reader import PlanReader
from swarmd.peers.records.identity import Identity, peer_id_from_public_key
from swarmd.peers.records.plan_parts import PlanManifest, make_part, open_bundle
from swarmd.peers.records.plan_record import PlanRecord
from swarmd.peers.records.run_spec import derive_run_id

pytestmark = pytest.mark.timeout(60)

T0 = 1_800_000_000.0
A, B, C = Identity.generate(), Identity.generate(), Identity.generate()
RUN = derive_run_id("reader", A.public_key)


class Store:
    """The DHT's plain values by key; counts the gets."""

    def __init__(self) -> None:
        self.values: dict[str, bytes] = {}
        self.gets = 0

    async def get(self, key: str) -> bytes | None:
        self.gets += 1
        await asyncio.sleep(0)  # let the other fetches of a batch start, as the DHT's would
        return self.values.get(key)

    def publish(self, plan: PlanRecord, who: Identity) -> PlanManifest:
        """What ``SwarmDHT`` stores of a plan: its parts under their digests; the manifest back."""
        bundle = open_bundle(plan.sign(who))
        for digest, value in bundle.parts.items():
            self.values[plan_part_key(RUN, digest)] = value
        return PlanManifest.parse(bundle.manifest, run_id=RUN, now=None, peer_id=who.peer_id)


def big_plan(who: Identity, n: int = 1000, version: int = 1) -> PlanRecord:
    devices = sorted(peer_id_from_public_key(os.urandom(32)) for _ in range(n))
    return PlanRecord(
        run_id=RUN,
        peer_id=who.peer_id,
        issued_at=T0,
        expires_at=T0 + 300,
        version=version,
        kind="full",
        devices=devices,
        pipelines=[list(range(p * 4, p * 4 + 4)) for p in range(n // 4)],
        layers_per_stage=[2, 2, 2, 2],
        parameter_servers=[0, 1, 2, 3],
    )


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_keys_are_per_run_and_parts_per_digest() -> None:
    assert plan_key(RUN) == f"swarmd/{RUN}/plan"
    assert plan_part_key(RUN, "ab" * 32) == f"swarmd/{RUN}/plan-part/{'ab' * 32}"


def test_parts_are_fetched_once_then_served_from_the_cache() -> None:
    store = Store()
    plan = big_plan(A)
    manifest = store.publish(plan, A)
    reader = PlanReader(RUN, store.get)
    assert asyncio.run(reader.assemble([manifest], {A.peer_id})) == [plan]
    assert store.gets == len(manifest.digests()) > 1
    assert asyncio.run(reader.assemble([manifest], {A.peer_id})) == [plan]
    assert store.gets == len(manifest.digests())  # nothing fetched again
    own = PlanReader(RUN, store.get)
    own.remember(open_bundle(plan.sign(A)).parts)  # the coordinator's own plan: never fetched
    assert asyncio.run(own.assemble([manifest], set())) == [plan] and own.fetched == 0


def test_a_missing_part_waits_before_it_is_asked_for_again() -> None:
    store, clock = Store(), Clock()
    manifest = store.publish(big_plan(A), A)
    lost = plan_part_key(RUN, manifest.devices[0][0])
    kept = store.values.pop(lost)
    reader = PlanReader(RUN, store.get, clock)
    assert asyncio.run(reader.assemble([manifest], {A.peer_id})) == []
    gets = store.gets
    store.values[lost] = kept
    assert asyncio.run(reader.assemble([manifest], {A.peer_id})) == [] and store.gets == gets
    clock.now += plan_reader.MISSING_RETRY_S + 1
    assert len(asyncio.run(reader.assemble([manifest], {A.peer_id}))) == 1 and store.gets == gets + 1


def test_a_forged_part_under_a_digest_is_refused_and_not_cached() -> None:
    store = Store()
    manifest = store.publish(big_plan(A), A)
    store.values[plan_part_key(RUN, manifest.roles[0][0])] = make_part(RUN, b"forged")
    reader = PlanReader(RUN, store.get)
    assert asyncio.run(reader.assemble([manifest], {A.peer_id})) == []
    assert manifest.roles[0][0] not in reader._parts


def test_one_scan_fetches_within_its_budget_members_first(monkeypatch: pytest.MonkeyPatch) -> None:
    store = Store()
    member = store.publish(big_plan(A, version=5), A)
    strangers = [store.publish(big_plan(who, version=2**40), who) for who in (B, C)]
    monkeypatch.setattr(plan_reader, "MAX_FETCHES_PER_SCAN", len(member.digests()))
    reader = PlanReader(RUN, store.get)
    plans = asyncio.run(reader.assemble([*strangers, member], {A.peer_id}))
    assert [p.peer_id for p in plans] == [A.peer_id]  # the strangers' far bigger versions wait
    assert store.gets == len(member.digests())
    # The next scan: room for the larger stranger's parts, never both (their sum is more).
    monkeypatch.setattr(plan_reader, "MAX_FETCHES_PER_SCAN", max(len(s.digests()) for s in strangers))
    later = asyncio.run(reader.assemble([*strangers, member], {A.peer_id}))
    assert len(later) == 2 and later[0].peer_id == A.peer_id
