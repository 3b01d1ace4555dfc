"""Shard leases: which server holds which shard (stage s, shard k), and who may take one over.

A server holds a shard through a signed, expiring lease stored under ``swarmd/<run>/shards/<s>``
(the holder's peer ID as subkey), renewed every round with its current **version** and its
**standby** (the peer it logs every step at). Readers settle each shard by one rule
(``resolve_shards``):

1. A lease counts only when it is live, its signer is a live member of the run, and its shard
   count is the assignment's (a lease from another sharding is void).
2. The server the assignment in force names holds the shard once it has a lease there.
3. While the named server is not a live member, the shard may be held by the standby that the
   last rightful holder named, and by nobody else: its lease carries that holder's signed
   lease as ``proof``. (The coordinator's repair then names a server; it prefers that standby.)

A checkpoint or a replica is taken only from the previous rightful holder or its named
standby, and never at a version more than ``MAX_UNSEEN_STEPS`` past the highest version a
rightful holder's signed lease has shown (``SeenVersions``): a rightful holder renews every
few seconds, so a replica far past its last lease is a lie, whoever offers it.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Mapping, Set
from dataclasses import dataclass
from typing import Any, ClassVar, Self

from swarmd.errors import RecordError
from swarmd.peers.records.envelope import Fields
from swarmd.peers.records.signed import Head
from swarmd.peers.taskpool.lease import Lease

KIND = "shard-lease"
MAX_LEASE_BYTES = 8192
"""Room for the lease and, in a take-over, the previous holder's lease as proof."""
MAX_STAGES = 1024
MAX_SHARDS = 4096
MAX_VERSION = 2**40
MAX_UNSEEN_STEPS = 1000
MAX_STEPS_PER_S = 50.0
"""The fastest a shard's version can honestly rise (a small model on a GPU makes a few updates
a second): ``SeenVersions`` believes no faster rise between two readings."""
PROOF_MAX_AGE_S = 900.0
"""A take-over's proof must have been issued at most this long before the claim."""

Shard = tuple[int, int]
"""(stage, shard index)."""


