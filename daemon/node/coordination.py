"""Knowing the swarm, in the daemon: the coordination round and what the others ask of it.

Every ``coordinate`` round reads every live peer's links and observations records (what
``swarmd.node.measurements`` publishes on each peer), makes the swarm's view of them
(``swarmd.node.swarm_view``: reliability from what *others* observed, the live links), elects
the coordinator (``swarmd.node.plan_choice``, sticky) and adopts the plan to follow. Plans are
screened first: only from live members, and not far ahead of the plan in force; only the
elected coordinator's is followed. Every plan passed over is counted by reason (``status``:
``plans_refused``), once per publisher and version. When this peer is the coordinator, it
plans and publishes first (``swarmd.node.plan_publisher``).

Between rounds the trainer, the router and the relay service ask this object who holds which
role (``plan_record``, ``relays``, ``standby_for``) and how good a link is (``link_Bps``). A
relay is believed only as the plan followed names it, and only while it is a live member.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from swarmd.node.measurements import Measurements
from swarmd.node.plan_choice import PlanRefusal, elect, plan_to_follow, screen, within_reach
from swarmd.node.plan_publisher import PlanPublisher
from swarmd.node.silent_members import SilentWatch
from swarmd.node.swarm_view import SwarmView, narrowed, read_view
from swarmd.peers.membership.election import ElectionConfig, elect_standby
from swarmd.peers.membership.probation import Plannable, plannable
from swarmd.peers.membership.reliability import KIND as OBSERVATIONS_KIND
from swarmd.peers.membership.reliability import Observations
from swarmd.peers.membership.standing import Silence, coordinator_deadline_s, electable, trusted_observers
from swarmd.peers.planning.snapshot import Member
from swarmd.peers.records.identity import Identity
from swarmd.peers.records.links import KIND as LINKS_KIND
from swarmd.peers.records.plan_record import KIND as PLAN_KIND
from swarmd.peers.records.plan_record import PlanRecord
from swarmd.peers.records.run_spec import SignedRunSpec
from swarmd.peers.wire.routing import Matrix

logger = logging.getLogger(__name__)

MAX_REFUSALS_REMEMBERED = 4096
"""Plans already counted as refused (publisher, version), so that a plan that stays in
the DHT is counted once, not every round; past this many the memory starts afresh."""


class Coordination:
    """The roles and the plan in force, as of the last round; the coordinator's work when elected."""

    def __init__(
        self,
        spec: SignedRunSpec,
        identity: Identity,
        dht: Any,
        measurements: Measurements,
        thresholds: ElectionConfig,
        own_device: Callable[[], tuple[float, float]],
        probation_s: float,
    ) -> None:
        """``measurements``: this peer's own, and who was live at the last scan;
        ``own_device()``: this peer's (compute TFLOPS, memory GiB) as measured at start;
        ``probation_s``: how long a newcomer waits before the coordinator plans it."""
        self.probation_s = probation_s
        self.plannable: Plannable | None = None
        """Whom this peer, as coordinator, planned from at its last round."""
        self.spec, self.dht, self.measurements = spec, dht, measurements
        self.own, self.thresholds, self.own_device = identity.peer_id, thresholds, own_device
        self.publisher = PlanPublisher(spec, identity, dht, thresholds)
        self.view = SwarmView()
        self.coordinator: str | None = None
        self.plan: PlanRecord | None = None
        self.plans_refused: Counter[str] = Counter()
        """Plans passed over, by reason (``swarmd.node.plan_choice``)."""
        self._refusals_counted: set[tuple[str, int]] = set()
        self._roles: set[str] = set()  # the elected roles this peer held at the last round
        self.own_works: Callable[[], bool] = lambda: True
        """Whether this peer may be planned now (its work is not paused): set by the node."""
        self.silence = Silence(coordinator_deadline_s(probation_s))
        """Coordinators passed over for publishing no plan in time."""
        self.electable: frozenset[str] = frozenset()
        self.silent = SilentWatch(self.own)
        """Planned members that took up no work, left out of this coordinator's plans."""
        self._started = time.monotonic()

    async def coordinate(self) -> None:
        now = time.time()
        links, observations, plans = await asyncio.gather(
            self.dht.scan_peer_records(LINKS_KIND, now),
            self.dht.scan_peer_records(OBSERVATIONS_KIND, now),
            self.dht.scan_peer_records(PLAN_KIND, None),
        )
        members = self.measurements.members
        live = set(members) | {self.own}
        tflops, memory_gib = self.own_device()
        observed: list[Observations] = [r for r in observations if r.observer in live]
        links_records = {r.peer_id: r for r in links if r.peer_id in live}
        # Who may stand, and whose word counts (``swarmd.peers.membership.standing``).
        planned = self.plan.devices if self.plan is not None and self.plan.expires_at > now else None
        creator = self.spec.creator
        trusted = trusted_observers(live, planned, creator)
        own = Member(self.own, memory_gib, tflops)
        self.view = read_view(self.spec, own, members, links_records, observed, trusted)
        first_seen = {p: float(v.get("seen_for_s") or 0.0) for p, v in members.items()}
        first_seen[self.own] = time.monotonic() - self._started
        passed = self.silence.passed_over(now)
        self.electable = electable(
            live, planned, creator, self.view.observed_up_s, first_seen, self.probation_s, passed
        )
        admitted, refused = screen(plans, live, self.plan, now)
        self.coordinator = elect(self.view, admitted, live, now, self.thresholds, self.electable)
        in_force, passed_over = plan_to_follow(
            admitted, self.coordinator, self.own, self.publisher.published, self.plan
        )
        self.publisher.note(within_reach(admitted, in_force))
        if self.coordinator == self.own:
            # Heartbeats alone do not put a peer in the plan (``swarmd.peers.membership.probation``),
            # and a planned member that took up no work is planned out (``silent_members``).
            ours = self.plan if self.plan is not None and self.plan.peer_id == self.own else None
            await self.silent.check(self.dht, ours, live, now)
            out = self.silent.excluded(now)
            workers = {p: v for p, v in members.items() if p not in out}
            kept = [p for p in (self.plan.devices if self.plan is not None else ()) if p not in out]
            chosen = plannable(workers, kept, self.own, self.probation_s, self.own_works())
            self.plannable = chosen
            view = narrowed(self.view, self.spec, own, members, links_records, chosen.peers)
            await self.publisher.round(view, self.plan, now)
            in_force, passed_over = plan_to_follow(
                admitted, self.coordinator, self.own, self.publisher.published, self.plan
            )
        self.plan = in_force
        self._count(refused + passed_over)
        if self.silence.note(self.coordinator, None if in_force is None else in_force.peer_id, now):
            logger.warning(
                "Coordinator %s published no plan within %.0f s of its election; passed over for %.0f s",
                self.coordinator,
                self.silence.deadline_s,
                self.silence.pass_over_s,
            )
        self._log_roles()

    def _log_roles(self) -> None:
        """One line when this peer wins or loses an elected role (the trainer logs its cells and shards)."""
        roles = {"coordinator"} if self.coordinator == self.own else set()
        roles |= {"relay"} if self.own in self.relays() else set()
        for role in sorted(roles - self._roles):
            logger.info("Role won: %s", role)
        for role in sorted(self._roles - roles):
            logger.info("Role lost: %s", role)
        self._roles = roles

    def _count(self, refusals: list[PlanRefusal]) -> None:
        for refusal in refusals:
            key = (refusal.peer_id, refusal.version)  # once, under the first reason it was refused for
            if key in self._refusals_counted:
                continue
            if len(self._refusals_counted) >= MAX_REFUSALS_REMEMBERED:
                self._refusals_counted.clear()
            self._refusals_counted.add(key)
            self.plans_refused[refusal.reason] += 1
            logger.debug("Plan v%d of %s refused: %s", refusal.version, refusal.peer_id, refusal.reason)

    # --- what others read --------------------------------------------------------------------

    def plan_record(self) -> PlanRecord | None:
        """The plan in force (the trainer follows its cells and shard servers)."""
        return self.plan

    def standby_for(self, own: str) -> str | None:
        """The peer this one should log its shards' steps at: the live member likeliest to
        stay, on the best link from here among the equally reliable (``elect_standby``). Uptime
        is as others observed it: a heartbeat's own ``uptime_s`` is the peer's word on itself.

        Only a member this peer has seen for a newcomer's probation, and one the plan in force
        names (when there is one), may stand by: the standby receives every checkpoint and takes
        the shard over, which a key that published heartbeats for a minute must not win."""
        planned = set(self.plan.devices) if self.plan is not None else None
        return elect_standby(
            (
                (peer, self.view.score_of(peer), self.view.observed_up_s(peer), self.view.link_Bps(own, peer))
                for peer, view in self.measurements.members.items()
                if peer != own
                and float(view.get("seen_for_s") or 0.0) >= self.probation_s
                and (planned is None or peer in planned)
            ),
            self.thresholds.min_reliability,
        )

    def relays(self) -> list[str]:
        """The relays of the plan in force, best first."""
        plan_ = self.plan
        return [] if plan_ is None else [plan_.devices[r] for r in plan_.relays if 0 <= r < len(plan_.devices)]

    def is_relay(self, peer: str) -> bool:
        """Whether ``peer`` relays now: named in the plan followed (only the elected
        coordinator's is) and live (a relay that left no longer speaks for anyone)."""
        return (peer == self.own or self.measurements.is_member(peer)) and peer in self.relays()

    def matrix(self) -> Matrix | None:
        """The live latency and bandwidth matrix by peer ID (measured or filled), as of the
        last round: the router asks on every request, so it is built once per snapshot."""
        return self.view.matrix

    def link_Bps(self, a: str, b: str) -> float:
        return self.view.link_Bps(a, b)

    def score_of(self, peer: str) -> float:
        return self.view.score_of(peer)

    def status(self) -> dict[str, Any]:
        plan_ = self.plan
        snap = self.view.snapshot
        return {
            "coordinator": self.coordinator,
            "plan": None
            if plan_ is None
            else {
                "version": plan_.version,
                "kind": plan_.kind,
                "by": plan_.peer_id,
                "pipelines": len(plan_.pipelines),
                "stages": len(plan_.layers_per_stage),
                "layers_per_stage": plan_.layers_per_stage,
                "predicted_iteration_s": plan_.predicted.get("iteration_s"),
                "my_stage": plan_.stage_of(self.own),
                "grid": [[plan_.devices[d] for d in row] for row in plan_.pipelines],
                "devices": plan_.devices,
                "parameter_servers": [plan_.devices[d] for d in plan_.parameter_servers],
                "shard_servers": [[plan_.devices[d] for d in row] for row in plan_.shard_servers],
                "spares": [plan_.devices[d] for d in plan_.spares],
                "local_steps": plan_.local_steps,
                "share_micro_batches": plan_.share_micro_batches,
                "relays": self.relays(),
            },
            "plan_error": self.publisher.plan_error,
            "newcomers": None
            if self.plannable is None
            else {"waiting": self.plannable.waiting, "no_node": self.plannable.no_node},
            "plans_refused": dict(sorted(self.plans_refused.items())),
            "electable": len(self.electable),
            "silent_members": self.silent.status(time.time()),
            "passed_over": sorted(self.silence.passed_over(time.time())),
            "reliability": {p: round(r.score, 3) for p, r in sorted(self.view.reliability.items())},
            "links": self.measurements.status(snap.measured if snap else 0, snap.filled if snap else 0),
        }
