"""Elected roles: who may serve as coordinator, shard server (its standby) or relay.

Pure functions over a snapshot (each peer's measured reliability and connectivity), so that
every peer elects the same way. Roles are held through leases in the DHT (a shard's lease,
``swarmd.peers.taskpool.servers``; the plan record for the coordinator) that expire unless
renewed; what is decided here is who *should* hold them:

- **Eligibility**: a newcomer to a role needs ``min_reliability`` (relays:
  ``min_relay_reliability``) and ``min_connectivity_Bps``; an incumbent keeps the role down to
  the thresholds less ``hysteresis`` (reliability) or less the same fraction (connectivity).
  Measurements wobble; roles must not flap with them.
- **Seniority**: how long the others have seen a peer up (``observed_up_s``, never the peer's
  own word), in classes a factor of two wide from ``SENIOR_S`` (``seniority``). With nobody
  eligible it decides before the peer ID, so that a fresh key, or a burst of them, never wins a
  role from members the swarm has watched for longer; the classes are wide so that peers whose
  copies of the observations differ by a scan still agree.
- **Coordinator**: the incumbent (who it is: ``swarmd.node.plan_choice``, from the plans every
  peer reads alike) stays while eligible; a challenger never displaces an eligible incumbent.
  Otherwise the best eligible peer by reliability, then connectivity, then the lowest peer ID.
  With nobody eligible (a swarm of newcomers), the incumbent stays, or else the most senior,
  then the lowest peer ID: a swarm must still be planned.
- **Relays**: incumbents that stay eligible keep their role; vacancies go first to eligible
  peers the planner would route through, then to the best eligible peers, up to the number
  wanted (``relays_wanted``); with nobody eligible, one peer serves anyway, the most senior
  (``elect_relays``).
- **A shard server's standby** (the peer it logs every step at and checkpoints to): the peer
  other than the server likeliest to stay, by reliability, then the fastest link from the
  server (it waits for every step's log there), then observed uptime, then the lowest peer ID;
  with nobody reliable enough to be eligible, seniority first (``elect_standby``).

The simulator (``swarmd.peers.sim.simulator``) elects with these same functions.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

COORDINATION_ROUND_S = (4.0, 10.0)
"""The shortest and the longest round of coordination (``coordination_round_s``)."""
SENIOR_S = 60.0
"""Observed uptime below this is seniority 0 (a newcomer); each doubling above it is one class."""


def coordination_round_s(heartbeat_s: float) -> float:
    """How often a daemon runs its round of coordination (elects, and plans when it is the
    coordinator): two heartbeats, within ``COORDINATION_ROUND_S``. Elections read the
    heartbeats: a round between two of them would find nothing new."""
    floor, ceiling = COORDINATION_ROUND_S
    return min(ceiling, max(floor, 2 * heartbeat_s))


@dataclass(frozen=True)
class ElectionConfig:
    min_reliability: float = 0.5
    min_relay_reliability: float = 0.6
    min_connectivity_Bps: float = 1e6
    hysteresis: float = 0.1


@dataclass(frozen=True)
class RoleCandidate:
    peer_id: str
    reliability: float
    """0..1, as others observed the peer (``swarmd.peers.membership.reliability``)."""
    connectivity_Bps: float
    """Median measured bandwidth from the peer to the others."""
    observed_up_s: float = 0.0
    """How long others saw the peer up (``Reliability.observed_up_s``); 0 when nobody says."""


def seniority(observed_up_s: float) -> int:
    """The class of a peer's observed uptime: 0 below ``SENIOR_S``, then one more per doubling."""
    if not observed_up_s >= SENIOR_S or not math.isfinite(observed_up_s):
        return 0
    return 1 + int(math.floor(math.log2(observed_up_s / SENIOR_S)))


def eligible(candidate: RoleCandidate, thresholds: ElectionConfig, incumbent: bool, *, relay: bool = False) -> bool:
    need = thresholds.min_relay_reliability if relay else thresholds.min_reliability
    need_bw = thresholds.min_connectivity_Bps
    if incumbent:
        need -= thresholds.hysteresis
        need_bw *= 1.0 - thresholds.hysteresis
    return candidate.reliability >= need and candidate.connectivity_Bps >= need_bw


def _rank(c: RoleCandidate) -> tuple[float, float, str]:
    return (-c.reliability, -c.connectivity_Bps, c.peer_id)


