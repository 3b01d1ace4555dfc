"""One run's records in the hivemind DHT, behind typed functions.

The DHT runs in its own process, as hivemind does it; this module is the only place that
knows how values are laid out under the keys (``swarmd.peers.dht.keys``). Every record is
checked twice: by the DHT process's validator before it stores or returns it, and again by
the reader here, which also applies the run and the clock. A plan is a signed manifest under
the plan key and parts under their own digests (``swarmd.peers.records.plan_parts``): stored
parts first, read back through ``swarmd.peers.dht.plan_reader``.

This node stores swarmd records of any run, each checked in full (signature, schema, and the
key its content implies), and nothing else: a DHT shared by many runs works for all of them,
while a daemon never spends memory or trust on data it cannot check.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import logging
import os
import signal
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

from hivemind.dht.routing import DHTID
from hivemind.dht.validation import DHTRecord, RecordValidatorBase
from hivemind.utils.serializer import MSGPackSerializer
from hivemind.utils.timed_storage import get_dht_time

from swarmd.errors import BootstrapError, JoinError, RecordError, RunSpecError
from swarmd.peers.dht import in_process
from swarmd.peers.dht.keys import (
    MEMBER_BUCKETS,
    cells_key,
    links_key,
    member_bucket,
    members_key,
    observations_key,
    plan_key,
    plan_part_key,
    shards_key,
    spec_key,
)
from swarmd.peers.dht.plan_reader import PlanReader
from swarmd.peers.dht.process import MAX_REQUEST_BYTES, TiedDHT
from swarmd.peers.membership.reliability import KIND as OBSERVATIONS_KIND
from swarmd.peers.membership.reliability import Observations
from swarmd.peers.records.envelope import peek_kind
from swarmd.peers.records.heartbeat import MAX_ADDRS, Heartbeat
from swarmd.peers.records.links import KIND as LINKS_KIND
from swarmd.peers.records.links import LinksRecord
from swarmd.peers.records.plan_parts import KIND as PLAN_KIND
from swarmd.peers.records.plan_parts import MAX_TTL_S as PLAN_MAX_TTL_S
from swarmd.peers.records.plan_parts import PlanManifest, is_part, open_bundle, open_part
from swarmd.peers.records.run_spec import SignedRunSpec, open_run_spec, verify_run_spec
from swarmd.peers.taskpool.cells import KIND as CELL_KIND
from swarmd.peers.taskpool.cells import CellLease
from swarmd.peers.taskpool.lease import Lease
from swarmd.peers.taskpool.servers import KIND as SHARD_KIND
from swarmd.peers.taskpool.servers import ShardLease

logger = logging.getLogger(__name__)

# A spec lives this long in the DHT unless a member re-publishes it; members do so far sooner.
SPEC_TTL_S = 3600.0
# A spec's DHT expiration may run this far past our clock's now + SPEC_TTL_S (clock skew).
_EXPIRY_SLACK_S = 30.0


MEMBERS_PER_BUCKET = 128
"""The most heartbeats one read of a bucket brings out of the DHT process and checks (a Sybil
flood costs a scan at most ``MEMBER_BUCKETS * MEMBERS_PER_BUCKET`` signature checks)."""
KNOWN_PER_BUCKET = 96
"""Of those, the most taken from members already known; the rest is a random draw of the
others, so that a bucket crowded by Sybils neither hides the members nor shuts out joiners."""
MAX_RECORDS_PER_READ = 512
"""The most records one read of any other per-peer key brings out of the DHT process."""


# Record kinds stored one per peer (the signer's peer ID is the subkey) under one key per run:
# kind -> (parser, the run's key). The validator and the readers both go through this table;
# each parsed record has ``run_id``, ``peer_id`` and ``expires_at``.
PER_PEER_KINDS: dict[str, tuple[Callable[..., Any], Callable[[str], str]]] = {
    LINKS_KIND: (LinksRecord.parse, links_key),
    PLAN_KIND: (PlanManifest.parse, plan_key),  # the plan's parts: ``plan_part_key``, plain values
    OBSERVATIONS_KIND: (Observations.parse, observations_key),
}

# The task pool's leases, one per holder (its peer ID the subkey) under one key per pipeline or
# stage: kind -> (parser, the key a lease's own content implies).
LEASE_KINDS: dict[str, tuple[Callable[..., Any], Callable[[Any], str]]] = {
    CELL_KIND: (CellLease.parse, lambda lease: cells_key(lease.run_id, lease.pipeline, lease.stage)),
    SHARD_KIND: (ShardLease.parse, lambda lease: shards_key(lease.run_id, lease.stage)),
}

_PLAIN_VALUE = MSGPackSerializer.dumps(None)  # hivemind's subkey for a value without subkeys


def _dht_id(key: str) -> bytes:
    return DHTID.generate(source=key).to_bytes()


class SwarmRecordValidator(RecordValidatorBase):
    """Runs inside the DHT process: stores and returns only swarmd records, well-formed, signed,
    and under the very key their content implies.

    A record names its run (a heartbeat in its body, a spec through its creator's key and
    name), so the validator needs no list of runs: it recomputes the key and compares. A DHT
    shared by many runs thus stores every run's records, each checked, and nothing else.
    """

    def validate(self, record: DHTRecord) -> bool:
        try:
            value = MSGPackSerializer.loads(record.value)
            if record.subkey == _PLAIN_VALUE and is_part(value):  # under the digest of its bytes only
                run_id, _ = open_part(value)
                key = plan_part_key(run_id, hashlib.sha256(value).hexdigest())
                return record.key == _dht_id(key) and record.expiration_time <= get_dht_time() + PLAN_MAX_TTL_S
            if record.subkey == _PLAIN_VALUE:  # else a spec is the one plain value swarmd stores
                spec = open_run_spec(value)
                return (
                    record.key == _dht_id(spec_key(spec.run_id))
                    and record.expiration_time <= get_dht_time() + SPEC_TTL_S + _EXPIRY_SLACK_S
                )
            subkey = MSGPackSerializer.loads(record.subkey)
            if not isinstance(subkey, str):
                return False
            kind = peek_kind(value)
            if kind in PER_PEER_KINDS:
                parser, key_of = PER_PEER_KINDS[kind]
                found = parser(value, run_id=None, now=None, peer_id=subkey)
                return record.key == _dht_id(key_of(found.run_id)) and record.expiration_time <= found.expires_at
            if kind in LEASE_KINDS:
                parser, lease_key = LEASE_KINDS[kind]
                found = parser(value, run_id=None, now=None, peer_id=subkey)
                return record.key == _dht_id(lease_key(found)) and record.expiration_time <= found.expires_at
            heartbeat = Heartbeat.parse(value, run_id=None, now=None, peer_id=subkey)
            # Under its run's key for its peer's bucket, stored no longer than the record is valid.
            return (
                record.key == _dht_id(members_key(heartbeat.run_id, member_bucket(subkey)))
                and record.expiration_time <= heartbeat.expires_at
            )
        except (RecordError, RunSpecError) as e:
            logger.debug("DHT refused a record: %s", e)
        except Exception as e:  # msgpack raises many types on garbage
            logger.debug("DHT refused an undecodable record: %r", e)
        return False


@dataclass(frozen=True)
class MemberScan:
    live: list[Heartbeat]
    leaving: list[str]
    """Peers whose latest heartbeat announces they are shutting down."""
    rejected: int
    """Records that failed validation (garbled, foreign, expired, or signed by the wrong key)."""


class SwarmDHT:
    """Typed access to one run's records: spec, heartbeats, and peer reachability."""

    def __init__(
        self,
        run_id: str,
        *,
        identity_path: str,
        initial_peers: Sequence[str],
        host_maddrs: Sequence[str],
        announce_maddrs: Sequence[str] = (),
        nat_port_map: bool = True,
        relay: bool = True,
        startup_timeout_s: float = 30.0,
        child_init: Callable[[], None] | None = None,
    ) -> None:
        self.run_id = run_id
        self._kwargs = dict(
            initial_peers=list(initial_peers),
            identity_path=identity_path,
            host_maddrs=list(host_maddrs),
            announce_maddrs=list(announce_maddrs) or None,
            nat_port_map=nat_port_map,
            use_relay=relay,
            auto_nat=nat_port_map,
            # hivemind's check spawns a second p2pd and only understands RSA keys; a state-dir
            # lock already keeps two local daemons off one identity.
            check_if_identity_free=False,
            startup_timeout=startup_timeout_s,
            ensure_bootstrap_success=False,
            record_validators=[SwarmRecordValidator()],
            child_init=child_init,
            shutdown_timeout=5,
        )
        self._dht: TiedDHT | None = None
        self._plans = PlanReader(run_id, self._fetch_part)
        self._live: frozenset[str] = frozenset()
        """The live members as of the last ``scan_members``: their plans' parts are fetched first."""
        self.restarts = 0
        """Times a dead DHT process was replaced (``swarmd status``)."""

    # --- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        """Start the DHT process and bootstrap (blocking: call from a worker thread)."""
        try:
            self._dht = TiedDHT(start=True, **self._kwargs)  # type: ignore[arg-type]
        except Exception as e:
            if "failed to connect to bootstrap peers" in str(e):
                raise BootstrapError(
                    f"none of the initial peers answered ({', '.join(self._kwargs['initial_peers'])}); "  # type: ignore[arg-type]
                    "check the addresses and that those daemons run"
                ) from None
            raise JoinError(f"the DHT failed to start: {e}") from None

    def restart(self) -> None:
        """Replace a dead DHT process with a new one: same identity, same initial peers
        (blocking: call from a worker thread). What was stored only in the old one is lost:
        the caller publishes its own records again."""
        old = self._dht
        if old is not None:
            self.kill_now()  # its p2pd outlives a process killed alone
            old.close_writer()
        self._dht = None
        kwargs = dict(self._kwargs, ensure_bootstrap_success=False)  # peers that left must not stop us
        try:
            self._dht = TiedDHT(start=True, **kwargs)  # type: ignore[arg-type]
        except Exception as e:
            raise JoinError(f"the DHT process could not be restarted: {e}") from None
        self.restarts += 1

    @property
    def dht(self) -> TiedDHT:
        if self._dht is None:
            raise RuntimeError("SwarmDHT is not started")
        return self._dht

    @property
    def pid(self) -> int | None:
        return self._dht.pid if self._dht is not None else None

    def is_alive(self) -> bool:
        return self._dht is not None and self._dht.is_alive()

    async def visible_maddrs(self) -> list[str]:
        """Addresses others can dial (a future: hivemind's own getter blocks without a deadline)."""
        return await self.dht.ask(in_process.visible_maddrs)

    def shutdown(self) -> None:
        """Bounded: hivemind joins for shutdown_timeout, then terminates; then we kill the group."""
        if self._dht is None:
            return
        try:
            self._dht.shutdown()
        finally:
            self.kill_now()
            self._dht.close_writer()

    def kill_now(self) -> None:
        """SIGKILL the DHT process and everything in its group (p2pd); safe from a signal handler."""
        pid = self._dht.pid if self._dht is not None else None
        if pid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)

    # --- the pipe --------------------------------------------------------------------------

    async def _store(self, key: str, raw: bytes, expires_at: float, subkey: str | None = None) -> bool:
        """Store one value; a value past MAX_REQUEST_BYTES never reaches hivemind's pipe."""
        if len(raw) > MAX_REQUEST_BYTES:
            raise RecordError(
                f"a {len(raw)}-byte value for {key} is over the {MAX_REQUEST_BYTES}-byte limit of one DHT "
                "request; split or shrink the record"
            )
        return bool(await self.dht.ask(functools.partial(in_process.store_value, key, raw, expires_at, subkey)))

    async def _read(self, key: str, limit: int, known: Sequence[str] = ()) -> dict[str, bytes]:
        """Up to ``limit`` of the per-peer records under ``key`` (``known`` subkeys first, then a
        random draw): what crosses the pipe and what the caller checks stay bounded however
        many records strangers stored."""
        return (await self._read_many([(key, limit, known)]))[0]

    async def _read_many(self, reads: Sequence[tuple[str, int, Sequence[str]]]) -> list[dict[str, bytes]]:
        """``_read`` of several keys (key, limit, known) in one search of the DHT: a peer asked
        is asked for all of them in one request, not in one each."""
        bounded = [(key, limit, list(known)[:limit]) for key, limit, known in reads]
        found = await self.dht.ask(functools.partial(in_process.sample_many, bounded))
        for (key, _, _), (records, total) in zip(bounded, found, strict=True):
            if total > len(records):
                logger.debug("Read %d of the %d records under %s (the rest on later reads)", len(records), total, key)
        return [records for records, _ in found]

    # --- records ---------------------------------------------------------------------------

    async def publish_heartbeat(self, peer_id: str, raw: bytes, expires_at: float) -> bool:
        return await self._store(members_key(self.run_id, member_bucket(peer_id)), raw, expires_at, subkey=peer_id)

    async def scan_members(self, now: float, known: Collection[str] = ()) -> MemberScan:
        """Every bucket's heartbeats, each read bounded (``known``: members we already see,
        read first in their buckets)."""
        by_bucket: list[list[str]] = [[] for _ in range(MEMBER_BUCKETS)]
        for peer_id in known:
            by_bucket[member_bucket(peer_id)].append(peer_id)
        reads = await self._read_many(
            [
                (members_key(self.run_id, b), MEMBERS_PER_BUCKET, by_bucket[b][:KNOWN_PER_BUCKET])
                for b in range(MEMBER_BUCKETS)
            ]
        )
        records = {subkey: raw for read in reads for subkey, raw in read.items()}
        # One signature check per record: in a worker thread, so that a big swarm cannot stall the loop.
        scan = await asyncio.to_thread(self._check_members, records, now)
        self._live = frozenset(h.peer_id for h in scan.live)
        return scan

    def _check_members(self, records: dict[str, bytes], now: float) -> MemberScan:
        live, leaving, rejected = [], [], 0
        for subkey, raw in records.items():
            try:
                heartbeat = Heartbeat.parse(raw, run_id=self.run_id, now=now, peer_id=subkey)
            except RecordError as e:
                logger.debug("Dropped a member record: %s", e)
                rejected += 1
                continue
            if heartbeat.leaving:
                leaving.append(heartbeat.peer_id)
            elif heartbeat.is_live(now):
                live.append(heartbeat)
        return MemberScan(live, leaving, rejected)

    async def publish_pool_lease(self, lease: Lease, raw: bytes) -> bool:
        """Store this peer's cell or shard lease under the key its content implies."""
        _, lease_key = LEASE_KINDS[lease.KIND]
        return await self._store(lease_key(lease), raw, lease.expires_at, subkey=lease.peer_id)

    async def scan_cell(self, pipeline: int, stage: int, now: float) -> list[CellLease]:
        """Every verified lease of the cell (live or not: the caller resolves)."""
        found = await self._scan_pool(CELL_KIND, cells_key(self.run_id, pipeline, stage), now)
        return [lease for lease, _ in found if lease.cell == (pipeline, stage)]

    async def scan_shards(self, stage: int, now: float) -> list[tuple[ShardLease, bytes]]:
        """Every verified lease of ``stage``'s shards, with its signed bytes (a take-over's proof)."""
        found = await self._scan_pool(SHARD_KIND, shards_key(self.run_id, stage), now)
        return [(lease, raw) for lease, raw in found if lease.stage == stage]

    async def _scan_pool(self, kind: str, key: str, now: float) -> list[tuple[Any, bytes]]:
        records = await self._read(key, MAX_RECORDS_PER_READ)
        parser, _ = LEASE_KINDS[kind]
        leases = []
        for subkey, raw in records.items():
            try:
                leases.append((parser(raw, run_id=self.run_id, now=now, peer_id=subkey), raw))
            except RecordError as e:
                logger.debug("Dropped a %s record: %s", kind, e)
        return leases

    async def publish_peer_record(self, kind: str, peer_id: str, raw: bytes, expires_at: float) -> bool:
        """Store this peer's record of a per-peer ``kind`` (links, plan, observations). A plan
        comes as its bundle (``PlanRecord.sign``): its parts are stored first, each under its
        digest, then the manifest that names them, so no reader meets a manifest before its parts."""
        key = PER_PEER_KINDS[kind][1](self.run_id)
        if kind != PLAN_KIND:
            return await self._store(key, raw, expires_at, subkey=peer_id)
        bundle = open_bundle(raw)
        self._plans.remember(bundle.parts)
        parts = [self._store(plan_part_key(self.run_id, d), v, expires_at) for d, v in bundle.parts.items()]
        stored = sum(await asyncio.gather(*parts))
        if stored < len(parts):
            logger.warning("Plan not published: %d of its %d parts were not stored", len(parts) - stored, len(parts))
            return False
        return await self._store(key, bundle.manifest, expires_at, subkey=peer_id)

    async def scan_peer_records(self, kind: str, now: float | None) -> list[Any]:
        """Every verified record of ``kind`` in this run, one per peer (``now=None``: expired
        ones too, for kinds whose newest record stands until replaced)."""
        parser, key_of = PER_PEER_KINDS[kind]
        records = await self._read(key_of(self.run_id), MAX_RECORDS_PER_READ)

        def check() -> list[Any]:
            out = []
            for subkey, raw in records.items():
                try:
                    out.append(parser(raw, run_id=self.run_id, now=now, peer_id=subkey))
                except RecordError as e:
                    logger.debug("Dropped a %s record: %s", kind, e)
            return out

        checked = await asyncio.to_thread(check)  # signature checks off the loop, as for members
        return await self._plans.assemble(checked, self._live) if kind == PLAN_KIND else checked

    async def _fetch_part(self, key: str) -> bytes | None:
        found = await self.dht.ask(functools.partial(in_process.get_latest, key))
        return found.value if found is not None and isinstance(found.value, bytes) else None

    async def publish_spec(self, raw: bytes) -> bool:
        return await self._store(spec_key(self.run_id), raw, get_dht_time() + SPEC_TTL_S)

    async def fetch_spec(self) -> SignedRunSpec | None:
        found = await self.dht.ask(functools.partial(in_process.get_latest, spec_key(self.run_id)))
        if found is None:
            return None
        try:
            return verify_run_spec(found.value, self.run_id)
        except RunSpecError as e:
            logger.warning("%s", e)
            return None

    # --- peers -----------------------------------------------------------------------------

    async def ping(self, peer_id: str) -> float | None:
        """Round-trip time of a DHT ping to ``peer_id`` in seconds, or None if it did not answer."""
        return await self.dht.ask(functools.partial(in_process.ping, peer_id))

    async def known_peers(self) -> int:
        """How many other DHT nodes this one knows (0: it has not reached the swarm)."""
        return await self.dht.ask(in_process.routing_table_size)

    async def replicate_p2p(self) -> Any:
        """A hivemind P2P handle in this process on the DHT's own p2pd (same peer ID, same host)."""
        from hivemind.p2p import P2P

        maddr = await self.dht.ask(in_process.daemon_listen_maddr)
        return await P2P.replicate(maddr)

    async def add_peers(self, peer_id: str, maddrs: Sequence[str]) -> int:
        """Connect to ``peer_id``, found out of band (LAN discovery), at those of ``maddrs`` that
        name it (a hello must not make us dial third parties); returns how many answered."""
        own = [m for m in maddrs if m.endswith(f"/p2p/{peer_id}")][:MAX_ADDRS]
        return await self.dht.ask(functools.partial(in_process.add_peers, own))
