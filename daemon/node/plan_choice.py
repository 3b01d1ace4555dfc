"""Who coordinates, and which plan every peer follows: rules every peer must compute alike.

There is no vote: each peer applies these to the same signed records (plans, and the
reliability and links in ``swarmd.node.swarm_view``) and reaches the same answer. Anyone who
knows the run ID can sign a plan and a heartbeat, so a plan is only a claim:

- **Screening** (``screen``): a plan counts only from a live member, and only within
  ``MAX_PLAN_STEP`` versions of the plan this peer follows now (a plan far ahead is a bid to
  outnumber every honest plan to come). A peer that follows no plan yet (it just joined) has
  nothing to step from: it takes the version the elected coordinator publishes, and the
  election below is what keeps a stranger from being that coordinator.
- **The incumbent** (``incumbent``), whom the sticky election keeps
  (``swarmd.peers.membership.election``): among the live publishers of screened, unexpired
  plans, those eligible to keep the role (reliable as *others* observed them) come first, the
  newest plan's publisher among them; a stranger's key is not eligible, whatever version it
  signs. With none eligible (a young swarm), the most senior publisher (observed uptime, in
  wide classes), then the lowest peer ID: a fresh key cannot outrank members watched longer.
- **Who may stand** at all is ``swarmd.peers.membership.standing``'s: with a plan in force, its
  members; before any, the run's creator; a coordinator that never plans is passed over.
- **Following** (``plan_to_follow``): only the elected coordinator's plan; the plan in force
  while the coordinator has published none. Every plan passed over, and why, is returned so
  that the status can count it.
"""

from __future__ import annotations

from dataclasses import dataclass

from swarmd.node.swarm_view import SwarmView
from swarmd.peers.membership.election import ElectionConfig, elect_coordinator, eligible, seniority
from swarmd.peers.records.plan_record import PlanRecord

MAX_PLAN_STEP = 1000
"""How far past the plan in force a plan's version may be. A coordinator publishes at most one
version a round (4 to 10 s), so this is over an hour of plans: a peer away longer than that
has seen its plan expire, and then steps from nothing."""

NOT_MEMBER = "not_member"
VERSION_JUMP = "version_jump"
NOT_COORDINATOR = "not_coordinator"


@dataclass(frozen=True)
class PlanRefusal:
    """A plan passed over: by whom, which version, and why (one of the reasons above)."""

    peer_id: str
    version: int
    reason: str


def screen(
    plans: list[PlanRecord], live: set[str], current: PlanRecord | None, now: float
) -> tuple[list[PlanRecord], list[PlanRefusal]]:
    """The plans that may count (module doc), and those refused. Only a plan newer than the
    one in force is counted as refused: the plan of a coordinator that has left stays in the
    DHT until it expires, and passing it over is no event."""
    base = current.version if current is not None and current.expires_at > now else None
    admitted: list[PlanRecord] = []
    refused: list[PlanRefusal] = []
    for p in plans:
        if p.peer_id not in live:
            if base is None or p.version > base:
                refused.append(PlanRefusal(p.peer_id, p.version, NOT_MEMBER))
        elif base is not None and p.version > base + MAX_PLAN_STEP:
            refused.append(PlanRefusal(p.peer_id, p.version, VERSION_JUMP))
        else:
            admitted.append(p)
    return admitted, refused


def within_reach(plans: list[PlanRecord], in_force: PlanRecord | None) -> list[PlanRecord]:
    """The plans a new coordinator must outnumber: those within ``MAX_PLAN_STEP`` of the plan in
    force (none while there is none). A plan beyond is refused by every follower, and so must
    not carry the coordinator's next version out of reach (or past the largest a record holds)."""
    if in_force is None:
        return []
    return [p for p in plans if p.version <= in_force.version + MAX_PLAN_STEP]


def incumbent(
    view: SwarmView, plans: list[PlanRecord], live: set[str], now: float, thresholds: ElectionConfig
) -> str | None:
    """The coordinator the swarm follows now, as every peer reads the screened plans (module
    doc); None when no live (electable) peer has an unexpired plan."""
    current = [p for p in plans if p.peer_id in live and p.expires_at > now]
    established = [p for p in current if eligible(view.candidate(p.peer_id), thresholds, incumbent=True)]
    if established:  # two that published the same version at once: the lower peer ID
        return min(established, key=lambda p: (-p.version, p.peer_id)).peer_id
    senior = min(current, key=lambda p: (-seniority(view.candidate(p.peer_id).observed_up_s), p.peer_id), default=None)
    return None if senior is None else senior.peer_id


def elect(
    view: SwarmView,
    plans: list[PlanRecord],
    live: set[str],
    now: float,
    thresholds: ElectionConfig,
    electable: frozenset[str] | None = None,
) -> str | None:
    """The coordinator among the ``live`` peers that are ``electable`` (None: all of them;
    ``swarmd.peers.membership.standing``), from screened ``plans``: the incumbent while it
    passes the thresholds (``swarmd.peers.membership.election.elect_coordinator``). A plan's
    publisher that may not be elected is no incumbent either, whatever it signed."""
    running = live if electable is None else live & electable
    candidates = [view.candidate(peer) for peer in sorted(running)]
    return elect_coordinator(candidates, incumbent(view, plans, running, now, thresholds), thresholds)


def plan_to_follow(
    plans: list[PlanRecord],
    coordinator: str | None,
    own: str,
    own_published: PlanRecord | None,
    current: PlanRecord | None,
) -> tuple[PlanRecord | None, list[PlanRefusal]]:
    """The plan to follow among screened ``plans``: the elected coordinator's newest (the later
    issued of one version), else ``current``; with the newer plans of anyone else, refused.
    When ``own`` coordinates, the plan it last published (``own_published``) counts before the
    DHT returns it."""
    if own_published is not None and coordinator == own:
        plans = [*plans, own_published]
    ours = [p for p in plans if p.peer_id == coordinator]
    chosen = max(ours, key=lambda p: (p.version, p.issued_at)) if ours else current
    floor = -1 if chosen is None else chosen.version
    refused = [
        PlanRefusal(p.peer_id, p.version, NOT_COORDINATOR)
        for p in plans
        if p.peer_id != coordinator and p.version > floor
    ]
    return chosen, refused
