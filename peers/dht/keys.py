"""The DHT keys of one run's records, in one place (``swarmd/<run id>/…``).

Key names only: which record may sit under which key is the validator's
(``swarmd.peers.dht.swarm_dht``). Pure functions, so that anything may import them without
loading hivemind.
"""

from __future__ import annotations

import hashlib

MEMBER_BUCKETS = 16
"""Heartbeats are spread over this many keys by a hash of the peer ID: one read returns one
bucket, never every member's heartbeat in one value."""


def spec_key(run_id: str) -> str:
    return f"swarmd/{run_id}/spec"


def member_bucket(peer_id: str) -> int:
    """The bucket of ``peer_id``'s heartbeat (the same on every peer: a hash, not a lookup)."""
    return int.from_bytes(hashlib.sha256(peer_id.encode()).digest()[:4], "big") % MEMBER_BUCKETS


def members_key(run_id: str, bucket: int) -> str:
    """The key of one bucket of the run's heartbeats (``member_bucket`` of the peer)."""
    return f"swarmd/{run_id}/members/{bucket}"


def cells_key(run_id: str, pipeline: int, stage: int) -> str:
    """One key per cell: a peer alone holds every cell of its pipeline, one lease each."""
    return f"swarmd/{run_id}/cells/{pipeline}/{stage}"


def shards_key(run_id: str, stage: int) -> str:
    return f"swarmd/{run_id}/shards/{stage}"


def links_key(run_id: str) -> str:
    return f"swarmd/{run_id}/links"


def plan_key(run_id: str) -> str:
    """The key of the plans' manifests, one per coordinator (its peer ID the subkey)."""
    return f"swarmd/{run_id}/plan"


def plan_part_key(run_id: str, digest: str) -> str:
    """The key of the plan part whose SHA-256 is ``digest`` (hex): a plain value that the
    validator stores only under the digest of its own bytes."""
    return f"swarmd/{run_id}/plan-part/{digest}"


def observations_key(run_id: str) -> str:
    return f"swarmd/{run_id}/observations"
