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
same engine, churn, control plane and metrics. The run builds the ``World`` (``world``: the
devices' state, the engine, the counts and the settings), the control plane, the first plan
and the data path on it; it plays the churn and the membership's notices out on them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple, Protocol

import numpy as np

from swarmd.peers.planning.plan_cost import Plan
from swarmd.peers.planning.scenario import Scenario
from swarmd.peers.sim.churn import ChurnEvent, churn_schedule
from swarmd.peers.sim.control import Control
from swarmd.peers.sim.results import PathFigures, SimResult, compute_bound_tokens_per_s, recovery_times
from swarmd.peers.sim.swarmd_path import SwarmdPath
from swarmd.peers.sim.sync_path import POLICIES, SyncPath
from swarmd.peers.sim.world import SimConfig, World

__all__ = ["DataPlane", "Notice", "SimConfig", "Simulation", "Strategy", "simulate"]


class Notice(NamedTuple):
    """The membership learns that ``device`` came (``up``) or went, unless it changed again
    since (its ``epoch`` moved on)."""

    device: int
    up: bool
    epoch: int


class DataPlane(Protocol):
    """What a simulated data path does when the run asks (``swarmd_path``, ``sync_path``).
    Each is built on the first plan, at time 0, every peer with the seeded weights."""

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
    def __init__(
        self,
        scenario: Scenario,
        strategy: Strategy,
        settings: SimConfig,
        schedule: tuple[np.ndarray, list[ChurnEvent]] | None = None,
    ) -> None:
        """``schedule``: who is up at the start and the churn events, instead of drawing them
        from the scenario (``churn_schedule``). The first plan is made here: the data path is
        built on it."""
        self.scenario, self.strategy, self.settings = scenario, strategy, settings
        self.horizon = settings.hours * 3600.0
        if schedule is not None:
            up0, churn = schedule
        elif settings.churn:
            up0, churn = churn_schedule(scenario, self.horizon, settings.seed)
        else:
            up0, churn = np.ones(scenario.n, dtype=bool), []
        self.up0, self.churn = up0.copy(), churn
        self.world = World(scenario, settings, up0)
        for ev in churn:
            self.world.engine.at(ev.at_s, self._churn, ev)
        self.departure_times: list[float] = []
        self.control = Control(self.world, strategy, self)
        started = time.perf_counter()
        first = self.control.start()
        self.shape = (len(first.layers_per_stage), len(first.pipelines))
        self.plane = _plane(self.world, strategy.data_path, first)
        self._wall_s = time.perf_counter() - started  # the first plan is part of the run's time

    # --- the run ------------------------------------------------------------------------------

    def run(self) -> SimResult:
        """Simulate to the horizon (from where ``advance`` left off, if it was called)."""
        self.advance(self.horizon)
        return self._result()

    def advance(self, until: float) -> None:
        """Run the events up to ``until`` (at most the horizon). A caller can read the counters
        part way (the calibration takes off a warm-up) and go on."""
        started = time.perf_counter()
        self.world.engine.run_until(min(until, self.horizon), self.settings.max_events)
        self._wall_s += time.perf_counter() - started

    def follow(self, now: float, plan: Plan) -> None:
        """A new plan is published: the data path follows it."""
        self.plane.follow(now, plan)

    def assignment(self) -> Plan:
        return self.plane.assignment()

    # --- membership ---------------------------------------------------------------------------

    def _churn(self, now: float, ev: ChurnEvent) -> None:
        world, device, up = self.world, ev.device, ev.up
        epoch = world.changed(device, up)
        if device in self.control.relays:
            world.engine.relay_changed()
        if up:
            world.counts["returns"] += 1
            world.engine.returned(now, device)
            world.engine.at(now + self.settings.join_s, self._notice, Notice(device, True, epoch))
            return
        world.counts["departures"] += 1
        if self.plane.planned(device):
            self.departure_times.append(now)
        world.engine.cut(now, device)
        self.plane.departed(now, device)
        world.engine.at(now + self.settings.detect_s, self._notice, Notice(device, False, epoch))

    def _notice(self, now: float, notice: Notice) -> None:
        world, device, up = self.world, notice.device, notice.up
        if world.epoch[device] != notice.epoch or world.up[device] != up:
            return  # it changed again before anyone noticed
        world.noticed(now, device, up)
        self.control.elect()
        if not up:
            world.engine.forget(device)
            self.plane.noticed_departure(now, device)
        self.control.want_plan(now)

    # --- the results --------------------------------------------------------------------------

    def _result(self) -> SimResult:
        world = self.world
        sent, received = world.engine.carried(self.horizon)
        path = self.plane.figures()
        per_mb = path.tokens_per_micro_batch
        c = world.counts
        roles = self.plane.roles()
        for r in self.control.relays:
            roles.setdefault(r, []).append("relay")
        return SimResult(
            strategy=self.strategy.name,
            hours=self.settings.hours,
            seed=self.settings.seed,
            devices=world.n,
            tokens=world.trained_mb * per_mb,
            tokens_per_s=world.trained_mb * per_mb / self.horizon,
            timeline=world.timeline,
            bucket_s=self.settings.bucket_s,
            tokens_per_micro_batch=per_mb,
            updates=world.updates,
            updates_lost=c["updates_lost"],
            shares_recomputed=path.shares_recomputed,
            micro_batches_recomputed=path.micro_batches_recomputed,
            contributions_lost=c["contributions_lost"],
            stale_dropped=c["stale_dropped"],
            staleness=dict(sorted(world.staleness.items())),
            duplicates=c["duplicates"],
            departures=c["departures"],
            returns=c["returns"],
            plan_events=self.control.events,
            recovery_s=recovery_times(world.timeline, self.settings.bucket_s, self.departure_times),
            wall_s=self._wall_s,
            events=world.engine.events_run,
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
            relayed_transfers=world.engine.counts["relayed_transfers"],
            spare_claims=c["spare_claims"],
            sent_bytes=sent.tolist(),
            received_bytes=received.tolist(),
            phases=world.phases.status(),
            final_pipelines=path.pipelines,
            roles=roles,
        )


def _plane(world: World, name: str, first: Plan) -> DataPlane:
    if name == "swarmd":
        return SwarmdPath(world, first)
    if name in POLICIES:
        return SyncPath(world, POLICIES[name], first)
    raise ValueError(f"data path {name!r} is not one of swarmd, {', '.join(POLICIES)}")


def simulate(
    scenario: Scenario,
    strategy: Strategy,
    settings: SimConfig,
    schedule: tuple[np.ndarray, list[ChurnEvent]] | None = None,
) -> SimResult:
    return Simulation(scenario, strategy, settings, schedule).run()
