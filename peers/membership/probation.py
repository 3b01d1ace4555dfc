"""Who the coordinator may plan: members that proved to be running nodes, a few at a time.

Any key can publish a heartbeat, so membership alone must not put a peer in the plan: a burst
of 500 heartbeat-only keys (no node behind them) once made both daemons of a run plan 125
pipelines of Sybils and stop training. A member enters the plan only when the coordinator
itself (first hand: nothing a peer says of itself or of others counts here)

- has seen its heartbeat for ``probation_s`` (a few heartbeats: it stays), and
- found a node behind it: the peer answered this coordinator's own ping. (A links record once
  counted too, but it is the peer's word: five fresh keys with made-up links records were
  planned, and could then stand for election.)

and at most ``max(MIN_NEWCOMERS, NEWCOMER_FRACTION x planned)`` newcomers join per round, the
longest seen first: a flood of real nodes grows the plan by a quarter a round, not at once.
Members already in the plan in force stay while they live. A member whose heartbeat says it
is paused (the ``paused`` role: its owner, or its ``[limits]``, paused its work) is planned for
nothing, and left out of the next plan if it was in one; the coordinator itself too. This is the coordinator's own
choice of whom to plan, not an election: no other peer needs to reach the same answer.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

PROBATION_HEARTBEATS = 4
PROBATION_S = (4.0, 60.0)
"""The shortest and the longest probation (``probation_s``)."""
MIN_NEWCOMERS = 2
NEWCOMER_FRACTION = 0.25


def probation_s(heartbeat_s: float) -> float:
    """A newcomer's probation: ``PROBATION_HEARTBEATS`` heartbeats, within ``PROBATION_S``."""
    floor, ceiling = PROBATION_S
    return min(ceiling, max(floor, PROBATION_HEARTBEATS * heartbeat_s))


@dataclass(frozen=True)
class Plannable:
    peers: frozenset[str]
    """The members the coordinator may plan (itself included)."""
    waiting: int
    """Members still in probation or waiting for room."""
    no_node: int
    """Members past probation with no node found behind them (no ping of ours answered)."""


def plannable(
    members: Mapping[str, Mapping[str, Any]],
    planned: Collection[str],
    own: str,
    probation: float,
    own_works: bool = True,
) -> Plannable:
    """Which ``members`` (peer -> the membership view: ``roles``, ``seen_for_s``, ``rtt_ms``) the
    coordinator ``own`` may plan, by the module doc's rule; ``planned``: the devices of the
    plan in force."""
    workers = {p: view for p, view in members.items() if "paused" not in (view.get("roles") or ())}
    kept = {p for p in workers if p in planned}
    ready, waiting, no_node = [], 0, 0
    for peer, view in workers.items():
        if peer in kept:
            continue
        seen = float(view.get("seen_for_s") or 0.0)
        if seen < probation:
            waiting += 1
        elif view.get("rtt_ms") is None:
            no_node += 1
        else:
            ready.append((-seen, peer))
    room = max(MIN_NEWCOMERS, int(NEWCOMER_FRACTION * len(kept)))
    admitted = [peer for _, peer in sorted(ready)[:room]]
    waiting += max(0, len(ready) - room)
    return Plannable(frozenset({*([own] if own_works else []), *kept, *admitted}), waiting, no_node)
