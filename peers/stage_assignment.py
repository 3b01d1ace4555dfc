"""Which stages this peer should host: fair shares, settled the same way by every peer.

Each of a run's stages is hosted by one peer (its parameter server and task queue), named by
the stage's lease (``swarmd.peers.stage_leases``). Hosting moves as training peers come and
go, by a rule every peer evaluates on the same snapshot (live leases, live training members):

- A fair share is ``ceil(stages / trainers)``: a peer alone hosts every stage; with as many
  trainers as stages, each hosts one; the rest only work.
- A peer hosting more than its share gives up one stage per round (its highest), so that a
  newcomer takes it over; a peer within its share keeps what it holds (no flapping).
- Only trainers that pass the election's thresholds host (``Trainer.eligible``: measured
  reliability and connectivity, with hysteresis for incumbents), unless none does.
- A stage claimed before the swarm had a plan is provisional: once the plan names its
  parameter server, and that peer is an eligible trainer with room, the holder hands it over.
- A stage held by another peer than the plan's parameter server goes there too, once the plan
  has named that server for ``HAND_OVER_SETTLED_S`` and the holder has held the stage for
  ``HAND_OVER_HELD_S`` (``follows_plan``): the planner put the server where the stage's
  traffic is cheapest (every tensor of the stage passes through its host), a first plan made
  before the links were measured may have named the holder, and a failover leaves the stage
  at the old host's standby. The two waits keep a stage from following a plan that is about
  to change, or from moving again soon after it moved; a hand-over costs the work in flight
  (re-queued) and the new host's fetch of the checkpoint, no gradient.
- A free stage goes first to its preferred peer (the standby that holds its replica when its
  holder left, so that it takes over; else the plan's parameter server), else to the
  eligible trainer that hosts fewest stages, ties to the highest
  measured reliability, then the longest uptime, then the lowest peer ID. Only that peer
  claims it at first; once a stage has stayed free for ``grace_s`` (its designated claimant
  is slow or gone), any eligible peer within its share may, and the lease rule settles
  concurrent claims.
- The run's *epoch* names who hosts what; when it changes, work in flight is re-queued from the
  data (``swarmd.stage_host``), so every host must agree on it: it hashes the holders and their
  claim times, which every reader sees alike.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from swarmd.peers.stage_leases import StageLease

HAND_OVER_SETTLED_S = 20.0
"""How long the plan must have named a stage's server before the holder hands the stage there."""
HAND_OVER_HELD_S = 60.0
"""How long a holder keeps a stage before it hands it to the plan's server."""
HAND_OVER_AGAIN_S = 600.0
"""How long a holder waits before it hands a stage to the same peer again: one whose plan
differs from the holder's need not claim it, and the holder may take it back after the grace;
without this wait the two would pass it to and fro, each time redoing the work in flight."""


def follows_plan(holder: str, planned: str | None, planned_for_s: float, held_for_s: float,
                 since_handed_to_it_s: float = math.inf) -> bool:  # fmt: skip
    """Whether ``holder`` should hand its stage to ``planned``, the server the plan names, which
    it has named for ``planned_for_s`` while the holder has held the stage ``held_for_s`` and
    last handed it to that peer ``since_handed_to_it_s`` ago (module doc; ``decide`` then hands
    it over when that peer has room)."""
    return (
        planned is not None and planned != holder
        and planned_for_s >= HAND_OVER_SETTLED_S and held_for_s >= HAND_OVER_HELD_S
        and since_handed_to_it_s >= HAND_OVER_AGAIN_S
    )  # fmt: skip


@dataclass(frozen=True)
class Trainer:
    peer_id: str
    uptime_s: float
    reliability: float = 0.0
    """Measured by others (``swarmd.peers.reliability``): what orders who gets a free stage."""
    eligible: bool = True
    """Passes the election's thresholds for hosting (``swarmd.peers.election.eligible``)."""


