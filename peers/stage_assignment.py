"""Which stages this peer should host: fair shares, settled the same way by every peer.

Each of a run's stages is hosted by one peer (its parameter server and task queue), named by
the stage's lease (``swarmd.peers.stage_leases``). Hosting moves as training peers come and
go, by a rule every peer evaluates on the same snapshot (live leases, live training members):

- A fair share is ``ceil(stages / trainers)``: a peer alone hosts every stage; with as many
  trainers as stages, each hosts one; the rest only work.
- A peer hosting more than its share gives up one stage per round (its highest), so that a
  newcomer takes it over; a peer within its share keeps what it holds (no flapping).
- A free stage goes to the trainer that hosts fewest stages, ties to the longest uptime (the
  likeliest to stay), then the lowest peer ID. Only that peer claims it at first; once a stage
  has stayed free for ``grace_s`` (its designated claimant is slow or gone), anyone may, and the
  lease rule settles concurrent claims.
- The run's *epoch* names who hosts what; when it changes, work in flight is re-queued from the
  data (``swarmd.stage_host``), so every host must agree on it: it hashes the holders and their
  claim times, which every reader sees alike.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass

from swarmd.peers.stage_leases import StageLease


@dataclass(frozen=True)
class Trainer:
    peer_id: str
    uptime_s: float


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
) -> Decision:
    """What ``own`` should claim and release, given each stage's holder (None: free), the live
    training members (``own`` among them or not), and how long each free stage has been free."""
    everyone = {t.peer_id: t for t in trainers}
    everyone.setdefault(own, Trainer(own, 0.0))
    share = fair_share(len(holders), len(everyone))
    held: dict[str, list[int]] = {p: [] for p in everyone}
    for stage, lease in enumerate(holders):
        if lease is not None:
            held.setdefault(lease.peer_id, []).append(stage)
    mine = held[own]
    release = (max(mine),) if len(mine) > share else ()
    counts = {p: len(held.get(p, [])) for p in everyone}
    claim = []
    for stage, lease in enumerate(holders):
        if lease is not None:
            continue
        designated = min(everyone.values(), key=lambda t: (counts[t.peer_id], -t.uptime_s, t.peer_id))
        counts[designated.peer_id] += 1
        if designated.peer_id == own:
            claim.append(stage)
        elif free_for_s[stage] >= grace_s and counts[own] < share:
            claim.append(stage)  # the designated peer is slow or gone: anyone within its share may
            counts[own] += 1
    return Decision(claim=tuple(claim), release=release)


def epoch_of(holders: Sequence[StageLease | None]) -> str | None:
    """The name of the current hosting (None while a stage is free): changes with any holder."""
    if any(lease is None for lease in holders):
        return None
    text = "|".join(f"{lease.peer_id}@{lease.claimed_at!r}" for lease in holders if lease is not None)
    return hashlib.sha256(text.encode()).hexdigest()[:16]
