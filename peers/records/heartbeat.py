"""The membership record: a signed, expiring heartbeat each daemon publishes about itself.

Readers drop a heartbeat that is too large, malformed, badly signed, signed by a key other
than the peer it describes, for another run, or expired. What a heartbeat says about the
peer's device and uptime is its own claim; measured reliability comes from what others observe.

A heartbeat of a private run also carries the peer's join token (``join_token``), which the
readers check against the run's spec (``swarmd.peers.membership.admission``); a heartbeat
without one, as every heartbeat before private runs existed, reads as before. So does one
without the probe's ``free_memory_bytes`` and ``precision``, as every heartbeat before them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

from swarmd.errors import RecordError
from swarmd.peers.records.envelope import Fields, sign_record
from swarmd.peers.records.identity import Identity
from swarmd.peers.records.join_token import MAX_TOKEN_CHARS
from swarmd.peers.records.signed import Head, SignedRecord

KIND = "heartbeat"
MAX_HEARTBEAT_BYTES = 8 * 1024
# Long enough for a slow network, short enough that a flood of one-off keys ages out soon.
MAX_TTL_S = 600.0
MAX_ADDRS = 16
ROLES = ("worker", "parameter_server", "relay", "paused")
"""``paused``: its owner (or ``[limits]``) paused its work; it is planned for nothing meanwhile."""
PRECISIONS = ("bf16", "fp32")
"""The dtypes a peer's cells compute in (``precision``)."""
HOLDS = ("dataset", "shards", "init")
"""What of the run's files a peer holds and serves to members (``swarmd.data``): every file of
the data manifest, some of its shards (fetched into its cache), the checkpoint the run starts from."""


@dataclass(frozen=True, kw_only=True)
class DeviceInfo:
    kind: str
    """``cpu`` or ``cuda``."""
    name: str
    """Model name of the accelerator, or of the CPU when there is none."""
    memory_bytes: int
    """Accelerator memory, or system memory for a CPU device."""
    cpus: int
    """Logical CPUs the daemon may use."""


@dataclass(frozen=True, kw_only=True)
class HeldOut:
    """The run's newest held-out score, as the peer that scores it (shard (0, 0)'s holder) made it."""

    version: int
    """Shard (0, 0)'s version the weights were scored at."""
    loss: float


@dataclass(frozen=True, kw_only=True)
class Heartbeat(SignedRecord):
    KIND: ClassVar[str] = KIND
    MAX_BYTES: ClassVar[int] = MAX_HEARTBEAT_BYTES
    MAX_TTL_S: ClassVar[float] = MAX_TTL_S
    addrs: list[str]
    """Multiaddrs of the peer's DHT (p2pd) host."""
    lan_addrs: list[str] = field(default_factory=list)
    """Multiaddrs of the peer's py-libp2p host (LAN discovery, event path)."""
    device: DeviceInfo
    throughput_gflops: float
    """The speed the peer's probe achieved at the run's block, in its cells' precision and
    threads, times its ``[limits] cpu_share`` (``swarmd.node.compute_probe``), in GFLOP/s; 0
    before a measurement (readers then take the device's rated figure)."""
    version: str
    roles: list[str]
    uptime_s: float
    leaving: bool = False
    """Set on the last heartbeat of a peer that is shutting down: readers drop it at once."""
    join_token: str = ""
    """The peer's join token for a private run (``swarmd.peers.records.join_token``), unverified
    here: only the run's spec says whether one is needed and who must have signed it."""
    holds: list[str] = field(default_factory=list)
    """Which of ``HOLDS`` this peer serves: whom a member asks for the run's files first. A claim,
    not a proof: every file is checked against its digest where it arrives."""
    held_out: HeldOut | None = None
    """The run's held-out loss, from the peer that scores it: shown in every member's status."""
    free_memory_bytes: int = 0
    """The device's free memory when the probe measured it; 0: not measured."""
    precision: str = ""
    """What the probe measured in, the cells' dtype (one of ``PRECISIONS``); empty: not measured."""

    OPTIONAL: ClassVar[tuple[str, ...]] = ("join_token", "holds", "held_out", "free_memory_bytes", "precision")
    """Left out of the signed body when empty: the heartbeat then reads the same to daemons from
    before them."""

    def sign(self, identity: Identity) -> bytes:
        """As every record's, but without the ``OPTIONAL`` fields that are empty."""
        if identity.peer_id != self.peer_id:
            raise RecordError(f"cannot sign the heartbeat of {self.peer_id} with the key of {identity.peer_id}")
        body = asdict(self)
        for name in self.OPTIONAL:
            if not body[name]:
                del body[name]
        return sign_record(identity, self.KIND, body)

    def is_live(self, now: float) -> bool:
        return not self.leaving and now < self.expires_at

    @classmethod
    def _read_fields(cls, f: Fields, head: Head) -> dict[str, Any]:
        roles = f.strings("roles", len(ROLES), 32)
        if unknown := set(roles) - set(ROLES):
            raise RecordError(f"heartbeat of {head.peer_id} names unknown roles {sorted(unknown)}")
        d = f.object("device")
        d.only({"kind", "name", "memory_bytes", "cpus"})
        kind = d.string("kind", 16)
        if kind not in ("cpu", "cuda"):
            raise RecordError(f"heartbeat of {head.peer_id} has device kind {kind!r}, not cpu or cuda")
        device = DeviceInfo(
            kind=kind,
            name=d.string("name", 128),
            memory_bytes=d.integer("memory_bytes", 0, 2**50),
            cpus=d.integer("cpus", 1, 4096),
        )
        return {
            "addrs": f.strings("addrs", MAX_ADDRS, 256),
            "lan_addrs": f.strings("lan_addrs", MAX_ADDRS, 256),
            "device": device,
            "throughput_gflops": f.number("throughput_gflops", 0, 1e7),
            "version": f.string("version", 32),
            "roles": roles,
            "uptime_s": f.number("uptime_s", 0, 1e10),
            "leaving": f.boolean("leaving"),
            # Absent from open runs' heartbeats, as from every heartbeat before private runs.
            "join_token": f.string("join_token", MAX_TOKEN_CHARS) if "join_token" in f.obj else "",
            "holds": _holds(f, head) if "holds" in f.obj else [],
            "held_out": _held_out(f.object("held_out")) if f.obj.get("held_out") is not None else None,
            "free_memory_bytes": f.integer("free_memory_bytes", 0, 2**50) if "free_memory_bytes" in f.obj else 0,
            "precision": _precision(f, head) if "precision" in f.obj else "",
        }


def _held_out(h: Fields) -> HeldOut:
    h.only({"version", "loss"})
    return HeldOut(version=h.integer("version", 0, 2**40), loss=h.number("loss", 0.0, 1e4))


def _precision(f: Fields, head: Head) -> str:
    precision = f.string("precision", 8)
    if precision and precision not in PRECISIONS:  # empty: not measured, as when absent
        raise RecordError(f"heartbeat of {head.peer_id} says it computes in {precision!r}, not one of {PRECISIONS}")
    return precision


def _holds(f: Fields, head: Head) -> list[str]:
    holds = f.strings("holds", len(HOLDS), 16)
    if unknown := set(holds) - set(HOLDS):
        raise RecordError(f"heartbeat of {head.peer_id} says it holds {sorted(unknown)}, not any of {HOLDS}")
    return holds