@dataclass(frozen=True)
class Decision:
    claim: tuple[int, ...]
    """Free stages this peer should claim now."""
    release: tuple[int, ...]
    """Stages this peer hosts and should hand over."""


def fair_share(stages: int, trainers: int) -> int:
    return math.ceil(stages / max(1, trainers))


def decide(
    own: str,
    holders: Sequence[StageLease | None],
    trainers: Sequence[Trainer],
    free_for_s: Sequence[float],
    grace_s: float,
    preferred: Sequence[str | None] | None = None,
    provisional: Collection[int] = (),
) -> Decision:
    """What ``own`` should claim and release, given each stage's holder (None: free), the live
    training members (``own`` among them or not), how long each free stage has been free, and
    for each stage the peer it should go to first when free (its standby, who holds its
    replica; or the plan's parameter server), if any.

    Only eligible trainers host, unless none is (a swarm of newcomers must still train). An
    ineligible holder hands a stage over, one per round, while an eligible trainer has room.
    ``provisional``: stages ``own`` should hand to their preferred peer (the plan's server):
    those claimed before any plan placed the parameter servers, and those ``follows_plan``
    says should follow it. Each goes there as soon as that peer is an eligible trainer with
    room, or holds a stage the plan gives ``own`` (a swap)."""
    everyone = {t.peer_id: t for t in trainers}
    everyone.setdefault(own, Trainer(own, 0.0))
    hosts = {p: t for p, t in everyone.items() if t.eligible} or everyone
    share = fair_share(len(holders), len(hosts))
    held: dict[str, list[int]] = {p: [] for p in everyone}
    for stage, lease in enumerate(holders):
        if lease is not None:
            held.setdefault(lease.peer_id, []).append(stage)
    mine = held[own]
    counts = {p: len(held.get(p, [])) for p in hosts}
    if own not in hosts:
        room = any(c < share for c in counts.values())
        return Decision(claim=(), release=(max(mine),) if mine and room else ())

    def first_choice(stage: int) -> str | None:
        return preferred[stage] if preferred is not None else None

    def misplaced(peer: str) -> bool:
        """Whether ``peer`` holds a stage that should go to another peer: it may free room."""
        return any(first_choice(stage) not in (None, peer) for stage in held.get(peer, []))

    # Over its share, a peer hands over first a stage that should go to another peer anyway.
    release = [max(mine, key=lambda stage: (first_choice(stage) != own, stage))] if len(mine) > share else []
    for stage in mine:
        first = first_choice(stage)
        if stage not in provisional or stage in release or first is None or first == own or first not in hosts:
            continue
        # The planned server has room, or holds a stage the plan gives us: the two swap (each
        # side that claimed before the plan lets go; each freed stage waits for its server).
        if counts[first] < share or any(first_choice(t) == own for t in held.get(first, [])):
            release.append(stage)
            counts[first] += 1
    claim = []
    for stage, lease in enumerate(holders):
        if lease is not None:
            continue
        first = first_choice(stage)
        # The preferred peer gets the stage if it has room, or may make room (until the grace).
        if first in hosts and (counts[first] < share or misplaced(first)):  # type: ignore[index]
            designated = hosts[first]  # type: ignore[index]
        else:
            designated = min(hosts.values(), key=lambda t: (counts[t.peer_id], -t.reliability, -t.uptime_s, t.peer_id))
        counts[designated.peer_id] += 1
        if designated.peer_id == own:
            claim.append(stage)
        elif free_for_s[stage] >= grace_s and counts[own] < share:
            claim.append(stage)  # the designated peer is slow or gone: anyone within its share may
            counts[own] += 1
    return Decision(claim=tuple(claim), release=tuple(release))


def epoch_of(holders: Sequence[StageLease | None]) -> str | None:
    """The name of the current hosting (None while a stage is free): changes with any holder."""
    if any(lease is None for lease in holders):
        return None
    text = "|".join(f"{lease.peer_id}@{lease.claimed_at!r}" for lease in holders if lease is not None)
    return hashlib.sha256(text.encode()).hexdigest()[:16]
