"""Knowing the swarm, in the daemon: probes, observations, elected coordinator, published plan.

Four periodic jobs of the node (``swarmd.node.node``) run through this object:

- ``probe``: round-trip time (a DHT ping) and bandwidth (a ``probe`` request carrying
  ``[probes] probe_bytes``) to the peers that are due (``swarmd.peers.records.links.ProbeBudget``:
  each at most every ``interval_s``, within ``bytes_per_hour``).
- ``observe``: on every membership scan, which peers were live; the observation book
  (``swarmd.peers.membership.reliability``) is saved in the state directory so that it survives restarts.
- ``publish``: this peer's signed links record (what it measured, and its compute) and its
  signed observations record.
- ``coordinate``: read every peer's links and observations, compute each member's reliability
  from what *others* observed, elect the coordinator (``swarmd.peers.membership.election``, sticky), and
  read the plan it published. The coordinator itself builds the live scenario
  (``swarmd.peers.planning.snapshot``) and plans from it: a full plan the first time, a repair
  when members joined or left (``swarmd.peers.planning.planner.repair``), and publishes it signed with
  the next version.

Planning runs in a worker thread (it is pure numpy work of up to ``PLAN_BUDGET_S``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import statistics
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from swarmd.peers.membership.election import (
    ElectionConfig,
    RoleCandidate,
    elect_coordinator,
    elect_relays,
    elect_standby,
    eligible,
    relays_wanted,
)
from swarmd.peers.membership.reliability import (
    KIND as OBSERVATIONS_KIND,
)
from swarmd.peers.membership.reliability import (
    ObservationBook,
    Observations,
    Reliability,
    swarm_reliability,
)
from swarmd.peers.planning.plan_cost import Plan
from swarmd.peers.planning.planner import PlanError, PlannerConfig, plan, repair
from swarmd.peers.planning.scenario import ScenarioError
from swarmd.peers.planning.snapshot import Member, Snapshot, build_snapshot, model_for_scenario
from swarmd.peers.planning.throughput import ThroughputModel
from swarmd.peers.records.identity import Identity
from swarmd.peers.records.links import (
    KIND as LINKS_KIND,
)
from swarmd.peers.records.links import (
    MAX_PROBE_BYTES,
    LinkEstimate,
    LinksRecord,
    ProbeBudget,
    bandwidth_from_transfer,
    make_record,
)
from swarmd.peers.records.plan_record import KIND as PLAN_KIND
from swarmd.peers.records.plan_record import PlanRecord
from swarmd.peers.records.run_spec import SignedRunSpec
from swarmd.peers.wire.errors import RpcError, TooLarge, Unreachable
from swarmd.peers.wire.messages import CellBackward, CellForward, Probe, Probed, ReplicaCheckpoint, ReplicaLog
from swarmd.peers.wire.protocol import Request
from swarmd.peers.wire.routing import Matrix
from swarmd.peers.wire.rpc import call

logger = logging.getLogger(__name__)

RECORD_TTL_S = 120.0
PASSIVELY_MEASURED = (CellForward, CellBackward, ReplicaLog, ReplicaCheckpoint)
PASSIVE_MIN_BYTES = 64 * 1024
PLAN_TTL_S = 300.0
PLAN_BUDGET_S = 0.5
REPLAN_S = 60.0
"""How often the coordinator plans afresh on what is measured by then, to compare."""
REPLAN_GAIN = 1.2
"""A fresh plan replaces the one in force only when predicted this much faster (hysteresis)."""
REPUBLISH_PLAN_S = 60.0
OBSERVATIONS_FILE = "observations.json"
PING_TIMEOUT_S = 5.0
PROBE_TIMEOUT_S = 30.0


class Coordination:
    def __init__(
        self,
        spec: SignedRunSpec,
        identity: Identity,
        dht: Any,
        state_dir: Path,
        budget: ProbeBudget,
        thresholds: ElectionConfig,
        own_device: Callable[[], tuple[float, float]],
        scan_interval_s: float,
    ) -> None:
        """``own_device()``: this peer's (compute TFLOPS, memory GiB) as measured at start;
        ``scan_interval_s``: how often membership is scanned (``observe`` is called)."""
        self.spec, self.identity, self.dht = spec, identity, dht
        self.run_id, self.own = spec.run_id, identity.peer_id
        self.budget, self.thresholds, self.own_device = budget, thresholds, own_device
        self.path = state_dir / OBSERVATIONS_FILE
        self.book = ObservationBook.load(self.path, self.own, max_gap_s=3 * scan_interval_s)
        self.links: dict[str, LinkEstimate] = {}
        self.p2p: Any = None  # set once the data path is up
        self.members: dict[str, dict[str, Any]] = {}
        """peer -> the membership view (heartbeat fields) at the last scan, others only."""
        self.links_records: dict[str, LinksRecord] = {}
        self.reliability: dict[str, Reliability] = {}
        self.coordinator: str | None = None
        self.plan: PlanRecord | None = None
        self.snapshot: Snapshot | None = None
        self._matrix: Matrix | None = None
        self.connectivity: dict[str, float] = {}
        """Median bandwidth from each member to the others, of the last snapshot."""
        self.plan_error: str | None = None
        self._published_plan: PlanRecord | None = None
        self._compared_at = time.time()  # when the plan in force was last compared with a fresh one
        self._published_at = 0.0
        self._highest_version = 0
        self.probes_sent = 0
        self.passive_samples = 0
        self.probe_failures = 0

    # --- probes ------------------------------------------------------------------------------

    async def handle_probe(self, sender: str, request: Probe, blobs: list[bytes]) -> tuple[Probed, list[bytes]]:
        """Answer a peer's bandwidth probe: its bytes are counted and dropped (the RPC server
        already refuses one over ``Probe.MAX_BYTES`` while reading it; this is the last check)."""
        size = len(blobs[0])
        if size > MAX_PROBE_BYTES:
            raise TooLarge(f"probe of {size} bytes is over the {MAX_PROBE_BYTES}-byte limit")
        return Probed(bytes=size), []

    async def probe(self) -> None:
        now = time.time()
        due = self.budget.due(now, self.links, sorted(self.members))
        if not due or self.p2p is None:
            return
        await asyncio.gather(*(self._probe_one(peer) for peer in due))

    async def _probe_one(self, peer: str) -> None:
        est = self.links.setdefault(peer, LinkEstimate())
        rtt = None
        with contextlib.suppress(Exception):
            rtt = await asyncio.wait_for(self.dht.ping(peer), PING_TIMEOUT_S)
        bandwidth = None
        size = self.budget.next_probe_bytes(time.time())
        if size:
            started = time.perf_counter()
            try:
                await call(self.p2p, peer, Probe(run_id=self.run_id), [bytes(size)], timeout_s=PROBE_TIMEOUT_S)
                self.budget.charge(time.time(), size)
                self.probes_sent += 1
                bandwidth = bandwidth_from_transfer(size, time.perf_counter() - started, rtt or est.rtt_s)
            except Unreachable as e:
                self.probe_failures += 1
                logger.debug("Bandwidth probe to %s could not open a stream: %s", peer, e)
                est.add(time.time(), rtt_s=rtt)
                est.mark_unreachable(time.time())
                return
            except RpcError as e:
                self.probe_failures += 1
                logger.debug("Bandwidth probe to %s failed: %s", peer, e)
        est.add(time.time(), rtt_s=rtt, bandwidth_Bps=bandwidth)

    def observe_transfer(self, peer: str, request: Request[Any], nbytes: int, seconds: float) -> None:
        """A request of the data path went direct to ``peer`` and back: a passive measurement of
        the link, free where traffic flows, so that the probes (which on a loaded or slow-start
        link measure little but latency) are needed only where nothing does. Only requests whose
        answer comes once the bytes are in count (a long poll, or a step at a server, would
        count their waiting as transfer time), and only large enough ones to outlast TCP's
        start (``PASSIVE_MIN_BYTES``)."""
        if not isinstance(request, PASSIVELY_MEASURED) or nbytes < PASSIVE_MIN_BYTES or peer == self.own:
            return
        est = self.links.setdefault(peer, LinkEstimate())
        bandwidth = bandwidth_from_transfer(nbytes, seconds, est.rtt_s)
        if bandwidth is not None:
            est.add(time.time(), bandwidth_Bps=bandwidth)
            self.passive_samples += 1

    # --- observations ------------------------------------------------------------------------

    def observe(self, members: list[dict[str, Any]]) -> None:
        """A membership scan: who is live now (others only)."""
        self.members = {m["peer_id"]: m for m in members if m["peer_id"] != self.own}
        self.book.observe(time.time(), self.members)

    def save(self) -> None:
        try:
            self.book.save(self.path)
        except OSError as e:
            logger.warning("Could not save observations to %s: %s", self.path, e)

    # --- records -----------------------------------------------------------------------------

    async def publish(self) -> None:
        now = time.time()
        tflops, memory_gib = self.own_device()
        record = make_record(self.run_id, self.own, now, RECORD_TTL_S, tflops, memory_gib, self.links)
        await self.dht.publish_peer_record(LINKS_KIND, self.own, record.sign(self.identity), record.expires_at)
        observations = self.book.to_record(self.run_id, self.own, now, RECORD_TTL_S)
        await self.dht.publish_peer_record(
            OBSERVATIONS_KIND, self.own, observations.sign(self.identity), observations.expires_at
        )
        self.save()

    # --- coordination ------------------------------------------------------------------------

    async def coordinate(self) -> None:
        now = time.time()
        links, observations, plans = await asyncio.gather(
            self.dht.scan_peer_records(LINKS_KIND, now),
            self.dht.scan_peer_records(OBSERVATIONS_KIND, now),
            self.dht.scan_peer_records(PLAN_KIND, None),
        )
        live = set(self.members) | {self.own}
        self.links_records = {r.peer_id: r for r in links if r.peer_id in live}
        observed: list[Observations] = [r for r in observations if r.observer in live]
        self.reliability = swarm_reliability(observed, sorted(live))
        self.snapshot = self._snapshot()
        self._matrix = self._matrix_of(self.snapshot)
        self.connectivity = self._connectivity()
        candidates = self._candidates()
        for record in plans:
            self._highest_version = max(self._highest_version, record.version)
        self.coordinator = elect_coordinator(candidates, incumbent(plans, live, now), self.thresholds)
        if self.coordinator == self.own:
            await self._plan_as_coordinator(now)
        self.plan = self._adopt(plans)

    def _snapshot(self) -> Snapshot | None:
        spec = self.spec.spec
        tflops, memory_gib = self.own_device()
        members = [Member(self.own, memory_gib, tflops)]
        for peer, m in self.members.items():
            memory = float(m.get("device", {}).get("memory_bytes", 0)) / (1 << 30)
            members.append(Member(peer, memory, float(m.get("throughput_gflops", 0.0)) / 1000))
        uptime = {p: (r.mean_uptime_h, r.mean_downtime_h) for p, r in self.reliability.items() if r.observers}
        model = model_for_scenario(spec.model.layers, spec.model.hidden, spec.model.vocab, spec.model.seq_len)
        batch = {"sequences": spec.batch_sequences, "micro_batch": spec.micro_batch}
        try:
            return build_snapshot(self.run_id, members, self.links_records, uptime, model, batch)
        except ScenarioError as e:
            logger.warning("The live swarm does not make a scenario: %s", e)
            return None

    def _candidates(self) -> list[RoleCandidate]:
        return [self._candidate(peer) for peer in sorted(set(self.members) | {self.own})]

    def _candidate(self, peer: str) -> RoleCandidate:
        r = self.reliability.get(peer)
        return RoleCandidate(peer, r.score if r is not None else 0.0, self.connectivity.get(peer, 0.0))

    def _connectivity(self) -> dict[str, float]:
        """Median measured (or filled) bandwidth from each member to the others."""
        if self.snapshot is None:
            return {}
        sc = self.snapshot.scenario
        out = {}
        for i, peer in enumerate(sc.ids):
            row = [float(sc.bandwidth_Bps[i, j]) for j in range(sc.n) if j != i]
            out[peer] = statistics.median(row) if row else 0.0
        return out

    async def _plan_as_coordinator(self, now: float) -> None:
        snap = self.snapshot
        if snap is None or snap.scenario.n < self.spec.spec.stages:
            return  # fewer members than stages: every member hosts and works, nothing to place
        previous = self._published_plan or self.plan
        members = set(snap.scenario.ids)
        if (
            previous is not None
            and set(previous.devices) == members
            and previous.peer_id == self.own
            and now - self._compared_at >= REPLAN_S
            and await self._better_plan(snap, previous, now)
        ):
            return  # the links measured since (passively, on real traffic) make another plan faster
        if previous is not None and set(previous.devices) == members and previous.peer_id == self.own:
            relays = self._elect_relays(previous.devices, previous.relays, previous.relays)
            if relays != previous.relays:  # a relay fell below its threshold, or one now passes
                record = replace(previous, version=self._highest_version + 1, kind="relays", relays=relays)
                logger.info("Plan v%d: relays now %s", record.version, [record.devices[r] for r in relays])
                await self._publish_plan(record, now)
            elif now - self._published_at >= REPUBLISH_PLAN_S:
                await self._publish_plan(previous, now)  # same plan, fresh expiry
            return
        fixed_h = self.spec.spec.local_steps or None  # 0: the planner proposes H from the links
        settings = PlannerConfig(
            time_budget_s=PLAN_BUDGET_S, stages=self.spec.spec.stages, local_steps=fixed_h, even_layers=True
        )  # the daemons cut their stages evenly
        try:
            if previous is not None and set(previous.devices) & members:
                fixed = await asyncio.to_thread(
                    repair, snap.scenario, record_plan(previous), previous.devices, settings
                )
                result, kind = fixed.plan, "repair"
            else:
                result, kind = await asyncio.to_thread(plan, snap.scenario, settings), "full"
        except (PlanError, ScenarioError) as e:
            if str(e) != self.plan_error:  # once per distinct reason, not every round
                logger.warning("Cannot plan the swarm: %s", e)
            self.plan_error = str(e)
            return
        self.plan_error = None
        await self._publish_new(snap, result, kind, previous, now)

    async def _publish_new(
        self, snap: Snapshot, result: Plan, kind: str, previous: PlanRecord | None, now: float
    ) -> None:
        """Publish a plan of the planner's as the next version, its relays elected."""
        ids = snap.scenario.ids
        current_relays = [] if previous is None else [previous.devices[r] for r in previous.relays]
        relays = self._elect_relays(ids, [ids.index(p) for p in current_relays if p in ids], list(result.relays))
        prediction = result.meta.get("prediction")
        predicted = prediction.to_json() if prediction is not None else {}  # type: ignore[attr-defined]
        record = PlanRecord(
            run_id=self.run_id,
            peer_id=self.own,
            issued_at=now,
            expires_at=now + PLAN_TTL_S,
            version=self._highest_version + 1,
            kind=kind,
            devices=ids,
            pipelines=[list(row) for row in result.pipelines],
            layers_per_stage=list(result.layers_per_stage),
            parameter_servers=list(result.parameter_servers),
            relays=relays,
            predicted={k: float(v) for k, v in list(predicted.items())[:16]},
            shard_servers=[list(row) for row in result.shard_servers],
            local_steps=result.local_steps,
            share_micro_batches=result.share_micro_batches,
            spares=list(result.spares),
            reduce_groups=list(result.reduce_groups),
        )
        shape = f"{len(record.pipelines)} pipelines of {len(record.layers_per_stage)} stages"
        logger.info(
            "Plan v%d (%s): %s, predicted %.0f tokens/s",
            record.version,
            kind,
            shape,
            record.predicted.get("tokens_per_s", 0.0),
        )
        await self._publish_plan(record, now)

    async def _better_plan(self, snap: Snapshot, previous: PlanRecord, now: float) -> bool:
        """Plan afresh on what is measured now; publish it if it is predicted ``REPLAN_GAIN``
        faster than the plan in force is on the same measurements (a first plan is made on
        probes alone, before any data flows; hysteresis keeps plans from flapping with noise)."""
        settings = PlannerConfig(
            time_budget_s=PLAN_BUDGET_S,
            stages=self.spec.spec.stages,
            local_steps=self.spec.spec.local_steps or None,
            even_layers=True,
        )
        ids = snap.scenario.ids
        try:
            fresh = await asyncio.to_thread(plan, snap.scenario, settings)
            current = record_plan(previous).remapped([ids.index(p) for p in previous.devices])
            model = ThroughputModel(snap.scenario, max_staleness=self.spec.spec.max_staleness)
            now_tps = (await asyncio.to_thread(model.evaluate, current)).tokens_per_s
            new_tps = (await asyncio.to_thread(model.evaluate, fresh)).tokens_per_s
        except (PlanError, ScenarioError, ValueError) as e:
            logger.debug("No fresh plan to compare with: %s", e)
            return False
        finally:
            self._compared_at = now
        if not new_tps > REPLAN_GAIN * now_tps:  # nor when neither is predicted to train at all
            return False
        logger.info(
            "Re-planning on the links measured since: %.0f tokens/s predicted against %.0f for plan v%d",
            new_tps,
            now_tps,
            previous.version,
        )
        await self._publish_new(snap, fresh, "full", previous, now)
        return True

    def _elect_relays(self, devices: list[str], current: list[int], preferred: list[int]) -> list[int]:
        """The plan's relays (indices into ``devices``), elected on the thresholds among the
        planned devices: incumbents kept, the planner's choices (a link is faster through
        them) next (``swarmd.peers.membership.election.elect_relays``)."""
        candidates = [self._candidate(peer) for peer in devices]
        chosen = elect_relays(
            candidates,
            [devices[r] for r in current],
            self.thresholds,
            relays_wanted(len(devices)),
            preferred=[devices[r] for r in preferred],
        )
        return [devices.index(p) for p in chosen]

    async def _publish_plan(self, record: PlanRecord, now: float) -> None:
        fresh = PlanRecord(**{**record.__dict__, "issued_at": now, "expires_at": now + PLAN_TTL_S})
        await self.dht.publish_peer_record(PLAN_KIND, self.own, fresh.sign(self.identity), fresh.expires_at)
        self._published_plan, self._published_at = fresh, now
        self._highest_version = max(self._highest_version, fresh.version)

    def _adopt(self, plans: list[PlanRecord]) -> PlanRecord | None:
        """The plan to follow: the elected coordinator's, else the highest version seen."""
        if self._published_plan is not None and self.coordinator == self.own:
            plans = [*plans, self._published_plan]
        if not plans:
            return self.plan
        ours = [p for p in plans if p.peer_id == self.coordinator]
        return max(ours or plans, key=lambda p: (p.version, p.issued_at))

    # --- what others read --------------------------------------------------------------------

    def plan_record(self) -> PlanRecord | None:
        """The plan in force (the trainer follows its cells and shard servers)."""
        return self.plan

    def standby_for(self, own: str) -> str | None:
        """The peer this one should log its shards' steps at: the live member likeliest to
        stay, on the best link from here among the equally reliable (``elect_standby``)."""
        return elect_standby(
            (peer, self.score_of(peer), float(m.get("uptime_s", 0.0)), self.link_Bps(own, peer))
            for peer, m in self.members.items()
            if peer != own
        )

    def relays(self) -> list[str]:
        """The relays of the plan in force, best first."""
        plan_ = self.plan
        return [] if plan_ is None else [plan_.devices[r] for r in plan_.relays if 0 <= r < len(plan_.devices)]

    def is_relay(self, peer: str) -> bool:
        return peer in self.relays()

    def matrix(self) -> Matrix | None:
        """The live latency and bandwidth matrix by peer ID (measured or filled), as of the
        last round: the router asks on every request, so it is built once per snapshot."""
        return self._matrix

    @staticmethod
    def _matrix_of(snap: Snapshot | None) -> Matrix | None:
        if snap is None:
            return None
        sc = snap.scenario
        return Matrix({p: i for i, p in enumerate(sc.ids)}, sc.latency_s, sc.bandwidth_Bps)

    def link_Bps(self, a: str, b: str) -> float:
        """The bandwidth from ``a`` to ``b`` in the live matrix (measured, or filled from the
        others where a pair was not), 0.0 where either is not in it."""
        matrix = self._matrix
        if matrix is None or a == b:
            return 0.0
        i, j = matrix.index.get(a), matrix.index.get(b)
        return 0.0 if i is None or j is None else float(matrix.bandwidth_Bps[i, j])

    def score_of(self, peer: str) -> float:
        """The peer's reliability as others observed it, to one decimal: what orders peers for
        roles (standby, a free stage, checkpoint sources). Finer differences are measurement
        noise that moves every round; ordering by them made the standby flap between peers."""
        r = self.reliability.get(peer)
        return round(r.score, 1) if r is not None else 0.0

    def may_host(self, peer: str, incumbent: bool) -> bool:
        """Whether ``peer`` passes the thresholds for a parameter server (``[roles]``)."""
        return eligible(self._candidate(peer), self.thresholds, incumbent)

    def status(self) -> dict[str, Any]:
        plan_ = self.plan
        snap = self.snapshot
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
            "plan_error": self.plan_error,
            "reliability": {p: round(r.score, 3) for p, r in sorted(self.reliability.items())},
            "links": {
                "measured": len([e for e in self.links.values() if e.samples]),
                "unreachable": sorted(p for p, e in self.links.items() if e.unreachable),
                "matrix_measured": snap.measured if snap else 0,
                "matrix_filled": snap.filled if snap else 0,
                "probes_sent": self.probes_sent,
                "probe_failures": self.probe_failures,
                "passive_samples": self.passive_samples,
                "probe_bytes_last_hour": self.budget.spent_last_hour(time.time()),
            },
        }


def incumbent(plans: list[PlanRecord], live: set[str], now: float) -> str | None:
    """The coordinator every peer sees in the DHT: the live publisher of the newest unexpired
    plan (ties, as when two started at once: the lower peer ID)."""
    current = [p for p in plans if p.peer_id in live and p.expires_at > now]
    return min(current, key=lambda p: (-p.version, p.peer_id)).peer_id if current else None


def record_plan(record: PlanRecord) -> Plan:
    """The planner's ``Plan`` of a published record (device indices into ``record.devices``)."""
    return Plan(
        pipelines=tuple(tuple(row) for row in record.pipelines),
        layers_per_stage=tuple(record.layers_per_stage),
        parameter_servers=tuple(record.parameter_servers),
        relays=tuple(record.relays),
        shard_servers=tuple(tuple(row) for row in record.shard_servers),
        local_steps=record.local_steps,
        share_micro_batches=record.share_micro_batches,
        spares=tuple(record.spares),
        reduce_groups=tuple(record.reduce_groups),
    )