def elect_coordinator(
    candidates: Sequence[RoleCandidate], current: str | None, thresholds: ElectionConfig
) -> str | None:
    """The coordinator for this snapshot (module doc); None only when there is no candidate."""
    by_id = {c.peer_id: c for c in candidates}
    if current in by_id and eligible(by_id[current], thresholds, incumbent=True):
        return current
    ranked = sorted(candidates, key=_rank)
    for c in ranked:
        if eligible(c, thresholds, incumbent=False):
            return c.peer_id
    if current in by_id:
        return current  # nobody passes: keep whoever plans now rather than hand it round
    # Nobody passes and nobody plans: the most senior, then the lowest peer ID. Among newcomers
    # the measured figures are noise, and peers whose views differ by that noise must still pick
    # the same one; seniority's classes are wide, and a fresh key is never senior.
    best = min(candidates, key=lambda c: (-seniority(c.observed_up_s), c.peer_id), default=None)
    return None if best is None else best.peer_id


def elect_relays(
    candidates: Sequence[RoleCandidate],
    current: Sequence[str],
    thresholds: ElectionConfig,
    want: int,
    preferred: Sequence[str] = (),
) -> list[str]:
    """Up to ``want`` relays: eligible incumbents first (kept), then eligible peers the planner
    prefers (some pipeline link is faster through them), then the best eligible others.

    With nobody eligible (a swarm of newcomers, whose scores are still near the prior), the
    incumbents still live are kept, or else the most senior candidate (then the planner's
    choice, then the best-ranked) serves alone: peers that cannot reach each other need a path
    before anyone has proven reliable, and a burst of fresh keys must not provide it. Only the
    coordinator elects relays and publishes them in its plan, so ranking on noisy newcomer
    figures cannot make two peers disagree."""
    if want <= 0:
        return []
    by_id = {c.peer_id: c for c in candidates}
    kept = [p for p in current if p in by_id and eligible(by_id[p], thresholds, incumbent=True, relay=True)]
    ranked = [p for p in preferred if p in by_id] + [c.peer_id for c in sorted(candidates, key=_rank)]
    newcomers = [
        p
        for p in dict.fromkeys(ranked)
        if p not in kept and eligible(by_id[p], thresholds, incumbent=False, relay=True)
    ]
    chosen = (kept + newcomers)[:want]
    if chosen:
        return chosen
    live = [p for p in current if p in by_id]
    if live:
        return live[:want]
    planned = set(preferred)
    senior = min(
        candidates, key=lambda c: (-seniority(c.observed_up_s), c.peer_id not in planned, *_rank(c)), default=None
    )
    return [] if senior is None else [senior.peer_id]


def relays_wanted(members: int) -> int:
    """How many relays a swarm of ``members`` elects: none below three (a relay is a third
    peer between two), then one per 16 members."""
    return 0 if members < 3 else max(1, members // 16)


def elect_standby(candidates: Iterable[tuple[str, float, float, float]], min_reliability: float) -> str | None:
    """The standby among ``(peer ID, reliability, observed_up_s, bandwidth_Bps from the server)``
    of the peers other than the shard server: the highest reliability as others measured it
    (callers round it: finer differences are noise), then the fastest link from the server (by
    ``link_class``: within a factor of two, links are equal), then the longest uptime as others
    observed it, then the lowest peer ID. None when there is nobody.

    The link comes before uptime because the server logs every step at its standby before it
    counts: a standby on a slow link holds the whole stage back (in a calibration run, a
    10 Mbit/s standby beside 40 Mbit/s peers halved the swarm's throughput).

    With nobody at ``min_reliability`` (a young swarm: every score still rounds to about 0),
    ``seniority`` comes first: a fresh key scores as low as a member watched for minutes, and
    a burst of them must not win the standby (and with it every checkpoint) on a link or an ID."""
    listed = list(candidates)
    trusted = any(c[1] >= min_reliability for c in listed)
    best = min(
        listed,
        key=lambda c: (0 if trusted else -seniority(c[2]), -c[1], -link_class(c[3]), -c[2], c[0]),
        default=None,
    )
    return None if best is None else best[0]


def link_class(bandwidth_Bps: float) -> int:
    """A bandwidth's class, a factor of two wide: links within one are equal for electing a
    standby. Measurements wobble from round to round, and the standby must not flap with them
    (each new standby gets a whole checkpoint), nor differ between the server and a peer that
    works out the server's standby from its own copy of the matrix. 0 for an unknown link."""
    return int(math.floor(math.log2(bandwidth_Bps))) if bandwidth_Bps >= 1.0 and math.isfinite(bandwidth_Bps) else 0
