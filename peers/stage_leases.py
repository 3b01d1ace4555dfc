"""Stage leases: which peer serves which stage of a run, as signed, expiring DHT records.

A lease is stored under ``swarmd/<run>/stage/<s>`` with the holder's peer ID as subkey. The
DHT has no compare-and-swap, so concurrent claims are settled by one rule every reader
applies the same way: among the live (unexpired, unreleased) leases of a stage, the one with
the earliest ``claimed_at`` holds it, ties broken by peer ID. A holder renews its lease with
the same ``claimed_at``, so it keeps the stage (stickiness); a claimer writes, then re-reads,
and backs off unless the rule names it. A lease that is not renewed expires and frees the
stage; a holder that stops releases it at once.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from swarmd.errors import RecordError
from swarmd.peers.heartbeat import CLOCK_SKEW_S, check_subject
from swarmd.peers.identity import Identity
from swarmd.peers.records import Fields, open_record, sign_record

KIND = "stage-lease"
MAX_LEASE_BYTES = 2048
MAX_LEASE_TTL_S = 600.0
MAX_STAGES = 1024


@dataclass(frozen=True, kw_only=True)
class StageLease:
    run_id: str
    stage: int
    peer_id: str
    claimed_at: float
    """When the holder first claimed the stage; kept on renewal (the tie-break of concurrent claims)."""
    issued_at: float
    expires_at: float
    released: bool = False
    """Set when the holder gives the stage up (on stop): readers free the stage at once."""

    def is_live(self, now: float) -> bool:
        return not self.released and now < self.expires_at

    def sign(self, identity: Identity) -> bytes:
        if identity.peer_id != self.peer_id:
            raise RecordError(f"cannot sign a lease for {self.peer_id} with the key of {identity.peer_id}")
        return sign_record(identity, KIND, asdict(self))


def parse_lease(raw: object, *, run_id: str | None, now: float | None, peer_id: str | None = None) -> StageLease:
    """Verify and decode a lease (``run_id=None``/``now=None``: the DHT validator's any-run, no-clock check)."""
    record = open_record(raw, KIND, MAX_LEASE_BYTES)
    f = Fields(record.body, KIND)
    f.only({"run_id", "stage", "peer_id", "claimed_at", "issued_at", "expires_at", "released"})
    claimed, found_run = check_subject(f, record.signer, "lease", run_id=run_id, peer_id=peer_id)
    issued_at = f.number("issued_at", 0, 1e11)
    lease = StageLease(
        run_id=found_run,
        stage=f.integer("stage", 0, MAX_STAGES - 1),
        peer_id=claimed,
        claimed_at=f.number("claimed_at", 0, issued_at),
        issued_at=issued_at,
        expires_at=f.number("expires_at", issued_at, issued_at + MAX_LEASE_TTL_S),
        released=f.boolean("released"),
    )
    if now is not None and lease.issued_at > now + CLOCK_SKEW_S:
        raise RecordError(f"lease of {claimed} is issued {lease.issued_at - now:.0f} s in the future")
    return lease


def resolve_holder(leases: list[StageLease], now: float) -> StageLease | None:
    """The stage's holder by the one rule: earliest claim among live leases, then lowest peer ID."""
    live = [lease for lease in leases if lease.is_live(now)]
    return min(live, key=lambda lease: (lease.claimed_at, lease.peer_id), default=None)
