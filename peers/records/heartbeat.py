"""The membership record: a signed, expiring heartbeat each daemon publishes about itself.

Readers drop a heartbeat that is too large, malformed, badly signed, signed by a key other
than the peer it describes, for another run, or expired. What a heartbeat says about the
peer's device and uptime is its own claim; measured reliability comes from what others observe.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from swarmd.errors import RecordError, RunSpecError
from swarmd.peers.records.envelope import Fields, open_record, sign_record
from swarmd.peers.records.identity import Identity
from swarmd.peers.records.run_spec import check_run_id

KIND = "heartbeat"
MAX_HEARTBEAT_BYTES = 8 * 1024
# Long enough for a slow network, short enough that a flood of one-off keys ages out soon.
MAX_TTL_S = 600.0
MAX_ADDRS = 16
# Peers' clocks disagree; a record issued this far in our future is still believed.
CLOCK_SKEW_S = 30.0
ROLES = ("worker", "parameter_server", "relay")


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
class Heartbeat:
    run_id: str
    peer_id: str
    issued_at: float
    """Unix time the record was signed."""
    expires_at: float
    """Unix time after which readers drop it."""
    addrs: list[str]
    """Multiaddrs of the peer's DHT (p2pd) host."""
    lan_addrs: list[str] = field(default_factory=list)
    """Multiaddrs of the peer's py-libp2p host (LAN discovery, event path)."""
    device: DeviceInfo
    throughput_gflops: float
    """Measured dense matmul throughput; 0 when not measured."""
    version: str
    roles: list[str]
    uptime_s: float
    leaving: bool = False
    """Set on the last heartbeat of a peer that is shutting down: readers drop it at once."""

    def is_live(self, now: float) -> bool:
        return not self.leaving and now < self.expires_at

    def sign(self, identity: Identity) -> bytes:
        if identity.peer_id != self.peer_id:
            raise RecordError(f"cannot sign a heartbeat for {self.peer_id} with the key of {identity.peer_id}")
        return sign_record(identity, KIND, asdict(self))


def check_subject(f: Fields, signer: str, kind: str, *, run_id: str | None, peer_id: str | None) -> tuple[str, str]:
    """The peer and run a record is about, checked: the peer must be its signer (and the DHT
    subkey it was stored under), the run well formed (and ``run_id`` when given)."""
    claimed = f.string("peer_id", 128)
    if claimed != signer:
        raise RecordError(f"{kind} claims peer {claimed[:60]} but is signed by {signer}")
    if peer_id is not None and peer_id != claimed:
        raise RecordError(f"{kind} of {claimed} was stored under another peer's key {peer_id[:60]}")
    found_run = f.string("run_id", 128)
    if run_id is not None and found_run != run_id:
        raise RecordError(f"{kind} is for run {found_run!r}, not {run_id!r}")
    try:
        check_run_id(found_run)
    except RunSpecError as e:
        raise RecordError(str(e)) from None
    return claimed, found_run


def check_times(f: Fields, kind: str, claimed: str, now: float | None, max_ttl_s: float) -> tuple[float, float]:
    """A record's ``issued_at`` and ``expires_at``, checked: a lifetime of at most ``max_ttl_s``
    and, when ``now`` is given, issued no further in the future than clock skew explains and
    not yet expired."""
    issued_at = f.number("issued_at", 0, 1e11)
    expires_at = f.number("expires_at", issued_at, issued_at + max_ttl_s)
    if now is not None and issued_at > now + CLOCK_SKEW_S:
        raise RecordError(f"{kind} of {claimed} is issued {issued_at - now:.0f} s in the future")
    if now is not None and expires_at <= now:
        raise RecordError(f"{kind} of {claimed} expired {now - expires_at:.0f} s ago")
    return issued_at, expires_at


def parse_heartbeat(raw: object, *, run_id: str | None, now: float | None, peer_id: str | None = None) -> Heartbeat:
    """Verify and decode a heartbeat for ``run_id``; ``peer_id`` is the DHT subkey it was found under.

    ``run_id=None`` accepts any well-formed run ID: the DHT's validator then checks that the
    record sits under that run's key.

    ``now=None`` skips the clock checks (future issue time, expiry): the DHT's validator does
    so, because hivemind drops a whole member list when one record in it fails, and a record
    that merely expired while in flight must not hide the others.
    """
    record = open_record(raw, KIND, MAX_HEARTBEAT_BYTES)
    f = Fields(record.body, KIND)
    f.only(
        {
            "run_id",
            "peer_id",
            "issued_at",
            "expires_at",
            "addrs",
            "lan_addrs",
            "device",
            "throughput_gflops",
            "version",
            "roles",
            "uptime_s",
            "leaving",
        }
    )
    claimed, found_run = check_subject(f, record.signer, KIND, run_id=run_id, peer_id=peer_id)
    issued_at, expires_at = check_times(f, "heartbeat", claimed, now, MAX_TTL_S)
    roles = f.strings("roles", len(ROLES), 32)
    if unknown := set(roles) - set(ROLES):
        raise RecordError(f"heartbeat of {claimed} names unknown roles {sorted(unknown)}")
    d = f.object("device")
    d.only({"kind", "name", "memory_bytes", "cpus"})
    kind = d.string("kind", 16)
    if kind not in ("cpu", "cuda"):
        raise RecordError(f"heartbeat of {claimed} has device kind {kind!r}, not cpu or cuda")
    device = DeviceInfo(
        kind=kind,
        name=d.string("name", 128),
        memory_bytes=d.integer("memory_bytes", 0, 2**50),
        cpus=d.integer("cpus", 1, 4096),
    )
    return Heartbeat(
        run_id=found_run,
        peer_id=claimed,
        issued_at=issued_at,
        expires_at=expires_at,
        addrs=f.strings("addrs", MAX_ADDRS, 256),
        lan_addrs=f.strings("lan_addrs", MAX_ADDRS, 256),
        device=device,
        throughput_gflops=f.number("throughput_gflops", 0, 1e7),
        version=f.string("version", 32),
        roles=roles,
        uptime_s=f.number("uptime_s", 0, 1e10),
        leaving=f.boolean("leaving"),
    )
