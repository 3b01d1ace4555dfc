"""The published plan: the elected coordinator's signed record of who runs which stage.

Stored under ``swarmd/<run>/plan`` with the coordinator's peer ID as subkey. Readers take the
record of the coordinator they elected (``swarmd.peers.membership.election``) and, across coordinator
changes, the highest ``version``: a new coordinator continues from the highest it has seen
within reach of the plan in force (``swarmd.node.plan_choice.within_reach``), so versions
only grow. Devices are named once (``devices``) and the grid refers to them by index.

On the wire a plan is a signed manifest and compressed, content-addressed parts
(``swarmd.peers.records.plan_parts``), so that no value it stores exceeds 16 KiB even for
10,000 members: ``sign`` returns them as one bundle (the DHT stores them apart), ``parse``
reads a bundle back, and ``from_parts`` joins a verified manifest with the parts a reader
fetched. Either way the plan's own fields pass the same checks (``_read_fields``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any, ClassVar, Self

from swarmd.errors import RecordError
from swarmd.peers.records.envelope import Fields
from swarmd.peers.records.identity import Identity
from swarmd.peers.records.plan_parts import (
    KIND,
    MAX_BUNDLE_BYTES,
    MAX_TTL_S,
    PlanManifest,
    decode,
    encode,
    open_bundle,
    pack_bundle,
)
from swarmd.peers.records.signed import Head, SignedRecord

MAX_PLAN_DEVICES = 16384
"""Room for a swarm of 10,000 members and more (``plan_parts`` keeps its values small)."""
MAX_STAGES = 1024
MAX_SHARDS = 4096
MAX_LOCAL_STEPS = 1000
MAX_SHARE = 1 << 20
MAX_GROUP = 64
"""The most pipelines one reduction group holds (``swarmd.peers.taskpool.reduction``): a head
takes one slice from each member per shard it heads, and past this its own link is the
bottleneck the group was meant to remove."""


KINDS = ("full", "repair", "relays")


@dataclass(frozen=True, kw_only=True)
class PlanRecord(SignedRecord):
    """A plan; its ``peer_id`` is the coordinator that computed and signed it."""

    KIND: ClassVar[str] = KIND
    MAX_BYTES: ClassVar[int] = MAX_BUNDLE_BYTES
    MAX_TTL_S: ClassVar[float] = MAX_TTL_S
    READ_EXPIRED: ClassVar[bool] = True
    """An expired plan is still read: the newest one stands until replaced."""
    version: int
    kind: str
    """``full`` (planned from scratch), ``repair`` (mended from the previous version) or
    ``relays`` (the previous version with its relays re-elected)."""
    devices: list[str]
    pipelines: list[list[int]]
    """pipelines[p][s]: index into ``devices`` of who runs stage s in pipeline p."""
    layers_per_stage: list[int]
    parameter_servers: list[int]
    relays: list[int] = field(default_factory=list)
    predicted: dict[str, float] = field(default_factory=dict)
    shard_servers: list[list[int]] = field(default_factory=list)
    """shard_servers[s]: the devices holding stage s's parameter shards, in shard order (empty:
    one shard each, at ``parameter_servers[s]``)."""
    local_steps: int = 1
    """H: shares per round (``swarmd.peers.taskpool.exchange``)."""
    share_micro_batches: int = 0
    """k: micro-batches per share (0: the run's batch over the pipelines)."""
    spares: list[int] = field(default_factory=list)
    """Devices outside the grid the plan gives a role (a server, a relay, a spare for a cell)."""
    reduce_groups: list[int] = field(default_factory=list)
    """G per stage: its pipelines reduce their contributions in groups of G before the servers
    (``swarmd.peers.taskpool.reduction``); empty or 1: each cell sends to the servers itself."""
    checkpointing: list[bool] = field(default_factory=list)
    """Per stage, whether its cells checkpoint activations (the planner's choice where they would
    not fit otherwise); empty: none does. Left out of the signed body when empty, so a plan
    without it reads as before."""

    def checkpointed(self, stage: int) -> bool:
        """Whether stage ``stage``'s cells run with activation checkpointing."""
        return stage < len(self.checkpointing) and self.checkpointing[stage]

    def stage_of(self, peer_id: str) -> int | None:
        """The stage the plan gives ``peer_id`` (None: the plan leaves it out)."""
        try:
            index = self.devices.index(peer_id)
        except ValueError:
            return None
        for row in self.pipelines:
            if index in row:
                return row.index(index)
        return None

    def server_of(self, stage: int) -> str:
        return self.devices[self.parameter_servers[stage]]

    def sign(self, identity: Identity) -> bytes:
        """The plan's bundle: its manifest signed by ``identity`` (the coordinator), then its parts."""
        if identity.peer_id != self.peer_id:
            raise RecordError(f"cannot sign the plan of {self.peer_id} with the key of {identity.peer_id}")
        own = {k: v for k, v in asdict(self).items() if k not in _HEAD_FIELDS}
        devices, version = own.pop("devices"), own.pop("version")
        if not own["checkpointing"]:
            del own["checkpointing"]
        found, parts = encode(self.run_id, devices, own)
        head = {k: getattr(self, k) for k in ("run_id", "peer_id", "issued_at", "expires_at")}
        manifest = PlanManifest(**head, version=version, **found)
        return pack_bundle(manifest.sign(identity), parts)

    @classmethod
    def parse(cls, raw: object, *, run_id: str | None, now: float | None, peer_id: str | None = None) -> Self:
        """Verify and decode a plan bundle (``sign``'s form); the checks are ``SignedRecord.parse``'s
        on the manifest, then ``from_parts``'."""
        bundle = open_bundle(raw)
        manifest = PlanManifest.parse(bundle.manifest, run_id=run_id, now=now, peer_id=peer_id)
        return cls.from_parts(manifest, bundle.parts)

    @classmethod
    def from_parts(cls, manifest: PlanManifest, parts: Mapping[str, bytes]) -> Self:
        """The plan of a verified ``manifest``, from its parts by digest (each checked against
        the digest and size the manifest signs); raises RecordError naming what failed."""
        devices, roles = decode(manifest, parts)
        f = Fields({**roles, "devices": devices, "version": manifest.version}, KIND)
        f.only({name.name for name in fields(cls)} - _HEAD_FIELDS)
        head = Head(manifest.run_id, manifest.peer_id, manifest.issued_at, manifest.expires_at)
        return cls(**asdict(head), **cls._read_fields(f, head))

    @classmethod
    def _read_fields(cls, f: Fields, head: Head) -> dict[str, Any]:
        """The plan's own fields, and that the grid is a grid (every pipeline as long as the
        stage list, no device twice)."""
        claimed, body = head.peer_id, f.obj
        kind = f.string("kind", 16)
        if kind not in KINDS:
            raise RecordError(f"plan of {claimed} has kind {kind!r}, not one of {', '.join(KINDS)}")
        devices = f.strings("devices", MAX_PLAN_DEVICES, 128)
        if len(set(devices)) != len(devices):
            raise RecordError(f"plan of {claimed} names a device twice")
        n = len(devices)
        layers = _index_list(body.get("layers_per_stage"), "layers_per_stage", 1 << 20, MAX_STAGES)
        stages = len(layers)
        if stages < 1 or min(layers) < 1:
            raise RecordError(f"plan of {claimed}: every stage needs at least one layer, got {layers[:8]}")
        raw_pipes = body.get("pipelines")
        if not isinstance(raw_pipes, list) or not 1 <= len(raw_pipes) <= MAX_PLAN_DEVICES:
            raise RecordError(f"plan of {claimed}: pipelines must be a list of 1..{MAX_PLAN_DEVICES} pipelines")
        pipelines = [_index_list(row, "a pipeline", n, MAX_STAGES) for row in raw_pipes]
        if any(len(row) != stages for row in pipelines):
            raise RecordError(f"plan of {claimed}: every pipeline must have {stages} stages")
        placed = [d for row in pipelines for d in row]
        if len(set(placed)) != len(placed):
            raise RecordError(f"plan of {claimed} places a device twice")
        servers = _index_list(body.get("parameter_servers"), "parameter_servers", n, MAX_STAGES)
        if len(servers) != stages:
            raise RecordError(f"plan of {claimed}: {len(servers)} parameter servers for {stages} stages")
        relays = _index_list(body.get("relays"), "relays", n, MAX_PLAN_DEVICES)
        shard_servers = _shard_servers(body.get("shard_servers", []), servers, n, claimed)
        spares = _index_list(body.get("spares", []), "spares", n, MAX_PLAN_DEVICES)
        local_steps = f.integer("local_steps", 1, MAX_LOCAL_STEPS) if "local_steps" in body else 1
        share = f.integer("share_micro_batches", 0, MAX_SHARE) if "share_micro_batches" in body else 0
        reduce_groups = _index_list(body.get("reduce_groups", []), "reduce_groups", MAX_GROUP + 1, MAX_STAGES)
        if reduce_groups and (len(reduce_groups) != stages or min(reduce_groups) < 1):
            raise RecordError(
                f"plan of {claimed}: reduce_groups must give each of {stages} stages a group size "
                f"of 1 to {MAX_GROUP}, got {reduce_groups[:8]}"
            )
        checkpointing = body.get("checkpointing", [])
        ok = isinstance(checkpointing, list) and all(isinstance(c, bool) for c in checkpointing)
        if not ok or (checkpointing and len(checkpointing) != stages):
            raise RecordError(f"plan of {claimed}: checkpointing must be {stages} true/false, one per stage")
        predicted_raw = body.get("predicted")
        if not isinstance(predicted_raw, dict) or len(predicted_raw) > 16:
            raise RecordError(f"plan of {claimed}: predicted must be an object of at most 16 figures")
        predicted = {}
        for key, value in predicted_raw.items():
            ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value >= 0
            if not isinstance(key, str) or len(key) > 32 or not ok:
                raise RecordError(
                    f"plan of {claimed}: predicted {str(key)[:32]!r} = {str(value)[:30]!r} is not a figure"
                )
            predicted[key] = float(value)
        return {
            "version": f.integer("version", 0, 2**53),
            "kind": kind,
            "devices": devices,
            "pipelines": pipelines,
            "layers_per_stage": layers,
            "parameter_servers": servers,
            "relays": relays,
            "predicted": predicted,
            "shard_servers": shard_servers,
            "local_steps": local_steps,
            "share_micro_batches": share,
            "spares": spares,
            "reduce_groups": reduce_groups,
            "checkpointing": checkpointing,
        }


_HEAD_FIELDS = {"run_id", "peer_id", "issued_at", "expires_at"}


def _index_list(value: object, what: str, n: int, max_len: int) -> list[int]:
    if not isinstance(value, list) or len(value) > max_len:
        raise RecordError(f"plan: {what} must be a list of at most {max_len} indices")
    for v in value:
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < n:
            raise RecordError(f"plan: {what} holds {str(v)[:30]!r}, not an index below {n}")
    return list(value)


def _shard_servers(value: object, servers: list[int], n: int, claimed: str) -> list[list[int]]:
    """Per stage, its shards' servers (none given: one shard each, at the stage's server)."""
    if value == []:
        return []
    if not isinstance(value, list) or len(value) != len(servers):
        raise RecordError(f"plan of {claimed}: shard_servers must list the servers of each of {len(servers)} stages")
    out = [_index_list(row, "a stage's shard servers", n, MAX_SHARDS) for row in value]
    for s, row in enumerate(out):
        if not row or row[0] != servers[s] or len(set(row)) != len(row):
            raise RecordError(
                f"plan of {claimed}: stage {s}'s shard servers {row[:8]} must start with its "
                f"parameter server {servers[s]} and name no device twice"
            )
    return out
