"""Who may be elected at all, and whose word counts in the election: what a role costs to win.

Any key can publish heartbeats, observations and a links record, so none of them alone may
make a peer electable: five fresh keys that published made-up observations of each other and a
made-up links record were once elected coordinator within 4 s, and a newcomer whose peer ID
sorted first became coordinator before the first plan existed and never planned. The rules,
pure so that every peer applies them alike to what it reads:

- **Trusted observers** (``trusted_observers``): while a plan is in force, only the members it
  names (and the run's creator) are believed about the others' uptime and links. A place in a
  plan is earned: the coordinator planned the peer only after its own probation and after it
  found a node behind the key (``swarmd.peers.membership.probation``), and a planned peer that
  does no work is replanned out. Each observer counts once (one record per key, the DHT's
  subkey), and never about itself. Before any plan, every live observer counts.
- **Electable** (``electable``): while a plan is in force, only its live members; among them,
  those that the trusted observers saw up for a probation first (a peer just planned must not
  outrank those watched for longer), all of them when none has been watched that long (a swarm
  whose observers left with the last coordinator must still elect). Before any plan: the run's
  creator while it is live (its key made the run: it is the one peer no Sybil can be), else the
  peers this one has itself seen for a probation.
- **A coordinator that does not plan is passed over** (``Silence``): a peer elected that
  publishes no plan within ``deadline_s`` is left out of the election for ``pass_over_s``, by
  every member that watched it fail (each on its own clock: they agree within a round).

The thresholds, seniority and stickiness of the election itself are
``swarmd.peers.membership.election``'s.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping

PASS_OVER_ROUNDS = 10
"""A passed-over coordinator is left out for this many deadlines, then may try again."""
MIN_DEADLINE_S = 30.0


def coordinator_deadline_s(probation_s: float) -> float:
    """How long an elected coordinator may take to publish its first plan: four probations (a
    coordinator plans from members past theirs), and never under ``MIN_DEADLINE_S``."""
    return max(MIN_DEADLINE_S, 4.0 * probation_s)


def trusted_observers(live: Collection[str], planned: Collection[str] | None, creator: str) -> frozenset[str] | None:
    """The observers whose records count (module doc); None: every live one (no plan yet)."""
    if planned is None:
        return None
    return frozenset(p for p in (*planned, creator) if p in live)


def electable(
    live: Collection[str],
    planned: Collection[str] | None,
    creator: str,
    observed_up_s: Callable[[str], float],
    first_seen_s: Mapping[str, float],
    probation_s: float,
    passed_over: Collection[str] = (),
) -> frozenset[str]:
    """The peers that may be elected to a role now (module doc). ``observed_up_s(peer)``: how long
    the trusted observers saw it up; ``first_seen_s``: how long this peer has seen each live one
    (itself included, as its own uptime)."""
    alive = set(live) - set(passed_over)
    if planned is not None:
        members = {p for p in planned if p in alive}
        proven = {p for p in members if observed_up_s(p) >= probation_s}
        return frozenset(proven or members)
    if creator in alive:
        return frozenset({creator})
    return frozenset(p for p in alive if first_seen_s.get(p, 0.0) >= probation_s)


class Silence:
    """Elected coordinators that published no plan in time (module doc), on this peer's clock."""

    def __init__(self, deadline_s: float) -> None:
        self.deadline_s = deadline_s
        self.pass_over_s = PASS_OVER_ROUNDS * deadline_s
        self._elected: tuple[str, float] | None = None  # (whom, since when) while it has not planned
        self._passed: dict[str, float] = {}  # peer -> until when it is passed over
        self.passed_over_total = 0

    def passed_over(self, now: float) -> frozenset[str]:
        self._passed = {p: until for p, until in self._passed.items() if until > now}
        return frozenset(self._passed)

    def note(self, coordinator: str | None, planned_by: str | None, now: float) -> bool:
        """After a round elected ``coordinator`` and follows a plan published by ``planned_by``:
        whether the coordinator has now been silent past the deadline (it is passed over)."""
        if coordinator is None or coordinator == planned_by:
            self._elected = None
            return False
        if self._elected is None or self._elected[0] != coordinator:
            self._elected = (coordinator, now)
            return False
        if now - self._elected[1] < self.deadline_s:
            return False
        self._passed[coordinator] = now + self.pass_over_s
        self._elected = None
        self.passed_over_total += 1
        return True
