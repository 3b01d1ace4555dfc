"""A run of a swarm over time, simulated event by event on swarmd's own rules and data path.

The data path is ``docs/data-path.md``'s, priced with the daemon's own functions:

- **Cells and shares** (``swarmd.peers.sim.pipelines``): each pipeline of the plan trains on
  shares of ``k`` micro-batches issued by the ledger (``taskpool.shares.ShareLedger``, kept
  with shard ``(0, 0)``); a share lasts ``exchange.share_seconds`` over its cells' compute and
  activation transfers, whose bytes are flows on the shared links.
- **Exchanges** (``swarmd.peers.sim.shards``): after H shares every cell contributes once to
  each shard of its stage (``sizes.message_bytes`` in the codec its link calls for); shards
  weigh contributions by staleness, step, log each step's delta at their standby (committed
  when it is there), and serve deltas to the cells' pulls.
- **Faults**: churn (``swarmd.peers.sim.churn``) breaks the shares of a departed cell's
  pipeline (issued again: recomputed), spares and repairs fill the hole, a departed server's
  standby takes its shard over; lost committed updates are counted, not assumed away.
- **Control** (``swarmd.peers.sim.control``): the elected coordinator plans and repairs at its
  rounds with the planner's measured runtime; relays elected per plan carry the messages the
  daemon's routing rule sends through them.
- **Links** (``swarmd.peers.sim.shared_links``): every transfer is a flow crossing its
  sender's uplink, its receiver's downlink and their path, max-min fair among concurrent flows.

Events happen per share, per message and per plan, never per micro-batch: a thousand devices
over hours take minutes. The run is deterministic for a seed; memory is bounded by the
devices, the flows in flight and the shares open, not by the simulated time (the timeline
keeps one count per ``bucket_s``).

The data path is a ``DataPlane`` chosen by the strategy: swarmd's (``swarmd_path``), or a
baseline's own as its paper publishes it (``sync_path``: DT-FM, SWARM, DiLoCo), all on the
same engine, churn, control plane and metrics.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple, Protocol

import numpy as np

from swarmd.peers.membership.election import ElectionConfig
from swarmd.peers.planning.plan_cost import Plan
from swarmd.peers.planning.scenario import Scenario
from swarmd.peers.planning.transfers import KEEP_VERSIONS
from swarmd.peers.sim.churn import ChurnEvent, churn_schedule
from swarmd.peers.sim.control import Control
from swarmd.peers.sim.engine import Engine, Overheads
from swarmd.peers.sim.op_times import OpTimes
from swarmd.peers.sim.results import PathFigures, SimResult, compute_bound_tokens_per_s, recovery_times
from swarmd.peers.sim.swarmd_path import SwarmdPath
from swarmd.peers.sim.sync_path import POLICIES, SyncPath

if TYPE_CHECKING:
    from swarmd.peers.sim.pipelines import Pipelines
    from swarmd.peers.sim.reduction import Reducers
    from swarmd.peers.sim.shards import ShardServers
    from swarmd.peers.sim.workload import Workload
    from swarmd.peers.taskpool.exchange import ExchangeConfig
    from swarmd.peers.taskpool.shares import ShareLedger


@dataclass(frozen=True)
class SimConfig:
    hours: float = 1.0
    seed: int = 0
    churn: bool = True
    max_staleness: int = 4
    """Server versions a contribution may lag and still count (the run spec's)."""
    detect_s: float = 60.0
    """A departure is noticed this long after it happens (the heartbeat TTL, and a lease's)."""
    join_s: float = 30.0
    """A returning device is in the membership this long after it comes back."""
    lease_s: float = 900.0
    """A share's lease at the ledger."""
    bucket_s: float = 60.0
    checkpoint_every: int = 10
    """Steps between the checkpoints a shard's holder sends its standby."""
    keep_versions: int = KEEP_VERSIONS
    """Deltas a shard keeps for pulls; a cell further behind gets the whole slice."""
    standing_queue_s: float = 0.0
    """The delay a busy interface's buffer adds to every packet through it (bufferbloat)."""
    request_overhead_s: float = 0.0
    """A request's cost beyond its latency and bytes (the calibration measures it)."""
    connection_queue_bytes: float = 0.0
    """The bytes of another transfer between the same two peers a message waits behind."""
    coalesce_flows: int = 2000
    """Past this many flows in flight the links re-divide rates at most every ``coalesce_s``:
    an exchange of a thousand cells with a hundred shards each is a hundred thousand flows."""
    coalesce_s: float = 0.5
    coordinate_s: float = 10.0
    """The coordinator's round: it plans at its first round after a change is noticed (the
    daemon's coordination loop runs every two heartbeats, within 4-10 s: 10 s at the default
    heartbeat). Each device's rounds have their own phase, drawn from the seed."""
    thresholds: ElectionConfig = ElectionConfig()
    """Who may coordinate and relay (the daemon's ``[roles]``, whose defaults these are)."""
    data_via_relay: str = "auto"
    """The daemon's ``[swarm] data_via_relay``: auto, always or never."""
    max_events: int = 200_000_000


class Notice(NamedTuple):
    """The membership learns that ``device`` came (``up``) or went, unless it changed again
    since (its ``epoch`` moved on)."""

    device: int
    up: bool
    epoch: int


class DataPlane(Protocol):
    """What a simulated data path does when the run asks (``swarmd_path``, ``sync_path``)."""

    def begin(self, plan: Plan) -> None:
        """Start on the first plan, at time 0, every peer with the seeded weights."""

    def follow(self, now: float, plan: Plan) -> None:
        """A new plan is published."""

    def assignment(self) -> Plan:
        """What holds what now, for a repair."""

    def departed(self, now: float, device: int) -> None:
        """``device`` left (its flows are already cut); nobody knows it yet."""

    def noticed_departure(self, now: float, device: int) -> None:
        """Its departure is known: its leases lapsed, its heartbeat expired."""

    def planned(self, device: int) -> bool:
        """Whether ``device`` has a part in the data path now."""

    def roles(self) -> dict[int, list[str]]: ...

    def figures(self) -> PathFigures: ...


@dataclass(frozen=True)
class Strategy:
    name: str
    full_plan: Callable[[Scenario], Plan]
    """A plan for the live devices (indices into the scenario given)."""
    mend: Callable[[Scenario, Plan, list[str]], Plan] | None = None
    """Mend the assignment (indices into the listed IDs) for the live devices; None: a full
    plan from scratch on every change."""
    mend_live: Callable[[Scenario, np.ndarray, Plan], Plan] | None = None
    """Instead of ``mend``: mend the assignment given the whole scenario and the live devices'
    indices, plans in the whole scenario's indices (no copy of the n x n matrices per change)."""
    relays: bool = True
    """Whether relays are elected and messages go through them when faster (swarmd's data
    path); the baselines' systems send everything direct."""
    data_path: str = "swarmd"
    """Whose data path the plans run on: swarmd, or dtfm, swarm, diloco (``sync_path``)."""


class Simulation:
    # Set by the data path's ``begin``: the run's sizes (every path), and swarmd's own parts.
    workload: Workload
    share_micro_batches: int
    local_steps: int
    exchange: ExchangeConfig
    ledger: ShareLedger
    pipelines: Pipelines
    shards: ShardServers
    reducers: Reducers

    def __init__(
        self,
        scenario: Scenario,
        strategy: Strategy,
        settings: SimConfig,
        schedule: tuple[np.ndarray, list[ChurnEvent]] | None = None,
    ) -> None:
        """``schedule``: who is up at the start and the churn events, instead of drawing them
        from the scenario (``churn_schedule``)."""
        self.scenario, self.strategy, self.settings = scenario, strategy, settings
        self.horizon = settings.hours * 3600.0
        if schedule is not None:
            up0, churn = schedule
        elif settings.churn:
            up0, churn = churn_schedule(scenario, self.horizon, settings.seed)
        else:
            up0, churn = np.ones(scenario.n, dtype=bool), []
        self.n = scenario.n
        self.up0, self.churn = up0.copy(), churn
        self.up = up0.copy()
        self.member = up0.copy()  # what the membership knows (noticed departures and returns)
        self.member_since = np.zeros(self.n)
        self.epoch = np.zeros(self.n, dtype=np.int64)  # bumped at a departure: its events lapse
        self.ids = scenario.ids
        self.index = {p: i for i, p in enumerate(self.ids)}
        self.tflops = scenario.device_arrays.tflops * 1e12
        self.availability = scenario.device_arrays.availability
        overheads = Overheads(
            settings.request_overhead_s,
            settings.standing_queue_s,
            settings.connection_queue_bytes,
            settings.coalesce_flows,
            settings.coalesce_s,
        )
        self.engine = Engine(
            scenario.latency_s, scenario.bandwidth_Bps, self.ids, self.up, overheads, settings.data_via_relay
        )
        for ev in churn:
            self.engine.at(ev.at_s, self._churn, ev)
        self.counts: Counter[str] = Counter()
        self.phases = OpTimes()
        self.staleness: Counter[int] = Counter()
        self.timeline = [0] * (int(math.ceil(self.horizon / settings.bucket_s)) + 1)
        self.trained_mb = 0
        self.updates = 0
        self.departure_times: list[float] = []
        self.control = Control(self)
        self.plane: DataPlane = _plane(self, strategy.data_path)
        self._started = False
        self._wall_s = 0.0

    # --- the run ------------------------------------------------------------------------------

    def run(self) -> SimResult:
        """Simulate to the horizon (from where ``advance`` left off, if it was called)."""
        self.advance(self.horizon)
        return self._result()

    def advance(self, until: float) -> None:
        """Run the events up to ``until`` (at most the horizon): the first call plans. A caller
        can read the counters part way (the calibration takes off a warm-up) and go on."""
        started = time.perf_counter()
        if not self._started:
            self._started = True
            self._begin(self.control.start())
        self.engine.run_until(min(until, self.horizon), self.settings.max_events)
        self._wall_s += time.perf_counter() - started

    def _begin(self, plan: Plan) -> None:
        self.shape = (len(plan.layers_per_stage), len(plan.pipelines))
        self.plane.begin(plan)

    def follow(self, now: float, plan: Plan) -> None:
        """A new plan is published: the data path follows it."""
        self.plane.follow(now, plan)

    def assignment(self) -> Plan:
        return self.plane.assignment()

    # --- membership ---------------------------------------------------------------------------

    def members(self) -> list[int]:
        return [int(i) for i in np.flatnonzero(self.member)]

    def best_member(self, stage: int) -> int:
        """Where a shard no copy survived of starts again: the plan's server for it if it is
        a member, else the likeliest member to stay."""
        plan = self.control.plan
        if plan is not None and self.member[plan.parameter_servers[stage]]:
            return plan.parameter_servers[stage]
        live = self.members()
        return max(live, key=lambda d: (self.availability[d], -d))

    def _churn(self, now: float, ev: ChurnEvent) -> None:
        device, up = ev.device, ev.up
        self.up[device] = up
        if device in self.control.relays:
            self.engine.relay_changed()
        if up:
            self.counts["returns"] += 1
            self.engine.returned(now, device)
            self.engine.at(now + self.settings.join_s, self._notice, Notice(device, True, int(self.epoch[device])))
            return
        self.counts["departures"] += 1
        self.epoch[device] += 1
        if self._planned(device):
            self.departure_times.append(now)
        self.engine.cut(now, device)
        self.plane.departed(now, device)
        self.engine.at(now + self.settings.detect_s, self._notice, Notice(device, False, int(self.epoch[device])))

    def _planned(self, device: int) -> bool:
        return self.plane.planned(device)

    def _notice(self, now: float, notice: Notice) -> None:
        device, up = notice.device, notice.up
        if self.epoch[device] != notice.epoch or self.up[device] != up:
            return  # it changed again before anyone noticed
        self.member[device] = up
        self.member_since[device] = now
        self.control.elect()
        if not up:
            self.engine.forget(device)
            self.plane.noticed_departure(now, device)
        self.control.want_plan(now)

    # --- what is trained ------------------------------------------------------------------------

    def trained(self, now: float, micro_batches: int, updates: int) -> None:
        """Shard (0, 0) committed ``updates`` steps applying ``micro_batches`` new ones."""
        self.updates += updates
        self.trained_mb += micro_batches
        bucket = int(now // self.settings.bucket_s)
        if bucket < len(self.timeline):
            self.timeline[bucket] += micro_batches

    def untrained(self, micro_batches: int) -> None:
        """Committed micro-batches a failover could not restore are not trained after all."""
        self.trained_mb -= micro_batches

    def _result(self) -> SimResult:
        sent, received = self.engine.carried(self.horizon)
        path = self.plane.figures()
        per_mb = path.tokens_per_micro_batch
        c = self.counts
        roles = self.plane.roles()
        for r in self.control.relays:
            roles.setdefault(r, []).append("relay")
        return SimResult(
            strategy=self.strategy.name,
            hours=self.settings.hours,
            seed=self.settings.seed,
            devices=self.n,
            tokens=self.trained_mb * per_mb,
            tokens_per_s=self.trained_mb * per_mb / self.horizon,
            timeline=self.timeline,
            bucket_s=self.settings.bucket_s,
            tokens_per_micro_batch=per_mb,
            updates=self.updates,
            updates_lost=c["updates_lost"],
            shares_recomputed=path.shares_recomputed,
            micro_batches_recomputed=path.micro_batches_recomputed,
            contributions_lost=c["contributions_lost"],
            stale_dropped=c["stale_dropped"],
            staleness=dict(sorted(self.staleness.items())),
            duplicates=c["duplicates"],
            departures=c["departures"],
            returns=c["returns"],
            plan_events=self.control.events,
            recovery_s=recovery_times(self.timeline, self.settings.bucket_s, self.departure_times),
            wall_s=self._wall_s,
            events=self.engine.events_run,
            failovers=c["failovers"],
            shape=self.shape,
            shards=path.shards,
            local_steps=path.local_steps,
            share_micro_batches=path.share_micro_batches,
            reduce_groups=path.reduce_groups,
            compute_bound_tokens_per_s=compute_bound_tokens_per_s(self.scenario, self.up0, self.churn, self.horizon),
            coordinator_changes=c["coordinator_changes"],
            plans_lost=c["plans_lost"],
            relays=len(self.control.relays),
            relayed_transfers=self.engine.counts["relayed_transfers"],
            spare_claims=c["spare_claims"],
            sent_bytes=sent.tolist(),
            received_bytes=received.tolist(),
            phases=self.phases.status(),
            final_pipelines=path.pipelines,
            roles=roles,
        )


def _plane(sim: Simulation, name: str) -> DataPlane:
    if name == "swarmd":
        return SwarmdPath(sim)
    if name in POLICIES:
        return SyncPath(sim, POLICIES[name])
    raise ValueError(f"data path {name!r} is not one of swarmd, {', '.join(POLICIES)}")


def simulate(
    scenario: Scenario,
    strategy: Strategy,
    settings: SimConfig,
    schedule: tuple[np.ndarray, list[ChurnEvent]] | None = None,
) -> SimResult:
    return Simulation(scenario, strategy, settings, schedule).run()
