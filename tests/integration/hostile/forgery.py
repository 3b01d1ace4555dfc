"""The bytes Mallory sends, built by hand so that nothing on our side refuses them first.

Tensor frames follow ``swarmd.peers.wire.codecs`` (magic, codec, ndim, reserved, dims,
payload) but carry what an honest encoder never would: NaN, infinities, values near fp32's
maximum, a length or codec that the header does not match. Records are signed with
``sign_record`` from plain dictionaries, so a field out of its bounds reaches the receiver's
parser instead of our dataclass.
"""

from __future__ import annotations

import struct
import time
from typing import Any

import torch
from safetensors.torch import save

from swarmd.peers.records.envelope import sign_record
from swarmd.peers.records.heartbeat import KIND as HEARTBEAT_KIND
from swarmd.peers.records.identity import Identity
from swarmd.peers.records.plan_record import PlanRecord
from swarmd.peers.taskpool.cells import KIND as CELL_KIND
from swarmd.peers.taskpool.servers import KIND as SHARD_KIND
from swarmd.peers.wire.codecs import MAGIC
from swarmd.peers.wire.sizes import CODECS

HUGE = 3.0e38
"""Finite in fp32, and the norm of any vector of these is not."""


def frame(values: torch.Tensor, codec: str = "fp32", declared: str | None = None) -> bytes:
    """A float frame of ``values`` (any, NaN included) that names codec ``declared``."""
    dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[codec]
    payload = values.to(dtype).contiguous().view(torch.uint8).numpy().tobytes()
    head = MAGIC + bytes([CODECS.index(declared or codec), values.dim()]) + b"\0\0"
    return head + b"".join(struct.pack("<I", d) for d in values.shape) + payload


def vector(elements: int, fill: float, first: float | None = None) -> torch.Tensor:
    """``elements`` values of ``fill``; the first one ``first`` (one NaN hides among zeros)."""
    out = torch.full((elements,), fill, dtype=torch.float32)
    if first is not None and elements:
        out[0] = first
    return out


def checkpoint(elements: int, fill: float, version: int) -> bytes:
    """A safetensors blob shaped like a shard's checkpoint, every value ``fill``."""
    return save({"shard": torch.full((elements,), fill, dtype=torch.float32)}, {"version": str(version)})


def truncated(blob: bytes) -> bytes:
    return blob[: max(8, len(blob) // 3)]


def heartbeat(identity: Identity, run_id: str, addrs: list[str], roles: list[str], ttl_s: float = 60.0) -> bytes:
    now = time.time()
    body = {
        "run_id": run_id,
        "peer_id": identity.peer_id,
        "issued_at": now,
        "expires_at": now + ttl_s,
        "addrs": addrs,
        "lan_addrs": [],
        "device": {"kind": "cpu", "name": "mallory", "memory_bytes": 64 * 2**30, "cpus": 64},
        "throughput_gflops": 10_000.0,
        "version": "0.1.0",
        "roles": roles,
        "uptime_s": 3600.0,
        "leaving": False,
    }
    return sign_record(identity, HEARTBEAT_KIND, body)


def _lease(identity: Identity, run_id: str, claim: dict[str, Any], ttl_s: float) -> dict[str, Any]:
    now = time.time()
    return {
        "run_id": run_id,
        "peer_id": identity.peer_id,
        "issued_at": now,
        "expires_at": now + ttl_s,
        "claimed_at": now - 3600.0,  # the oldest claim wins ties: mallory claims to be first
        "released": False,
        **claim,
    }


def cell_lease(identity: Identity, run_id: str, pipeline: int, stage: int, ttl_s: float = 120.0) -> bytes:
    return sign_record(identity, CELL_KIND, _lease(identity, run_id, {"pipeline": pipeline, "stage": stage}, ttl_s))


def shard_lease(
    identity: Identity, run_id: str, stage: int, shard: int, shards: int, version: int, ttl_s: float = 120.0
) -> bytes:
    claim = {"stage": stage, "shard": shard, "shards": shards, "version": version, "standby": "", "proof": ""}
    return sign_record(identity, SHARD_KIND, _lease(identity, run_id, claim, ttl_s))


def plan(identity: Identity, run_id: str, version: int, devices: list[str], stages: int, layers: int) -> bytes:
    """A plan naming mallory (device 0) every stage's server, the relay, and stage 0's cell
    (a device may hold one cell: the later stages go to ``devices[1:]``, honest peers), in
    the wire form the tree signs plans in (``PlanRecord.sign``)."""
    now = time.time()
    per_stage = [layers // stages + (1 if s < layers % stages else 0) for s in range(stages)]
    record = PlanRecord(
        run_id=run_id,
        peer_id=identity.peer_id,
        issued_at=now,
        expires_at=now + 600.0,
        version=version,
        kind="full",
        devices=devices,
        pipelines=[list(range(stages))],
        layers_per_stage=per_stage,
        parameter_servers=[0] * stages,
        relays=[0],
        shard_servers=[[0] for _ in range(stages)],
    )
    return record.sign(identity)
