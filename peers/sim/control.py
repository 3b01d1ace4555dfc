"""The simulated control plane: who coordinates, when plans are made, and which relays serve.

- **The coordinator** is elected among the members by the daemon's ``elect_coordinator``, and
  only it plans, at its first round (``coordinate_s``, each device's rounds with their own
  phase) after a change is noticed. A coordinator that left plans nothing until its own
  departure is noticed and the next one elected; a plan whose coordinator leaves while
  computing it is lost, and counted.
- **Plans**: the strategy's full plan at the start, then on every noticed change its mend
  (for swarmd the planner's ``repair`` of the assignment as it stands, spares' claims and
  all) or a full re-plan. The planner's measured runtime delays the new plan, and is reported.
- **Relays**: every plan's, elected as the daemon's coordinator elects them (``elect_relays``,
  ``relays_wanted``): the incumbents still members first, then the planner's, then the best
  others. A device's reliability is its availability in the scenario, its connectivity the
  median of its links' bandwidths (the daemon measures both).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple, Protocol

import numpy as np

from swarmd.peers.membership.election import RoleCandidate, elect_coordinator, elect_relays, eligible, relays_wanted
from swarmd.peers.planning.plan_cost import Plan
from swarmd.peers.planning.scenario import Scenario, ScenarioError
from swarmd.peers.sim.results import PlanEvent

if TYPE_CHECKING:
    from swarmd.peers.sim.world import World


class PlanStrategy(Protocol):
    """How the coordinator plans (``simulator.Strategy``): a full plan, a mend of the
    assignment (``mend`` or ``mend_live``, None: a full plan on every change), and whether
    relays are elected."""

    @property
    def full_plan(self) -> Callable[[Scenario], Plan]: ...

    @property
    def mend(self) -> Callable[[Scenario, Plan, list[str]], Plan] | None: ...

    @property
    def mend_live(self) -> Callable[[Scenario, np.ndarray, Plan], Plan] | None: ...

    @property
    def relays(self) -> bool: ...


class PlanTarget(Protocol):
    """Who follows the coordinator's plans (``simulator.Simulation``, for its data path)."""

    def follow(self, now: float, plan: Plan) -> None:
        """A new plan is published."""

    def assignment(self) -> Plan:
        """What holds what now, for a repair."""


class CoordinatorRound(NamedTuple):
    """The round at which ``coordinator`` (as of its ``epoch``) plans a change it was told of."""

    coordinator: int
    epoch: int


class PlanReady(NamedTuple):
    """A plan for the ``live`` members, computed by ``by`` (as of its ``epoch``)."""

    plan: Plan
    live: list[int]
    by: int
    epoch: int


