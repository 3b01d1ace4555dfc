"""Who coordinates, and which plan every peer follows: rules every peer must compute alike.

There is no vote: each peer applies these to the same signed records (plans, and the
reliability and links in ``swarmd.node.swarm_view``) and reaches the same answer. The election
is sticky (``swarmd.peers.membership.election``): the publisher of the newest live plan stays
coordinator while it passes the thresholds, so plans do not change hands with noise.
"""

from __future__ import annotations

from swarmd.node.swarm_view import SwarmView
from swarmd.peers.membership.election import ElectionConfig, elect_coordinator
from swarmd.peers.records.plan_record import PlanRecord


def incumbent(plans: list[PlanRecord], live: set[str], now: float) -> str | None:
    """The coordinator every peer sees in the DHT: the live publisher of the newest unexpired
    plan (ties, as when two started at once: the lower peer ID)."""
    current = [p for p in plans if p.peer_id in live and p.expires_at > now]
    return min(current, key=lambda p: (-p.version, p.peer_id)).peer_id if current else None


def elect(
    view: SwarmView, plans: list[PlanRecord], live: set[str], now: float, thresholds: ElectionConfig
) -> str | None:
    """The coordinator among the ``live`` peers: the incumbent while it passes the thresholds."""
    candidates = [view.candidate(peer) for peer in sorted(live)]
    return elect_coordinator(candidates, incumbent(plans, live, now), thresholds)


def plan_to_follow(
    plans: list[PlanRecord],
    coordinator: str | None,
    own: str,
    own_published: PlanRecord | None,
    current: PlanRecord | None,
) -> PlanRecord | None:
    """The plan to follow: the elected coordinator's, else the highest version seen; ``current``
    while none is seen. When ``own`` coordinates, the plan it last published (``own_published``)
    counts before the DHT returns it."""
    if own_published is not None and coordinator == own:
        plans = [*plans, own_published]
    if not plans:
        return current
    ours = [p for p in plans if p.peer_id == coordinator]
    return max(ours or plans, key=lambda p: (p.version, p.issued_at))
