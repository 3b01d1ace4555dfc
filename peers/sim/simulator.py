"""A run of a swarm over time, simulated event by event on swarmd's own rules.

What is simulated, and with which code:

- **Churn**: devices leave and return as ``swarmd.peers.sim.churn`` draws them from the scenario's
  ``mean_uptime_h`` / ``mean_downtime_h``; the same schedule for every strategy on one seed.
  A departure is noticed ``detect_s`` later (the heartbeat TTL), a return ``join_s`` later.
- **Placement**: a strategy's full plan at the start; on every noticed change its mend (for
  swarmd the planner's ``repair``, the function the coordinator runs) or a full re-plan. The
  planner's measured runtime delays the new plan, and is reported.
- **Elections** (``swarmd.peers.election``, the daemon's functions): the coordinator is
  elected among the members (``elect_coordinator``), and only it plans, at its first round
  (``coordinate_s``) after a change is noticed. A coordinator that left plans nothing until
  its own departure is noticed and the next one elected; a plan whose coordinator leaves while
  computing it is lost, and counted. Every plan's relays are elected as the daemon's
  coordinator elects them (``elect_relays``, ``relays_wanted``), and each of a worker's
  requests to a stage host goes through one when the daemon's rule says so
  (``swarmd.peers.wire.routing.choose_route``): store and forward, a flow on each hop. A
  stage's standby is ``elect_standby``'s pick. A device's reliability is its availability in
  the scenario, its connectivity the median of its links' bandwidths (the daemon measures
  both).
- **The task pool**: every stage has the daemon's queue (``swarmd.peers.task_queue.TaskQueue``)
  at its host, the stage's parameter server. Every tensor goes through a host, request by
  request as the daemon's worker sends them: a claim (one round trip; the stage input and
  any weights version the worker lacks come back with it); a forward's output put at the
  next stage's host, then its lease completed (two requests); a finishing task's input
  gradient put at the previous stage's host, its own gradient summed and pushed every
  ``push_every`` micro-batches (or when the worker runs out of tasks), the push logged at
  the stage's standby before it is applied and answered.
- **Compute** per micro-batch from the stage's layers and the device's TFLOPS (a forward one
  third of ``layer_flops_per_sequence``, a backward the rest plus the recomputed forward).
- **Transfers**: latency plus bytes over bandwidth, with links shared by concurrent flows
  (``swarmd.peers.sim.shared_links``): each flow crosses its path and both ends' network
  interfaces (a device sends at most at its fastest link's rate in all, its uplink, and
  receives likewise, its downlink), and concurrent flows get max-min fair shares of them,
  re-divided as flows start and end, as TCP flows share a volunteer's access link.
- **Workers** are every member, as in the daemon: the plan's cells on their stage, the
  members it leaves out on a stage by their rank. Each claims from its stage first and, when
  it has nothing ready, from any other stage with work (the daemon's ``PipelineWorker``); they keep the last
  ``keep_versions`` weights versions of each stage they worked on and pull only what they
  lack.
- **Parameter servers** apply pushes asynchronously; a push whose forward used weights more
  than ``max_staleness`` versions old is dropped and counted (as the daemon does). A push is
  committed once logged at the stage's standby, and every ``checkpoint_every`` updates the
  standby gets a checkpoint (both cross the host's uplink); with no standby ready (its copy
  still in flight) pushes apply unreplicated, and a host that dies then loses them: those
  are the updates lost, counted, not assumed away.
- **Failures**: a departed worker's leases go back to the queue when noticed (its work is
  recomputed); a departed host's stage fails over to its standby and, as in the daemon, the
  micro-batches in flight are redone from stage 0.

The simulation is deterministic for a seed. Memory is bounded by the devices, the links in
use and the micro-batches in flight, not by the simulated time: the timeline keeps one count
per ``bucket_s``.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from swarmd.peers.election import (
    Candidate,
    Thresholds,
    elect_coordinator,
    elect_relays,
    elect_standby,
    eligible,
    relays_wanted,
)
from swarmd.peers.idle_polling import flush_at, next_round
from swarmd.peers.op_times import OpTimes
from swarmd.peers.planning.plan_cost import Plan, stage_flops_per_sequence
from swarmd.peers.planning.scenario import Scenario, ScenarioError, Shape
from swarmd.peers.sim.churn import ChurnEvent, churn_schedule
from swarmd.peers.sim.shared_links import SharedLinks
from swarmd.peers.stage_assignment import HAND_OVER_HELD_S, HAND_OVER_SETTLED_S, fair_share, follows_plan
from swarmd.peers.task_queue import Lease, QueueFull, Task, TaskKind, TaskQueue, TaskQueueConfig, TaskQueueError
from swarmd.peers.wire.routing import Matrix, choose_route

QUEUE_CAPACITY_BYTES = 1 << 62
"""Queues never refuse a put here: the feeder bounds what is in flight (as stage 0 does)."""
# The task queue logs dropped workers and expired leases: thousands of them are not news here.
logging.getLogger("swarmd.peers.task_queue").setLevel(logging.ERROR)


@dataclass(frozen=True)
class SimSettings:
    hours: float = 1.0
    seed: int = 0
    churn: bool = True
    max_staleness: int = 4
    detect_s: float = 60.0
    """A departure is noticed this long after it happens (the heartbeat TTL)."""
    join_s: float = 30.0
    """A returning device is in the membership this long after it comes back."""
    lease_s: float = 900.0
    batches_ahead: int = 1
    """Stage 0 feeds at most this many batches beyond the one being summed: the micro-batches
    in flight and those summed toward the next update together stay within ``1 +
    batches_ahead`` batches (the daemon's ``StageHost.feed``)."""
    max_in_flight: int = 16
    """Micro-batches in flight at most, however large the batch (the daemon's trainer's)."""
    push_every: int = 2
    """Finished micro-batches a worker sums before it pushes (the bytes of a push, amortised)."""
    bucket_s: float = 60.0
    checkpoint_every: int = 10
    """Updates between the checkpoints a host sends its standby (the daemon's ``CHECKPOINT_EVERY``)."""
    keep_versions: int = 8
    """Weights versions a worker keeps per stage (the daemon's ``WorkerSettings.keep_versions``)."""
    standing_queue_s: float = 0.0
    """The delay a busy interface's buffer adds to every packet through it (bufferbloat)."""
    request_overhead_s: float = 0.0
    """What a request between two peers costs beyond its latency and bytes: opening a stream,
    framing, the event loops at both ends (the calibration harness measures it on an idle
    connection). A request to the peer's own host is a function call and costs none."""
    connection_queue_bytes: float = 0.0
    """The bytes of another transfer between the same two peers that a message waits behind:
    libp2p carries all their streams over one connection, whose send buffer (a window of
    bytes) is first come, first served. The wait is that many bytes at the link's rate, longer
    on a slower link (the calibration harness measures it on the data path)."""
    coordinate_s: float = 10.0
    """The coordinator's round: it plans at its first round after a change is noticed (the
    daemon's coordination loop runs every two heartbeats, within 4-10 s: 10 s at the default
    heartbeat). Each device's rounds have their own phase, drawn from the seed."""
    thresholds: Thresholds = Thresholds()
    """Who may coordinate and relay (the daemon's ``[roles]``, whose defaults these are)."""
    data_via_relay: str = "auto"
    """The workers' routing (the daemon's ``[swarm] data_via_relay``): auto, always or never."""
    max_events: int = 200_000_000


@dataclass(frozen=True)
class Strategy:
    name: str
    full_plan: Callable[[Scenario], Plan]
    """A plan for the live devices (indices into the scenario given)."""
    mend: Callable[[Scenario, Plan, list[str]], Plan] | None = None
    """Mend the previous plan (indices into the listed IDs) for the live devices; None: a full
    plan from scratch on every change."""
    mend_live: Callable[[Scenario, np.ndarray, Plan], Plan] | None = None
    """Instead of ``mend``: mend the previous plan given the whole scenario and the live
    devices' indices, plans in the whole scenario's indices. Spares the scenario restricted to
    the live devices, a copy of both n x n matrices per change (1.6 GB at 10,000 devices)."""
    relays: bool = True
    """Whether relays are elected and requests go through them when faster (swarmd's data
    path); the baselines' systems send everything direct."""


@dataclass
class PlanEvent:
    at_s: float
    kind: str  # full, repair or replan
    runtime_s: float
    devices: int
    pipelines: int


@dataclass
class SimResult:
    strategy: str
    hours: float
    seed: int
    devices: int
    tokens: int
    tokens_per_s: float
    timeline: list[int]
    """Micro-batches finished in each ``bucket_s`` of simulated time."""
    bucket_s: float
    tokens_per_micro_batch: int
    updates: int
    updates_lost: int
    micro_batches_recomputed: int
    stale_dropped: int
    staleness: dict[int, int]
    departures: int
    returns: int
    plan_events: list[PlanEvent]
    recovery_s: list[float]
    """Per noticed departure of a planned device: until throughput is back (``recovery_times``)."""
    wall_s: float
    events: int
    failovers: int
    shape: tuple[int, int]
    coordinator_changes: int = 0
    plans_lost: int = 0
    """Plans whose coordinator left while computing them: the next coordinator plans again."""
    relays: int = 0
    """Relays elected by the last plan."""
    relayed_transfers: int = 0
    """Transfers of the workers' requests and their answers that went through a relay."""
    hand_overs: int = 0
    """Stages handed to the server a plan named (``swarmd.peers.stage_assignment.follows_plan``)."""
    requests: dict[str, dict[str, float]] = field(default_factory=dict)
    """The workers' requests by operation: count and mean milliseconds (``swarmd status``'s
    ``requests_by_op``)."""
    push_phases: dict[str, dict[str, float]] = field(default_factory=dict)
    """The servers' time per push before applying it, by phase (``swarmd status``'s)."""

    def tokens_per_s_series(self) -> list[float]:
        return [n * self.tokens_per_micro_batch / self.bucket_s for n in self.timeline]


@dataclass
class _Stage:
    queue: TaskQueue
    host: int
    standby: int | None
    standby_ready: bool = False
    """The standby holds the checkpoint and receives every push before it is applied."""
    version: int = 0
    pending: int = 0
    """Micro-batches summed toward the next update."""
    replicas: dict[int, int] = field(default_factory=dict)
    """Device -> the version its copy of the stage holds (the standby's follows while ready)."""
    waiting: list[int] = field(default_factory=list)
    pushes: deque[tuple] = field(default_factory=deque)
    """Pushes that reached the server and wait for it: they are logged and applied one at a
    time, in order (the daemon's ``server_lock``)."""
    serving: bool = False
    serial: int = 0
    """Bumped when the stage's queues are rebuilt: the server's events from before lapse."""
    hosted_since: float = 0.0
    opening: bool = False
    """A new host fetches the stage's checkpoint from the last one: no claims until it is in."""
    opened_from: int | None = None
    """The host a new host fetches the checkpoint from."""


# event kinds
(_CHURN, _NOTICE, _CLAIMED, _COMPUTED, _FORWARD_PUT, _BACKWARD_PUT, _PUT_ANSWERED, _FINISH, _LOGGED, _FREE,
 _STANDBY_READY, _PLAN_READY, _FLOW, _FLUSH, _POLL, _SEND, _PLAN_START, _HOP, _FOLLOW, _OPENED) = range(20)  # fmt: skip


class Simulation:
    def __init__(
        self, scenario: Scenario, strategy: Strategy, settings: SimSettings,
        schedule: tuple[np.ndarray, list[ChurnEvent]] | None = None,
    ) -> None:  # fmt: skip
        """``schedule``: who is up at the start and the churn events, instead of drawing them
        from the scenario (``churn_schedule``)."""
        self.sc, self.strategy, self.s = scenario, strategy, settings
        self.horizon = settings.hours * 3600.0
        if schedule is not None:
            up0, churn = schedule
        elif settings.churn:
            up0, churn = churn_schedule(scenario, self.horizon, settings.seed)
        else:
            up0, churn = np.ones(scenario.n, dtype=bool), []
        self.up = up0.copy()
        self.member = up0.copy()  # what the membership knows (noticed departures and returns)
        self.member_since = np.zeros(scenario.n)  # when each member was last noticed joining
        self.epoch = np.zeros(scenario.n, dtype=np.int64)  # bumped at a departure: its events lapse
        self.tflops = np.array([d.tflops for d in scenario.devices]) * 1e12
        self.availability = np.array([d.availability for d in scenario.devices])
        self.events: list[tuple[float, int, int, tuple]] = []
        self._seq = itertools.count()
        for ev in churn:
            self._at(ev.at_s, _CHURN, (ev.device, ev.up))
        self.uplink_rate, self.downlink_rate = interface_rates(scenario.bandwidth_Bps)
        self.links = SharedLinks(scenario.bandwidth_Bps, self.uplink_rate, self.downlink_rate,
                                 lambda t, fid, serial: self._at(t, _FLOW, (fid, serial)))  # fmt: skip
        self.sent = np.zeros(scenario.n)  # bytes each device sent and received, for comparisons
        self.received = np.zeros(scenario.n)
        self.timeline = [0] * (int(math.ceil(self.horizon / settings.bucket_s)) + 1)
        self.staleness: Counter[int] = Counter()
        self.plan_events: list[PlanEvent] = []
        self.departure_times: list[float] = []
        self.counts: Counter[str] = Counter()
        self.requests = OpTimes()  # the workers' requests by operation, as the daemon's status counts them
        self.push_phases = OpTimes()  # the servers' time per push before applying it, as the daemon's hosts count it
        self.next_micro_batch = 0
        self.generation = 0  # bumped when the queues are rebuilt: work leased before lapses
        self.in_flight: set[int] = set()
        self.worker_stage: dict[int, int] = {}
        self.busy: set[int] = set()
        self.idle_since: dict[int, float] = {}  # an idle worker -> when its idle spell began
        self.idle_rounds: dict[int, int] = {}  # fruitless rounds of claims of the spell counted so far
        self.poll_serial: dict[int, int] = {}  # an idle worker's next round of claims; older ones lapse
        self.job: dict[int, int] = {}  # a worker's current job: events of an older one lapse
        self.held: dict[tuple[int, int], list[tuple]] = {}  # (worker, stage) -> finished, not yet pushed
        self.held_since: dict[tuple[int, int], float] = {}  # (worker, stage) -> when its oldest was finished
        self.weights: dict[tuple[int, int], list[int]] = {}  # (device, stage) -> versions held, oldest first
        self.live_ids: list[str] = []
        self.plan: Plan | None = None
        self.plan_pending = False  # a plan waits for its coordinator's round
        self.planning = False  # a plan is being computed
        self.replan_wanted = False  # a change was noticed while planning, or with no coordinator up
        # The elections' inputs, per device, fixed for the run (module doc).
        self.ids = [d.id for d in scenario.devices]
        self.index = {p: i for i, p in enumerate(self.ids)}
        connectivity = median_rates(scenario.bandwidth_Bps)
        self.candidates = [Candidate(p, float(a), float(c))
                           for p, a, c in zip(self.ids, self.availability, connectivity, strict=True)]  # fmt: skip
        self.round_phase = np.random.default_rng([settings.seed, 1]).uniform(0.0, settings.coordinate_s, scenario.n)
        self.may_host = np.array([eligible(c, settings.thresholds, incumbent=False) for c in self.candidates])
        self.coordinator: int | None = None
        self.relays: list[int] = []
        self.matrix = Matrix(self.index, scenario.latency_s, scenario.bandwidth_Bps)
        self._routes: dict[tuple[int, int, float], int | None] = {}  # (worker, host, bytes) -> relay
        self.standby_preference: dict[int, list[int]] = {}
        """Stage -> devices to take as its standby first, in order, when members and not its
        host: the calibration sets the standbys the real daemons chose, to compare the data
        path on the same placement. Empty: ``elect_standby`` alone decides."""
        self.stages: list[_Stage] = []
        self._handlers: dict[int, Callable[..., None]] | None = None
        self._events_run = 0
        self._wall_s = 0.0  # spent in ``advance`` so far

    # --- the event queue ---------------------------------------------------------------------

    def _at(self, t: float, kind: int, args: tuple) -> None:
        heapq.heappush(self.events, (t, next(self._seq), kind, args))

    def run(self) -> SimResult:
        """Simulate to the horizon (from where ``advance`` left off, if it was called)."""
        self.advance(self.horizon)
        return self._result(self._wall_s, self._events_run)

    def advance(self, until: float) -> None:
        """Run the events up to ``until`` (at most the horizon): the first call plans. A caller
        can read the counters part way (the calibration takes off a warm-up) and go on."""
        started = time.perf_counter()
        if self._handlers is None:
            self._handlers = {
                _CHURN: self._churn, _NOTICE: self._notice, _CLAIMED: self._claimed, _COMPUTED: self._computed,
                _FORWARD_PUT: self._forward_put, _BACKWARD_PUT: self._backward_put, _PUT_ANSWERED: self._put_answered,
                _FINISH: self._finish, _LOGGED: self._logged, _FREE: self._free, _STANDBY_READY: self._standby_ready,
                _PLAN_READY: self._plan_ready, _FLOW: self._flow_due, _FLUSH: self._flush, _POLL: self._poll,
                _SEND: self._send_now, _PLAN_START: self._plan_start, _HOP: self._hop, _FOLLOW: self._follow,
                _OPENED: self._opened,
            }  # fmt: skip
            self._elect_coordinator()
            self._plan_now(0.0, initial=True)
        until = min(until, self.horizon)
        events, handlers = self.events, self._handlers
        while events and self._events_run < self.s.max_events and events[0][0] <= until:
            t, _, kind, args = heapq.heappop(events)
            handlers[kind](t, *args)
            self._events_run += 1
        self._wall_s += time.perf_counter() - started

    # --- sizes and times -----------------------------------------------------------------------

    def _setup_shape(self, shape: Shape) -> None:
        sc = self.sc
        self.shape = shape
        self.per_update = max(1, sc.batch_sequences // sc.micro_batch)
        self.act_bytes = float(sc.micro_batch * sc.model.seq_len * sc.model.hidden * sc.model.dtype_bytes)
        self.token_bytes = float(sc.micro_batch * sc.model.seq_len * 4)
        self.weights_bytes = sc.grad_bytes(shape)
        self.checkpoint_bytes = 3 * self.weights_bytes  # weights and AdamW's two moments

    def _stage_flops(self, layers: Sequence[int]) -> list[float]:
        """Forward and backward flops of one micro-batch on each stage."""
        per_sequence = stage_flops_per_sequence(self.sc, np.asarray(layers, dtype=float))
        return [float(f) * self.sc.micro_batch for f in per_sequence]

    def _send(self, src: int, dst: int, nbytes: float, now: float, kind: int | None = None, args: tuple = (),
              after: float = 0.0, via: int | None = None) -> None:  # fmt: skip
        """``nbytes`` leave ``src`` for ``dst`` at ``now`` as a flow sharing the links; once
        its last byte is through and the latency has passed (and ``after`` more seconds, an
        answer's way back), event ``kind`` fires with ``args``. Through relay ``via``: a flow
        to it, and once all of it is there (the relay stores and forwards a message) a flow on."""
        if src == dst or nbytes <= 0:
            if kind is not None:
                self._at(now + after, kind, args)
            return
        self.sent[src] += nbytes
        if via is not None and via not in (src, dst):
            self.counts["relayed_transfers"] += 1
            self.received[via] += nbytes
            self.links.start(now, src, via, nbytes, (_HOP, (src, via, dst, nbytes, kind, args, after),
                                                     self._one_way(src, via, nbytes)))  # fmt: skip
            return
        self.received[dst] += nbytes
        self.links.start(now, src, dst, nbytes, (kind, args, self._one_way(src, dst, nbytes) + after))

    def _hop(self, now: float, src: int, relay: int, dst: int, nbytes: float, kind: int | None, args: tuple,
             after: float) -> None:  # fmt: skip
        """A relayed message is all at the relay: it goes on to its peer. A relay that left
        meanwhile never forwards it; the sender finds the relay unreachable and sends it
        again on the direct path (the daemon's ``Router``), if it is still there itself."""
        if self.up[relay]:
            self._send(relay, dst, nbytes, now, kind, args, after)
        elif self.up[src]:
            self.counts["relay_gone"] += 1
            self._send(src, dst, nbytes, now, kind, args, after)

    def _send_now(self, now: float, src: int, dst: int, nbytes: float, kind: int, args: tuple,
                  via: int | None = None) -> None:  # fmt: skip
        self._send(src, dst, nbytes, now, kind, args, via=via)

    def _flow_due(self, now: float, fid: int, serial: int) -> None:
        payload = self.links.due(now, fid, serial)
        if payload is not None:
            kind, args, delay = payload
            if kind is not None:
                self._at(now + delay, kind, args)

    # --- planning ----------------------------------------------------------------------------

    def _live(self) -> list[int]:
        return [int(i) for i in np.flatnonzero(self.member)]

    def _plan_now(self, now: float, initial: bool = False) -> None:
        live = self._live()
        in_scenario = not initial and self.plan is not None and self.strategy.mend_live is not None
        view = self.sc if in_scenario else self.sc.with_devices(live)
        started = time.perf_counter()
        try:
            if in_scenario:
                assert self.strategy.mend_live is not None
                result, kind = self.strategy.mend_live(self.sc, np.asarray(live), self.global_plan), "repair"
            elif initial or self.plan is None:
                result, kind = self.strategy.full_plan(view), "full"
            elif self.strategy.mend is not None:
                result, kind = self.strategy.mend(view, self.plan, self.live_ids), "repair"
            else:
                result, kind = self.strategy.full_plan(view), "replan"
        except (ScenarioError, ValueError) as e:
            if initial:
                raise
            # Too few devices for the run's stages (or for the shape): keep the plan in force.
            self.plan_events.append(PlanEvent(now, f"failed: {str(e)[:80]}", time.perf_counter() - started,
                                              len(live), 0))  # fmt: skip
            return
        runtime = time.perf_counter() - started
        # The result's indices: the scenario's (a mend in it) or the live devices' (a view).
        to_global = range(self.sc.n) if in_scenario else live
        pipelines = tuple(tuple(to_global[d] for d in row) for row in result.pipelines)
        global_plan = Plan(
            pipelines=pipelines,
            layers_per_stage=result.layers_per_stage,
            parameter_servers=tuple(to_global[d] for d in result.parameter_servers),
            relays=tuple(to_global[d] for d in result.relays),
        )
        self.plan_events.append(PlanEvent(now, kind, runtime, len(live), len(pipelines)))
        if initial:
            self._apply(global_plan, live, now)
            self._start(now)
        else:
            self.planning = True
            c = self.coordinator
            assert c is not None  # a plan is started only by a coordinator (``_want_plan``)
            self._at(now + runtime, _PLAN_READY, (global_plan, live, c, int(self.epoch[c])))

    def _plan_ready(self, now: float, global_plan: Plan, live: list[int], by: int, epoch: int) -> None:
        self.planning = False
        if self.epoch[by] != epoch:
            # Its coordinator left while computing it: nobody publishes it. The next coordinator
            # plans once that departure is noticed (``_notice`` elects it).
            self.counts["plans_lost"] += 1
            self.replan_wanted = True
        else:
            self._apply(global_plan, live, now)
        if self.replan_wanted:
            self._want_plan(now)

    def _want_plan(self, now: float) -> None:
        """A change was noticed: the coordinator plans at its next round, if it is there. One
        that left but is still a member (its departure not yet noticed) plans nothing; nor
        does anyone else, until the departure is noticed and the next coordinator elected."""
        if self.plan_pending:
            return  # the round to come sees this change too
        if self.planning:
            self.replan_wanted = True
            return
        c = self.coordinator
        if c is None or not self.up[c]:
            self.replan_wanted = True
            return
        if len(self._live()) < len(self.stages or [0]):
            return
        self.replan_wanted = False
        self.plan_pending = True
        self._at(self._next_round(c, now), _PLAN_START, (c, int(self.epoch[c])))

    def _next_round(self, c: int, now: float) -> float:
        """The first of coordinator ``c``'s rounds at or after ``now``."""
        period = self.s.coordinate_s
        if period <= 0:
            return now
        phase = float(self.round_phase[c])
        return phase + math.ceil(max(0.0, now - phase) / period) * period

    def _plan_start(self, now: float, c: int, epoch: int) -> None:
        self.plan_pending = False
        if self.coordinator == c and self.epoch[c] == epoch and self.up[c]:
            self._plan_now(now)
        else:  # it left, or was replaced, before its round: whoever coordinates now plans
            self.replan_wanted = True
            self._want_plan(now)

    def _elect_coordinator(self) -> None:
        """The coordinator among the members (``elect_coordinator``). That function keeps an
        eligible incumbent whoever else is there, so the candidates are listed only when the
        incumbent left or fell below the thresholds (a list of every member at each change
        would cost more than the rest of the run at 10,000 devices)."""
        current = self.coordinator if self.coordinator is not None and self.member[self.coordinator] else None
        if current is not None and eligible(self.candidates[current], self.s.thresholds, incumbent=True):
            return
        chosen = elect_coordinator([self.candidates[d] for d in self._live()],
                                   None if current is None else self.ids[current], self.s.thresholds)  # fmt: skip
        elected = None if chosen is None else self.index[chosen]
        if self.coordinator is not None and elected != self.coordinator:
            self.counts["coordinator_changes"] += 1
        self.coordinator = elected

    def _apply(self, global_plan: Plan, live: list[int], now: float) -> None:
        """Follow a new plan: its cells become the workers; the plan's indices, local to
        ``live``, are kept for the next mend. Hosts stay where they are unless gone."""
        local = {d: i for i, d in enumerate(live)}
        self.plan = Plan(
            pipelines=tuple(tuple(local[d] for d in row) for row in global_plan.pipelines),
            layers_per_stage=global_plan.layers_per_stage,
            parameter_servers=tuple(local[d] for d in global_plan.parameter_servers),
            relays=tuple(local[d] for d in global_plan.relays),
        )
        self.live_ids = [self.sc.devices[i].id for i in live]
        # The relays, as the daemon's coordinator elects them for its plan: the incumbents
        # still members first, then the planner's choices, then the best others.
        incumbents = [self.ids[r] for r in self.relays if self.member[r]]
        preferred = [self.ids[r] for r in global_plan.relays]
        wanted = relays_wanted(len(live)) if self.strategy.relays else 0
        chosen = elect_relays([self.candidates[d] for d in live], incumbents, self.s.thresholds, wanted,
                              preferred=preferred)  # fmt: skip
        relays = [self.index[p] for p in chosen]
        if relays != self.relays:
            self.relays = relays
            self._routes.clear()
        self.plan = replace(self.plan, relays=tuple(local[d] for d in relays))
        global_plan = replace(global_plan, relays=tuple(relays))
        self.global_plan = global_plan
        self.flops = self._stage_flops(global_plan.layers_per_stage)
        if not self.stages:
            return
        previous = self.worker_stage
        self.worker_stage = self._homes(live)
        for d, s in list(self.worker_stage.items()):
            # An idle worker kept on its stage is already waiting for work: asking again would
            # find none (at 1,000 devices, re-asking every idle worker made most of the time).
            if d not in self.busy and (d not in self.idle_since or previous.get(d) != s):
                self._idle(d, now)
        for s, stage in enumerate(self.stages):
            if stage.standby is None or not self.member[stage.standby]:
                self._new_standby(s, now)
        for s, server in enumerate(global_plan.parameter_servers):
            if server != self.planned[s]:
                self.planned[s], self.planned_since[s] = server, now
            if server != self.stages[s].host:
                due = max(self.planned_since[s] + HAND_OVER_SETTLED_S, self.stages[s].hosted_since + HAND_OVER_HELD_S)
                self._at(max(now, due), _FOLLOW, (s,))

    def _homes(self, live: list[int]) -> dict[int, int]:
        """Each live member's stage, as the daemon's worker prefers it (``Trainer._home``): a
        host the stage it hosts, else the plan's stage for it, else by its rank (peer ID) among
        the members that host nothing, spread over the stages: every member works."""
        hosted: dict[int, int] = {}
        for s, stage in enumerate(self.stages):
            hosted.setdefault(stage.host, s)
        homes = {d: s for row in self.global_plan.pipelines for s, d in enumerate(row) if self.up[d]}
        homes.update((d, s) for d, s in hosted.items() if self.up[d])
        spare = [d for d in live if self.up[d] and d not in homes]
        if spare:
            ranked = sorted((d for d in live if d not in hosted), key=self.ids.__getitem__)
            rank = {d: i for i, d in enumerate(ranked)}
            homes.update((d, rank[d] % len(self.stages)) for d in spare)
        return homes

    def _follow(self, now: float, s: int) -> None:
        """The daemon's rule for a stage held elsewhere than at the plan's server
        (``follows_plan``, then ``decide``'s: the server is an eligible member with room): the
        stage is handed over. A plan that changed since has scheduled its own look."""
        stage = self.stages[s]
        server = self.planned[s]
        if server is None or server == stage.host:
            return
        # Not yet, or not now: the daemon's holder looks again every round; here, again later.
        again = max(now + HAND_OVER_SETTLED_S, stage.hosted_since + HAND_OVER_HELD_S)
        if stage.opening or not self.up[stage.host] or not follows_plan(
            self.ids[stage.host], self.ids[server], now - self.planned_since[s], now - stage.hosted_since
        ):  # fmt: skip
            self._at(again, _FOLLOW, (s,))
            return
        hosts = self.member & self.may_host
        if not hosts.any():
            hosts = self.member  # nobody passes the thresholds: everyone may host
        share = fair_share(len(self.stages), int(hosts.sum()))
        if not (self.up[server] and hosts[server]) or sum(st.host == server for st in self.stages) >= share:
            self._at(again, _FOLLOW, (s,))
            return
        self._hand_over(s, server, now)

    def _hand_over(self, s: int, new: int, now: float) -> None:
        """The stage goes to ``new``, which fetches the checkpoint from the host it leaves; the
        hosting epoch changes, so the work in flight is redone from stage 0 (as at a failover,
        but nothing is lost: the old host's copy is the newest)."""
        stage = self.stages[s]
        old = stage.host
        self.counts["hand_overs"] += 1
        stage.replicas[old] = stage.version
        stage.replicas.pop(new, None)
        stage.host, stage.hosted_since, stage.opening, stage.opened_from = new, now, True, old
        # The new host elects its own standby once it is open (``_opened``) and sends it a copy.
        stage.standby, stage.standby_ready = None, False
        self.worker_stage = self._homes(self._live())
        self._reset_in_flight(now)
        self._send(old, new, self.checkpoint_bytes, now, _OPENED, (s, new, int(self.epoch[new])))

    def _opened(self, now: float, s: int, host: int, epoch: int) -> None:
        """The new host has the checkpoint: it serves (with a standby of its own), and the idle
        workers find its work. One that left and came back meanwhile (unnoticed) fetches it
        again, from the old host if that is still there, else from nowhere (it has a copy)."""
        stage = self.stages[s]
        if stage.host != host or not stage.opening:
            return
        if self.epoch[host] != epoch:
            if self.up[host]:
                source = stage.opened_from if stage.opened_from is not None and self.up[stage.opened_from] else host
                self._send(source, host, self.checkpoint_bytes, now, _OPENED, (s, host, int(self.epoch[host])))
            return
        stage.opening = False
        if stage.standby is None or not self.member[stage.standby]:
            self._new_standby(s, now)
        for _ in range(max(1, stage.queue.ready_count())):  # every idle worker its work can keep busy
            self._wake(s, now)

    def _start(self, now: float) -> None:
        grid = self.global_plan.pipelines
        self._setup_shape(Shape(len(grid[0]), len(grid)))
        for s in range(self.shape.stages):
            config = TaskQueueConfig(stage=s, capacity_bytes=QUEUE_CAPACITY_BYTES,
                                     max_micro_batches=min(65536, self.per_update * (2 + self.s.batches_ahead)),
                                     max_lease_s=max(self.s.lease_s, 1.0))  # fmt: skip
            self.stages.append(_Stage(TaskQueue(config), self.global_plan.parameter_servers[s], None))
        self.planned: list[int | None] = list(self.global_plan.parameter_servers)  # each stage's server in the plan
        self.planned_since = [now] * self.shape.stages  # since when the plan has named it
        self._apply(self.global_plan, self._live(), now)
        self._feed(now)

    def _group(self, s: int) -> list[int]:
        return [row[s] for row in self.global_plan.pipelines]

    def _new_standby(self, s: int, now: float) -> None:
        """The daemon's standby (``elect_standby``): the member other than the host likeliest
        to stay, by reliability (here the scenario's availability), then the fastest link from
        the host, then the longest membership, then the lowest ID. It gets a copy of the stage's checkpoint; until that
        lands, pushes apply unreplicated. Every host picks by the same order, so the stages'
        standbys fall on the same few peers, as they do in a real swarm."""
        stage = self.stages[s]
        preferred = [d for d in self.standby_preference.get(s, ()) if self.member[d] and d != stage.host]
        if preferred:
            best = preferred[0]
        else:
            # Reliability to one decimal, as the daemon's coordinator rounds it.
            chosen = elect_standby((self.ids[d], round(float(self.availability[d]), 1),
                                    now - float(self.member_since[d]), float(self.sc.bandwidth_Bps[stage.host, d]))
                                   for d in np.flatnonzero(self.member).tolist() if d != stage.host)  # fmt: skip
            if chosen is None:
                stage.standby, stage.standby_ready = None, False
                return
            best = self.index[chosen]
        stage.standby, stage.standby_ready = best, False
        self._send(stage.host, best, self.checkpoint_bytes, now, _STANDBY_READY,
                   (s, best, int(self.epoch[best]), stage.host, int(self.epoch[stage.host])))  # fmt: skip

    def _standby_ready(self, now: float, s: int, standby: int, standby_epoch: int, host: int,
                       host_epoch: int) -> None:  # fmt: skip
        """The checkpoint copy landed (with the log since it was sent): the standby follows,
        if the host that sent it still hosts the stage."""
        stage = self.stages[s]
        if (stage.standby == standby and stage.host == host and self.epoch[standby] == standby_epoch
                and self.epoch[host] == host_epoch):  # fmt: skip
            stage.standby_ready = True
            stage.replicas[standby] = stage.version

    # --- churn -------------------------------------------------------------------------------

    def _churn(self, now: float, device: int, up: bool) -> None:
        self.up[device] = up
        if device in self.relays:
            self._routes.clear()  # routes avoid relays that are down
        if up:
            self.counts["returns"] += 1
            self._at(now + self.s.join_s, _NOTICE, (device, True, int(self.epoch[device])))
            return
        self.counts["departures"] += 1
        self.epoch[device] += 1
        self.busy.discard(device)
        self.job[device] = self.job.get(device, 0) + 1
        for s in range(len(self.stages)):
            self.held.pop((device, s), None)
        if self.plan is not None and device in self.worker_stage:
            self.departure_times.append(now)
        self._at(now + self.s.detect_s, _NOTICE, (device, False, int(self.epoch[device])))

    def _notice(self, now: float, device: int, up: bool, epoch: int) -> None:
        if self.epoch[device] != epoch or self.up[device] != up:
            return  # it changed again before anyone noticed
        self.member[device] = up
        self.member_since[device] = now
        self._elect_coordinator()
        if not up:
            self.worker_stage.pop(device, None)
            for stage in self.stages:
                if device in stage.waiting:
                    stage.waiting.remove(device)
                self.counts["recomputed"] += len(stage.queue.drop_worker(str(device), now))
            for s, stage in enumerate(self.stages):
                if stage.host == device:
                    self._failover(s, now)
                elif stage.standby == device:
                    self._new_standby(s, now)
        self._want_plan(now)

    def _failover(self, s: int, now: float) -> None:
        """The stage's host is gone: the live peer with the newest copy takes over (the standby,
        when it was following); what it lacks of the applied updates is lost, and counted. As in
        the daemon, the micro-batches in flight are redone from stage 0."""
        stage = self.stages[s]
        self.counts["failovers"] += 1
        stage.replicas.pop(stage.host, None)
        copies = {d: v for d, v in stage.replicas.items() if self.member[d]}
        if copies:
            successor = max(copies, key=lambda d: (copies[d], self.availability[d], -d))
            restored = copies[successor]
        else:  # no copy survives: the stage starts again from its initial weights
            live = [d for d in self._group(s) if self.member[d]] or self._live()
            successor = max(live, key=lambda d: (self.availability[d], -d))
            restored = 0
        self.counts["updates_lost"] += stage.version - restored
        stage.version, stage.host, stage.pending = restored, successor, 0
        stage.hosted_since, stage.opening = now, False
        stage.replicas.pop(successor, None)
        stage.standby, stage.standby_ready = None, False
        self._new_standby(s, now)
        self.worker_stage = self._homes(self._live())
        self._reset_in_flight(now)

    def _reset_in_flight(self, now: float) -> None:
        self.counts["recomputed"] += len(self.in_flight)
        redo = sorted(self.in_flight)
        self.in_flight.clear()
        self.generation += 1
        for stage in self.stages:
            stage.queue = TaskQueue(stage.queue.config)
            stage.waiting.clear()
            stage.pushes.clear()
            stage.serving = False
            stage.serial += 1
        self.busy.clear()
        self.held.clear()
        for d in self.job:
            self.job[d] += 1
        for m in redo:
            self._put_forward(0, m, now)
        self._feed(now)
        for d in list(self.worker_stage):
            self._idle(d, now)

    # --- the data path -----------------------------------------------------------------------

    def _feed(self, now: float) -> None:
        """Stage 0 puts new micro-batches while the pipeline has room, as the daemon's stage 0
        host does: a micro-batch finished but not yet in an update still takes its place."""
        limit = self.per_update * (1 + self.s.batches_ahead) - self.stages[0].pending
        while len(self.in_flight) < min(limit, self.s.max_in_flight):
            m = self.next_micro_batch
            self.next_micro_batch += 1
            self._put_forward(0, m, now)

    def _put_forward(self, s: int, m: int, now: float) -> None:
        self.in_flight.add(m)
        self.stages[s].queue.put(Task(task_id=f"f{m}", micro_batch=m, stage=s, kind=TaskKind.FORWARD, payload=None),
                                 0, now)  # fmt: skip
        self._wake(s, now)

    def _wake(self, s: int, now: float) -> None:
        """Work arrived at stage ``s``: an idle worker of that stage asks for it at its next
        round of claims, else an idle worker of another stage (whose own stage has nothing, or
        it would not be waiting)."""
        for t in [s, *(t for t in range(len(self.stages)) if t != s)]:
            waiting = self.stages[t].waiting
            while waiting:
                d = waiting.pop()
                if self.worker_stage.get(d) == t and d not in self.busy:
                    self._poll_next_round(d, now)
                    return

    def _round_s(self, d: int) -> float:
        """How long a round of claims that finds nothing takes the worker: one round trip to
        every stage's host (the daemon's worker asks them all in turn)."""
        return sum(self._rtt(d, stage.host, self._route(d, stage.host, 0.0)) for stage in self.stages
                   if self.up[stage.host])  # fmt: skip

    def _fruitless(self, d: int, home: int, now: float) -> None:
        """A round of claims found nothing: the worker is idle, as the daemon's is. It waits to
        be woken by work (``_wake``), which it notices at its next round of claims; once idle
        ``FLUSH_IDLE_S`` it pushes what it holds (``swarmd.peers.idle_polling``)."""
        self._count_fruitless(d, 1)
        round_s = self._round_s(d)
        since = self.idle_since.setdefault(d, now + round_s)
        if d not in self.stages[home].waiting:
            self.stages[home].waiting.append(d)
        if any(self.held.get((d, s)) for s in range(len(self.stages))):
            self._at(max(now + round_s, since + flush_at(round_s)), _FLUSH, (d, since))

    def _count_fruitless(self, d: int, rounds: int) -> None:
        """``rounds`` rounds of claims that found nothing, in the workers' request counts."""
        if rounds > 0:
            for stage in self.stages:
                if self.up[stage.host]:
                    self.requests.add("claim", self._rtt(d, stage.host, self._route(d, stage.host, 0.0)), rounds)

    def _flush(self, now: float, d: int, since: float) -> None:
        """Still idle in the same spell: push a stage's gradient sum (the next round pushes the
        next stage's)."""
        if d in self.busy or self.idle_since.get(d) != since or d not in self.worker_stage:
            return
        unpushed = next((s for s in range(len(self.stages)) if self.held.get((d, s))), None)
        if unpushed is not None:
            self._begin(d)
            self._push(d, unpushed, now)

    def _poll_next_round(self, d: int, now: float) -> None:
        """Work arrived for an idle worker: it asks at its next round of claims, by the
        daemon's schedule; the rounds before it found nothing and are counted as such."""
        since = self.idle_since.get(d)
        if since is None:
            self._idle(d, now)
            return
        round_s = self._round_s(d)
        start, rounds = next_round(max(0.0, now - since), round_s)
        self._count_fruitless(d, rounds - self.idle_rounds.get(d, 0))
        self.idle_rounds[d] = rounds
        self.poll_serial[d] = serial = self.poll_serial.get(d, 0) + 1
        self._at(since + start, _POLL, (d, serial))

    def _poll(self, now: float, d: int, serial: int) -> None:
        if self.poll_serial.get(d) == serial:
            self._idle(d, now)

    def _claim(self, d: int, home: int, now: float) -> tuple[int, Lease] | None:
        """A lease from the home stage, else from the most backlogged other stage with work
        (later stages first on a tie), as the daemon's worker orders its claims."""
        others = sorted((t for t in range(len(self.stages)) if t != home),
                        key=lambda t: (-self.stages[t].queue.ready_count(), -t))  # fmt: skip
        for s in [home, *others]:
            stage = self.stages[s]
            if not self.up[stage.host] or stage.opening:
                continue  # its host is gone (the failover, once noticed, starts it again) or opening
            lease = stage.queue.claim(str(d), now, self.s.lease_s)
            if lease is not None:
                return s, lease
        return None

    def _rtt(self, a: int, b: int, via: int | None = None) -> float:
        """A request's way there and its answer's way back, without their bytes."""
        return 0.0 if a == b else self._way(a, b, via) + self._way(b, a, via) + self._overheads(a, b, via)

    def _back(self, a: int, b: int, via: int | None = None) -> float:
        """An answer's way from ``a`` back to ``b`` (a request to ``a`` just landed), with
        the stack's own cost of the request (``_overheads``)."""
        return 0.0 if a == b else self._way(a, b, via) + self._overheads(a, b, via)

    def _way(self, a: int, b: int, via: int | None) -> float:
        """The latency from ``a`` to ``b``, through relay ``via`` if it is a third peer."""
        if via is None or via in (a, b):
            return self._one_way(a, b)
        return self._one_way(a, via) + self._one_way(via, b)

    def _overheads(self, a: int, b: int, via: int | None) -> float:
        """The stack's cost of a request: once, or twice when relayed (the relay's own
        request to the peer is the second)."""
        return self.s.request_overhead_s * (1 if via is None or via in (a, b) else 2)

    def _route(self, d: int, host: int, nbytes: float) -> int | None:
        """The relay worker ``d``'s request of ``nbytes`` to ``host`` goes through, or None
        for the direct path: the daemon's rule (``choose_route``) on the scenario's matrix,
        among the plan's relays that are up. (The daemon tries a relay that left unnoticed
        and falls back to the direct path when it is unreachable; that failed dial is not
        simulated.) Cached per worker, host and size until the relays change."""
        if d == host or not self.relays or self.s.data_via_relay == "never":
            return None
        key = (d, host, nbytes)
        if key not in self._routes:
            if len(self._routes) >= 1 << 20:  # bounded: a few sizes per worker and host
                self._routes.clear()
            relays = [self.ids[r] for r in self.relays if self.up[r]]
            chosen = choose_route(self.ids[d], self.ids[host], relays, self.matrix, nbytes, direct_blocked=False,
                                  mode=self.s.data_via_relay)  # fmt: skip
            self._routes[key] = None if chosen is None else self.index[chosen]
        return self._routes[key]

    def _one_way(self, a: int, b: int, nbytes: float = 0.0) -> float:
        """The latency from ``a`` to ``b`` of a message of ``nbytes``, plus the standing queue of
        each end's interface that is busy with other flows (a bulk TCP flow keeps its
        bottleneck's buffer full, and every packet behind it waits that long:
        ``SimSettings.standing_queue_s``), plus the wait behind a transfer already in flight from
        ``a`` to ``b`` on their shared connection (``SimSettings.connection_queue_bytes``). That
        connection's buffer is first come, first served, where the shared links split the rate
        evenly: a message larger than the buffer loses as much by the even split as it would by
        waiting, so it waits only for the difference."""
        queued = (a in self.links.sending) + (b in self.links.receiving)
        behind = 0.0
        if self.s.connection_queue_bytes and self.links.carrying(a, b):
            behind = max(0.0, self.s.connection_queue_bytes - nbytes) / float(self.sc.bandwidth_Bps[a, b])
        return float(self.sc.latency_s[a, b]) + queued * self.s.standing_queue_s + behind

    def _idle(self, d: int, now: float) -> None:
        """The worker asks for a task (a claim: one request, the stage input and any weights
        it lacks come back with the answer). With none anywhere, it is idle (``_fruitless``)."""
        home = self.worker_stage.get(d)
        if home is None or not self.up[d] or d in self.busy:
            return
        # A sum whose oldest lease has run a third of its time is pushed first: it must not
        # expire (the daemon's ``_flush_old``).
        old = next((s for s in range(len(self.stages))
                    if self.held.get((d, s)) and now - self.held_since[(d, s)] > self.s.lease_s / 3), None)  # fmt: skip
        if old is not None:
            self._begin(d)
            self._push(d, old, now)
            return
        claimed = self._claim(d, home, now)
        if claimed is None:
            self._fruitless(d, home, now)
            return
        self.idle_since.pop(d, None)
        self.idle_rounds.pop(d, None)
        s, lease = claimed
        stage = self.stages[s]
        job = self._begin(d)
        task = lease.task
        last = s == self.shape.stages - 1
        forward = task.kind is TaskKind.FORWARD
        version = stage.version if forward else (task.weights_version or 0)
        nbytes = (self.token_bytes if s == 0 else self.act_bytes) + (0 if forward else self.act_bytes)
        held = self.weights.setdefault((d, s), [])
        self.counts["tasks_" + ("last" if last else task.kind.value)] += 1
        # A new forward computes on the host's newest version or a newer one held here; a
        # backward needs exactly the version its forward used.
        if not (held and (held[-1] >= version if forward else version in held)):
            self.counts["weight_pulls"] += 1
            nbytes += self.weights_bytes
            held.append(version)
            held.sort()
            del held[: -self.s.keep_versions]
        flops = self.flops[s] if (last or not forward) else self.flops[s] / 3.0
        if not forward:
            flops += self.flops[s] / 3.0  # the forward is recomputed on the task's weights
        token = (d, job, self.generation, s, lease, version)
        # The answer leaves once the claim has reached the host (a flow starts at its event).
        via = self._route(d, stage.host, 0.0)
        self._at(now + self._back(d, stage.host, via), _SEND,
                 (stage.host, d, nbytes, _CLAIMED, (token, now, flops / self.tflops[d]), via))  # fmt: skip

    def _claimed(self, now: float, token: tuple, asked: float, compute_s: float) -> None:
        """The claim's answer is in: the worker computes."""
        self.requests.add("claim", now - asked)
        self._at(now + compute_s, _COMPUTED, token)

    def _begin(self, d: int) -> int:
        self.busy.add(d)
        self.job[d] = job = self.job.get(d, 0) + 1
        return job

    def _computed(self, now: float, d: int, job: int, generation: int, s: int, lease: Lease, version: int) -> None:
        """The results leave when the compute is done. A forward's output is put at the next
        stage's host, then the lease completed (a second request). A finishing task puts its
        input's gradient at the previous stage's host and keeps its own gradient in the sum,
        pushed every ``push_every`` micro-batches (its lease held until then)."""
        if self.job.get(d) != job:
            return  # the worker left, or its work was voided: the lease goes back to the queue
        token = (d, job, generation, s, lease, version)
        if lease.task.kind is TaskKind.FORWARD and s < self.shape.stages - 1:
            nxt = self.stages[s + 1].host
            self._send(d, nxt, self.act_bytes, now, _FORWARD_PUT, (token, nxt, now),
                       via=self._route(d, nxt, self.act_bytes))  # fmt: skip
            return
        held = self.held.setdefault((d, s), [])
        if not held:
            self.held_since[(d, s)] = now
        held.append(token)
        if s > 0:
            prev = self.stages[s - 1].host
            self._send(d, prev, self.act_bytes, now, _BACKWARD_PUT, (token, prev, now),
                       via=self._route(d, prev, self.act_bytes))  # fmt: skip
        else:
            self._put_answered(now, d, job, s)

    def _forward_put(self, now: float, token: tuple, nxt: int, sent: float) -> None:
        """A forward's output reached the next stage's host: the task lands there, the answer
        goes back, and the worker completes its lease (a second request)."""
        d, job, s = token[0], token[1], token[3]
        answered = now + self._back(nxt, d, self._route(d, nxt, self.act_bytes))
        host = self.stages[s].host
        complete = self._rtt(d, host, self._route(d, host, 0.0))
        self.requests.add("put", answered - sent)
        self.requests.add("complete", complete)
        self._at(answered + complete, _FREE, (d, job))
        self._deliver(now, *token)

    def _backward_put(self, now: float, token: tuple, prev: int, sent: float) -> None:
        """A finishing task's input gradient reached the previous stage's host."""
        d, job, s = token[0], token[1], token[3]
        answered = now + self._back(prev, d, self._route(d, prev, self.act_bytes))
        self.requests.add("put", answered - sent)
        self._at(answered, _PUT_ANSWERED, (d, job, s))
        self._put_back(now, *token)

    def _put_answered(self, now: float, d: int, job: int, s: int) -> None:
        """The finishing task is done but for its gradient: pushed once ``push_every`` are
        summed, else the worker claims again."""
        if self.job.get(d) != job:
            return
        if len(self.held.get((d, s), ())) >= self.s.push_every:
            self._push(d, s, now)
        else:
            self._free(now, d, job)

    def _push(self, d: int, s: int, now: float) -> None:
        """The worker's gradient sum goes to the stage's server with the leases it covers."""
        tokens = self.held.pop((d, s), [])
        host = self.stages[s].host
        self._send(d, host, self.weights_bytes, now, _FINISH, (d, self.job[d], s, tokens, now),
                   via=self._route(d, host, self.weights_bytes))  # fmt: skip

    def _current(self, d: int, generation: int, s: int, lease: Lease, now: float) -> bool:
        """Whether the worker's result still counts: the queues were not rebuilt, and it still
        holds the lease (it did not leave, and the lease was not re-queued meanwhile)."""
        return (
            self.generation == generation and self.up[d]
            and self.stages[s].queue.holds(lease.lease_id, str(d), now)
        )  # fmt: skip

    def _deliver(self, now: float, d: int, job: int, generation: int, s: int, lease: Lease, version: int) -> None:
        """A forward's output reaches the next stage's host; the lease completes there."""
        if not self._current(d, generation, s, lease, now):
            return
        if self.up[self.stages[s + 1].host]:
            m = lease.task.micro_batch
            task = Task(task_id=f"f{m}.{lease.lease_id}", micro_batch=m, stage=s + 1, kind=TaskKind.FORWARD,
                        payload=None)  # fmt: skip
            try:
                self.stages[s + 1].queue.put(task, 0, now)
            except QueueFull:  # the daemon's worker retries, then hands the task back: it is redone
                self.counts["puts_refused_full"] += 1
                self.stages[s].queue.fail(lease.lease_id, str(d), now)
                return
            self.stages[s].queue.complete(lease.lease_id, str(d), now, weights_version=version)
            self._wake(s + 1, now)
        else:  # the put did not land: the task goes back to the queue
            self.stages[s].queue.fail(lease.lease_id, str(d), now)

    def _put_back(self, now: float, d: int, job: int, generation: int, s: int, lease: Lease, version: int) -> None:
        """The gradient of a finishing task's input reaches the previous stage's host."""
        if not self._current(d, generation, s, lease, now) or not self.up[self.stages[s - 1].host]:
            return
        m = lease.task.micro_batch
        task = Task(task_id=f"b{m}.{lease.lease_id}", micro_batch=m, stage=s - 1, kind=TaskKind.BACKWARD,
                    payload=None)  # fmt: skip
        try:
            self.stages[s - 1].queue.put(task, 0, now)
        except TaskQueueError:  # another copy of the micro-batch got there first (the daemon's already_there)
            return
        self._wake(s - 1, now)

    def _finish(self, now: float, d: int, job: int, s: int, tokens: list[tuple], pushed_at: float) -> None:
        """A push reaches its parameter server, which logs it at its standby before applying
        it; the worker's request returns once it is applied."""
        stage = self.stages[s]
        if self.job.get(d) != job or not self.up[stage.host]:
            return
        stage.pushes.append((now, d, job, tokens, pushed_at))
        self._serve(s, now)

    def _serve(self, s: int, now: float) -> None:
        """The server takes the next push, if it is free: logs it at the standby (a flow on
        the host's uplink, beside whatever else the host sends) and applies it once the
        standby has answered; with no standby ready, applies it at once (in an event of its own, so
        a long queue of pushes is not served by recursion)."""
        stage = self.stages[s]
        if stage.serving or not stage.pushes:
            return
        stage.serving = True
        arrived, *push = stage.pushes.popleft()
        self.push_phases.add("wait_for_lock", now - arrived)
        args = (s, stage.serial, now, *push)
        if stage.standby_ready and stage.standby is not None and self.up[stage.standby]:
            self._send(stage.host, stage.standby, self.weights_bytes, now, _LOGGED, args,
                       after=self._back(stage.standby, stage.host))  # fmt: skip
        else:
            self._at(now, _LOGGED, args)

    def _logged(self, now: float, s: int, serial: int, started: float, d: int, job: int, tokens: list[tuple],
                pushed_at: float) -> None:  # fmt: skip
        """The push is committed (logged, or no standby to log it at): the server applies the
        micro-batches whose leases are still the worker's, and completes those leases."""
        stage = self.stages[s]
        if stage.serial != serial:
            return  # the queues were rebuilt meanwhile: this push was for the stage's old run
        stage.serving = False
        if now > started:
            self.push_phases.add("log_at_standby", now - started)
        if not self.up[stage.host]:
            return
        for _, _, generation, _, lease, version in tokens:
            if not self._current(d, generation, s, lease, now):
                self.counts["pushes_refused"] += 1
                continue
            staleness = stage.version - version
            if staleness > self.s.max_staleness:
                self.counts["stale_dropped"] += 1
            else:
                self.staleness[staleness] += 1
                stage.pending += 1
                if stage.pending >= self.per_update:
                    stage.pending -= self.per_update
                    stage.version += 1
                    if stage.standby_ready and stage.standby is not None:
                        stage.replicas[stage.standby] = stage.version  # logged there before it applied
                        if stage.version % self.s.checkpoint_every == 0:
                            self._send(stage.host, stage.standby, self.checkpoint_bytes, now)
            stage.queue.complete(lease.lease_id, str(d), now, finishes_micro_batch=True)
            if s == 0:
                self.in_flight.discard(lease.task.micro_batch)
                bucket = int(now // self.s.bucket_s)
                if bucket < len(self.timeline):
                    self.timeline[bucket] += 1
        if s == 0:
            self._feed(now)
        if self.job.get(d) == job:
            answered = now + self._back(stage.host, d, self._route(d, stage.host, self.weights_bytes))
            self.requests.add("push", answered - pushed_at)
            self._at(answered, _FREE, (d, job))
        self._serve(s, now)

    def _free(self, now: float, d: int, job: int) -> None:
        if self.job.get(d) == job:
            self.busy.discard(d)
            self._idle(d, now)

    # --- the result --------------------------------------------------------------------------

    def _result(self, wall_s: float, events: int) -> SimResult:
        finished = sum(self.timeline)
        per_mb = self.sc.micro_batch * self.sc.model.seq_len
        return SimResult(
            strategy=self.strategy.name, hours=self.s.hours, seed=self.s.seed, devices=self.sc.n,
            tokens=finished * per_mb, tokens_per_s=finished * per_mb / self.horizon,
            timeline=self.timeline, bucket_s=self.s.bucket_s, tokens_per_micro_batch=per_mb,
            updates=min(st.version for st in self.stages) if self.stages else 0,
            updates_lost=self.counts["updates_lost"], micro_batches_recomputed=self.counts["recomputed"],
            stale_dropped=self.counts["stale_dropped"], staleness=dict(sorted(self.staleness.items())),
            departures=self.counts["departures"], returns=self.counts["returns"], plan_events=self.plan_events,
            recovery_s=recovery_times(self.timeline, self.s.bucket_s, self.departure_times),
            wall_s=wall_s, events=events, failovers=self.counts["failovers"],
            coordinator_changes=self.counts["coordinator_changes"], plans_lost=self.counts["plans_lost"],
            relays=len(self.relays), relayed_transfers=self.counts["relayed_transfers"],
            hand_overs=self.counts["hand_overs"],
            shape=(self.shape.stages, self.shape.data_parallel),
            requests=self.requests.status(), push_phases=self.push_phases.status(),
        )  # fmt: skip


def interface_rates(bandwidth_Bps: np.ndarray, block: int = 1024) -> tuple[np.ndarray, np.ndarray]:
    """Each device's uplink and downlink rate: its fastest outgoing and incoming link (the
    diagonal ignored), computed a block of rows at a time so no n x n copy is made."""
    n = bandwidth_Bps.shape[0]
    up, down = np.zeros(n), np.zeros(n)
    for a, rows, diagonal in _row_blocks(bandwidth_Bps, block):
        rows[diagonal] = 0.0
        up[a : a + len(rows)] = rows.max(axis=1)
        np.maximum(down, rows.max(axis=0), out=down)
    return np.maximum(up, 1e-9), np.maximum(down, 1e-9)


def _row_blocks(matrix: np.ndarray, block: int) -> Iterator[tuple[int, np.ndarray, tuple[np.ndarray, np.ndarray]]]:
    """The matrix a block of rows at a time (so no n x n copy is made): each block's first
    row, a float copy of its rows, and the index of the diagonal's cells in that copy."""
    for a in range(0, matrix.shape[0], block):
        rows = np.array(matrix[a : a + block], dtype=float)
        yield a, rows, (np.arange(len(rows)), np.arange(a, a + len(rows)))


def median_rates(bandwidth_Bps: np.ndarray, block: int = 1024) -> np.ndarray:
    """Each device's connectivity as the daemon's coordinator figures it: the median of its
    links' bandwidths to the others (the diagonal left out), a block of rows at a time. Over
    all the scenario's devices, not just those up: the median barely moves as a few come and go."""
    n = bandwidth_Bps.shape[0]
    out = np.zeros(n)
    if n < 2:
        return out
    for a, rows, diagonal in _row_blocks(bandwidth_Bps, block):
        mask = np.ones(rows.shape, dtype=bool)
        mask[diagonal] = False
        out[a : a + len(rows)] = np.median(rows[mask].reshape(len(rows), n - 1), axis=1)
    return out


def recovery_times(timeline: Sequence[int], bucket_s: float, departures: Sequence[float],
                   window: int = 10, back: float = 0.9) -> list[float]:  # fmt: skip
    """For each departure: how long until a bucket reaches ``back`` of the mean of the
    ``window`` buckets before it (the throughput it had); departures with no full window
    before them, or no recovery before the end, are left out."""
    out = []
    for t in departures:
        b = int(t // bucket_s)
        if b < window:
            continue
        before = sum(timeline[b - window : b]) / window
        if before <= 0:
            continue
        for k in range(b + 1, len(timeline)):
            if timeline[k] >= back * before:
                out.append(max(0.0, (k + 1) * bucket_s - t))
                break
    return out


def simulate(
    scenario: Scenario, strategy: Strategy, settings: SimSettings,
    schedule: tuple[np.ndarray, list[ChurnEvent]] | None = None,
) -> SimResult:  # fmt: skip
    return Simulation(scenario, strategy, settings, schedule).run()