@dataclass(frozen=True, kw_only=True)
class ShardLease(Lease):
    KIND: ClassVar[str] = KIND
    MAX_BYTES: ClassVar[int] = MAX_LEASE_BYTES
    stage: int
    shard: int
    shards: int
    """K: the stage's shard count under which the lease was taken."""
    version: int
    """The holder's current version (what the swarm has seen)."""
    standby: str = ""
    """The peer this holder logs every step at: the one that may take the shard over."""
    proof: str = ""
    """For a take-over: the last rightful holder's signed lease naming this peer its standby
    (base64 of the record)."""

    @property
    def key(self) -> Shard:
        return (self.stage, self.shard)

    @classmethod
    def parse(cls, raw: object, *, run_id: str | None, now: float | None, peer_id: str | None = None) -> Self:
        """``SignedRecord.parse``, and a proof, when present, must itself be a valid lease of the
        same shard and run that names this lease's signer its standby, issued before the claim
        and not long before."""
        lease = super().parse(raw, run_id=run_id, now=now, peer_id=peer_id)
        if lease.proof:
            claimed = lease.peer_id
            previous = proof_of(lease)
            if previous.proof:
                raise RecordError(f"shard lease of {claimed}: a proof may not carry a proof of its own")
            if (previous.run_id, previous.key, previous.shards) != (lease.run_id, lease.key, lease.shards):
                raise RecordError(f"shard lease of {claimed}: its proof is for another shard")
            if previous.standby != claimed or previous.peer_id == claimed:
                raise RecordError(f"shard lease of {claimed}: its proof does not name it the standby")
            if not lease.claimed_at - PROOF_MAX_AGE_S <= previous.issued_at <= lease.claimed_at + 1.0:
                raise RecordError(f"shard lease of {claimed}: its proof was not issued just before the claim")
        return lease

    @classmethod
    def _read_claim(cls, f: Fields, head: Head) -> dict[str, Any]:
        shards = f.integer("shards", 1, MAX_SHARDS)
        return {
            "stage": f.integer("stage", 0, MAX_STAGES - 1),
            "shard": f.integer("shard", 0, shards - 1),
            "shards": shards,
            "version": f.integer("version", 0, MAX_VERSION),
            "standby": f.string("standby", 128),
            "proof": f.string("proof", 4 * MAX_LEASE_BYTES // 3 + 4),
        }


def proof_of(lease: ShardLease) -> ShardLease:
    """The previous holder's lease a take-over carries (checked, expired or not)."""
    try:
        raw = base64.b64decode(lease.proof, validate=True)
    except ValueError:
        raise RecordError("shard lease proof is not base64") from None
    return ShardLease.parse(raw, run_id=lease.run_id, now=None)


def encode_proof(raw_lease: bytes) -> str:
    return base64.b64encode(raw_lease).decode()


def resolve_shards(
    leases: Iterable[ShardLease], named: Mapping[Shard, str], shards: Mapping[int, int], live: Set[str], now: float
) -> dict[Shard, ShardLease]:
    """Who holds each shard of ``named`` (the assignment's servers), by the module doc's rule.
    ``shards[s]`` is stage ``s``'s shard count in the assignment."""
    holders: dict[Shard, ShardLease] = {}
    takeovers: dict[Shard, list[ShardLease]] = {}
    for lease in leases:
        if not lease.is_live(now) or lease.peer_id not in live or lease.key not in named:
            continue
        if lease.shards != shards.get(lease.stage):
            continue
        if named[lease.key] == lease.peer_id:
            holders[lease.key] = lease
        elif named[lease.key] not in live and lease.proof and proof_of(lease).peer_id not in live:
            takeovers.setdefault(lease.key, []).append(lease)  # the holder it takes over from is gone
    for key, claims in takeovers.items():
        if key not in holders:
            holders[key] = min(claims, key=lambda x: (x.claimed_at, x.peer_id))
    return holders


class SeenVersions:
    """The highest version each shard's rightful holders have shown in their signed leases:
    the bound on any checkpoint or replica a new holder may take (``MAX_UNSEEN_STEPS`` past it).

    This peer's own leases are not counted: a lease it publishes for a shard it does not serve
    yet shows this very bound (or its last checkpoint's version), so counting it would anchor the
    bound on what this peer already had. A restarted peer named a shard's server did just that:
    its fresh lease at version 0 was taken at its word, the live holder's lease at 70 could then
    raise the bound by one step, and it opened the shard from its own checkpoint of version 9
    (CI: "shard (1, 0): 70 -> 9")."""

    def __init__(self, own: str = "") -> None:
        self.own = own
        self._seen: dict[Shard, tuple[int, float]] = {}  # shard -> (version, when noted)

    def note(self, holders: Mapping[Shard, ShardLease], now: float) -> None:
        """The first lease read of a shard is taken at its word (a peer that just joined knows
        nothing older); after it, the bound grows by at most ``MAX_STEPS_PER_S`` a second: a
        holder's lease at version 10^6 moves it by a few steps, so that a take-over does not
        wait for a state nobody has."""
        for key, lease in holders.items():
            if lease.peer_id == self.own:
                continue
            known = self._seen.get(key)
            if known is None:
                self._seen[key] = (lease.version, now)
            elif lease.version > known[0]:
                most = known[0] + max(1, int(MAX_STEPS_PER_S * max(0.0, now - known[1])))
                self._seen[key] = (min(lease.version, most), now)

    def of(self, key: Shard) -> int:
        return self._seen.get(key, (0, 0.0))[0]

    def admits(self, key: Shard, version: int) -> bool:
        """Whether a checkpoint or replica at ``version`` may be believed."""
        return 0 <= version <= self.of(key) + MAX_UNSEEN_STEPS
