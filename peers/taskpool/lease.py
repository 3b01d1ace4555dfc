"""What every lease of the task pool is.

A signed, expiring claim by one peer, renewed while it lives, released when it lets go.
``cells`` and ``servers`` add what is claimed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from swarmd.peers.records.envelope import Fields
from swarmd.peers.records.signed import Head, SignedRecord

MAX_LEASE_TTL_S = 600.0
"""A holder renews every few seconds; a lease that outlives a dead holder by much stalls its cell."""


@dataclass(frozen=True, kw_only=True)
class Lease(SignedRecord):
    MAX_TTL_S: ClassVar[float] = MAX_LEASE_TTL_S
    claimed_at: float
    """When the holder first claimed it; kept on renewal (the tie-break of concurrent claims)."""
    released: bool = False
    """Set when the holder lets go (it stops, or the assignment moved it): free at once."""

    def is_live(self, now: float) -> bool:
        return not self.released and now < self.expires_at

    @classmethod
    def _read_fields(cls, f: Fields, head: Head) -> dict[str, Any]:
        # What is claimed is read first, then the claim's own time and state.
        return {
            **cls._read_claim(f, head),
            "claimed_at": f.number("claimed_at", 0, head.issued_at),
            "released": f.boolean("released"),
        }

    @classmethod
    def _read_claim(cls, f: Fields, head: Head) -> dict[str, Any]:
        """The fields of what the lease claims (a cell, a shard), read from ``f``."""
        raise NotImplementedError(f"{cls.__name__} must read what it claims")
