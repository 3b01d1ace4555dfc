"""What every lease of the task pool is: a signed, expiring claim by one peer, renewed while it
lives, released when it lets go. ``cells`` and ``servers`` add what is claimed."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import ClassVar

from swarmd.errors import RecordError
from swarmd.peers.records.envelope import sign_record
from swarmd.peers.records.identity import Identity


@dataclass(frozen=True, kw_only=True)
class Lease:
    KIND: ClassVar[str]
    run_id: str
    peer_id: str
    claimed_at: float
    """When the holder first claimed it; kept on renewal (the tie-break of concurrent claims)."""
    issued_at: float
    expires_at: float
    released: bool = False
    """Set when the holder lets go (it stops, or the assignment moved it): free at once."""

    def is_live(self, now: float) -> bool:
        return not self.released and now < self.expires_at

    def sign(self, identity: Identity) -> bytes:
        if identity.peer_id != self.peer_id:
            raise RecordError(f"cannot sign a {self.KIND} for {self.peer_id} with the key of {identity.peer_id}")
        return sign_record(identity, self.KIND, asdict(self))