class Control:
    def __init__(self, world: World, strategy: PlanStrategy, target: PlanTarget) -> None:
        self.world, self.strategy, self.target = world, strategy, target
        settings = world.settings
        connectivity = median_rates(world.scenario.bandwidth_Bps)
        self.candidates = [
            RoleCandidate(p, float(a), float(c))
            for p, a, c in zip(world.ids, world.availability, connectivity, strict=True)
        ]
        self.round_phase = np.random.default_rng([settings.seed, 1]).uniform(0.0, settings.coordinate_s, world.n)
        self.coordinator: int | None = None
        self.relays: list[int] = []
        self.plan: Plan | None = None
        """The plan in force, in the scenario's indices."""
        self.events: list[PlanEvent] = []
        self.pending = False  # a plan waits for its coordinator's round
        self.planning = False  # a plan is being computed
        self.wanted = False  # a change was noticed while planning, or with no coordinator up

    def start(self) -> Plan:
        """Elect the first coordinator and make the first plan (its runtime is reported; the
        run starts on it at time 0, as every peer would from the seed)."""
        self.elect()
        live = self.world.members()
        view = self.world.scenario.with_devices(live)
        started = time.perf_counter()
        local = self.strategy.full_plan(view)
        runtime = time.perf_counter() - started
        self.events.append(PlanEvent(0.0, "full", runtime, len(live), len(local.pipelines)))
        return self._with_relays(local.remapped(live), live)

    def elect(self) -> None:
        """The coordinator among the members. ``elect_coordinator`` keeps an eligible
        incumbent whoever else is there, so the candidates are listed only when the incumbent
        left or fell below the thresholds."""
        world = self.world
        current = self.coordinator if self.coordinator is not None and world.member[self.coordinator] else None
        if current is not None and eligible(self.candidates[current], world.settings.thresholds, incumbent=True):
            return
        chosen = elect_coordinator(
            [self.candidates[d] for d in world.members()],
            None if current is None else world.ids[current],
            world.settings.thresholds,
        )
        elected = None if chosen is None else world.index[chosen]
        if self.coordinator is not None and elected != self.coordinator:
            world.counts["coordinator_changes"] += 1
        self.coordinator = elected

    # --- planning at the coordinator's rounds ----------------------------------------------------

    def want_plan(self, now: float) -> None:
        """A change was noticed: the coordinator plans at its next round, if it is there. One
        that left but is still a member (its departure not yet noticed) plans nothing; nor
        does anyone else, until the departure is noticed and the next coordinator elected."""
        if self.pending:
            return  # the round to come sees this change too
        if self.planning:
            self.wanted = True
            return
        c = self.coordinator
        if c is None or not self.world.up[c]:
            self.wanted = True
            return
        self.wanted = False
        self.pending = True
        self.world.engine.at(self._next_round(c, now), self._plan_start, CoordinatorRound(c, int(self.world.epoch[c])))

    def _next_round(self, c: int, now: float) -> float:
        period = self.world.settings.coordinate_s
        if period <= 0:
            return now
        phase = float(self.round_phase[c])
        return phase + math.ceil(max(0.0, now - phase) / period) * period

    def _plan_start(self, now: float, turn: CoordinatorRound) -> None:
        self.pending = False
        c = turn.coordinator
        if self.coordinator == c and self.world.epoch[c] == turn.epoch and self.world.up[c]:
            self._plan_now(now, c)
        else:  # it left, or was replaced, before its round: whoever coordinates now plans
            self.wanted = True
            self.want_plan(now)

    def _plan_now(self, now: float, c: int) -> None:
        world = self.world
        strategy = self.strategy
        live = world.members()
        current = self.target.assignment()
        started = time.perf_counter()
        try:
            if strategy.mend_live is not None:
                result, kind = strategy.mend_live(world.scenario, np.asarray(live), current), "repair"
            else:
                view = world.scenario.with_devices(live)
                if strategy.mend is not None:
                    referenced = sorted(set(current.roles()) | set(live))
                    local = {d: i for i, d in enumerate(referenced)}
                    mended = strategy.mend(view, current.remapped(local), [world.ids[d] for d in referenced])
                    result, kind = mended.remapped(live), "repair"
                else:
                    result, kind = strategy.full_plan(view).remapped(live), "replan"
        except (ScenarioError, ValueError) as e:
            # Too few devices for the run's stages (or for the shape): keep the plan in force.
            self.events.append(PlanEvent(now, f"failed: {str(e)[:80]}", time.perf_counter() - started, len(live), 0))
            return
        runtime = time.perf_counter() - started
        self.events.append(PlanEvent(now, kind, runtime, len(live), len(result.pipelines)))
        self.planning = True
        world.engine.at(now + runtime, self._plan_ready, PlanReady(result, live, c, int(world.epoch[c])))

    def _plan_ready(self, now: float, ready: PlanReady) -> None:
        self.planning = False
        world = self.world
        if world.epoch[ready.by] != ready.epoch:
            # Its coordinator left while computing it: nobody publishes it. The next one plans
            # once that departure is noticed (``Simulation._notice`` elects it).
            world.counts["plans_lost"] += 1
            self.wanted = True
        else:
            self.target.follow(now, self._with_relays(ready.plan, ready.live))
        if self.wanted:
            self.want_plan(now)

    def _with_relays(self, plan: Plan, live: list[int]) -> Plan:
        """The plan with its relays elected as the daemon's coordinator elects them."""
        world = self.world
        incumbents = [world.ids[r] for r in self.relays if world.member[r]]
        preferred = [world.ids[r] for r in plan.relays]
        wanted = relays_wanted(len(live)) if self.strategy.relays else 0
        chosen = elect_relays(
            [self.candidates[d] for d in live], incumbents, world.settings.thresholds, wanted, preferred=preferred
        )
        self.relays = [world.index[p] for p in chosen]
        world.engine.set_relays(self.relays)
        self.plan = Plan(
            pipelines=plan.pipelines,
            layers_per_stage=plan.layers_per_stage,
            parameter_servers=plan.parameter_servers,
            relays=tuple(self.relays),
            shard_servers=plan.shard_servers,
            local_steps=plan.local_steps,
            share_micro_batches=plan.share_micro_batches,
            spares=tuple(d for d in plan.spares if d not in plan.devices()),
            meta=plan.meta,
            reduce_groups=plan.reduce_groups,
            checkpointing=plan.checkpointing,
        )
        return self.plan


def median_rates(bandwidth_Bps: np.ndarray, block: int = 1024) -> np.ndarray:
    """Each device's connectivity as the daemon's coordinator figures it: the median of its
    links' bandwidths to the others (the diagonal left out), a block of rows at a time. Over
    all the scenario's devices, not just those up: the median barely moves as a few come and go."""
    n = bandwidth_Bps.shape[0]
    out = np.zeros(n)
    if n < 2:
        return out
    for a in range(0, n, block):
        rows = np.array(bandwidth_Bps[a : a + block], dtype=float)
        mask = np.ones(rows.shape, dtype=bool)
        mask[np.arange(len(rows)), np.arange(a, a + len(rows))] = False
        out[a : a + len(rows)] = np.median(rows[mask].reshape(len(rows), n - 1), axis=1)
    return out
