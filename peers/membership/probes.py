"""Which members a round of RTT probes pings.

Each ping costs the DHT process a dial (to a key with no node behind it, a timeout), so 500
heartbeat-only keys must not cost 500 pings a round: at most ``MAX_PROBES_PER_ROUND`` a round,
those pinged longest ago first. A swarm of a few dozen members is still timed every round.
"""

from __future__ import annotations

MAX_PROBES_PER_ROUND = 32


def probe_batch(members: list[str], probed_at: dict[str, float], limit: int) -> list[str]:
    """The ``limit`` members to ping this round: never pinged first, then those pinged longest
    ago (ties by ID, so that every member's turn comes)."""
    return sorted(members, key=lambda p: (p in probed_at, probed_at.get(p, 0.0), p))[:limit]
