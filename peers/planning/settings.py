"""What the planner is told (``PlannerConfig``) and what it may know of the scenario (``planning_view``).

Each awareness can be switched off alone (``Awareness``): the planner then sees a uniform
network (every link the mean latency and bandwidth), uniform devices (mean speed, achieved where
measured, and memory),
or devices that never leave; the plan is still costed on the real scenario, so the switch
measures what that knowledge is worth.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from swarmd.peers.planning.scenario import Scenario, ScenarioError
from swarmd.peers.taskpool.exchange import MAX_LOCAL_STEPS


@dataclass(frozen=True)
class Awareness:
    """What the planner may know; each switched off alone for ablations."""

    network: bool = True
    devices: bool = True
    reliability: bool = True


@dataclass(frozen=True)
class PlannerConfig:
    awareness: Awareness = field(default_factory=Awareness)
    time_budget_s: float = 1.5
    """Local search stops when this has passed (construction and shape choice come first)."""
    seed: int = 0
    min_availability: float = 0.9
    """A shard server or relay must be up at least this fraction of the time (when
    reliability is known and the planner may use it)."""
    max_shapes: int = 12
    """Free mode: at most this many shapes are built and costed."""
    stages: int | None = None
    """Free mode with the stage count fixed (a running swarm: the run spec cuts the model),
    the number of pipelines left to the planner."""
    local_steps: int | None = None
    """H fixed by the run (1: gradients every share); None: the planner proposes it."""
    even_layers: bool = False
    """Cut the layers evenly (``plan_cost.even_layers``) instead of by the stages' speed: a running
    swarm's shards are cut from its stages' parameters, which an uneven split would move."""

    def __post_init__(self) -> None:
        if self.local_steps is not None and not 1 <= self.local_steps <= MAX_LOCAL_STEPS:
            raise ValueError(f"local_steps = {self.local_steps} must be in [1, {MAX_LOCAL_STEPS}] (or None: planned)")
        if self.stages is not None and self.stages < 1:
            raise ValueError(f"stages = {self.stages} must be >= 1 (or None: planned)")
        if self.time_budget_s < 0:
            raise ValueError(f"time_budget_s = {self.time_budget_s} must be >= 0")


class PlanError(ScenarioError):
    """No plan exists: the devices cannot hold the model, or too few are left."""


def planning_view(scenario: Scenario, awareness: Awareness) -> Scenario:
    """The scenario with what the planner must not know replaced by uniform values (a copy
    with the same matrices and devices when the planner may know everything)."""
    if awareness.network and awareness.devices and awareness.reliability:
        return scenario.copy()
    lat, bw, devices = scenario.latency_s, scenario.bandwidth_Bps, scenario.devices
    if not awareness.network and scenario.n > 1:
        off = ~np.eye(scenario.n, dtype=bool)
        lat = np.where(off, lat[off].mean(), 0.0)
        bw = np.where(off, bw[off].mean(), np.inf)
    if not awareness.devices:
        tflops = float(np.mean([d.speed_tflops for d in devices]))
        memory = float(np.mean([d.memory_gib for d in devices]))
        devices = tuple(replace(d, tflops=tflops, memory_gib=memory, achieved_tflops=None) for d in devices)
    if not awareness.reliability:
        devices = tuple(replace(d, mean_uptime_h=None, mean_downtime_h=None) for d in devices)
    return replace(scenario, devices=devices, latency_s=lat, bandwidth_Bps=bw)


def usable_devices(view: Scenario, settings: PlannerConfig, among: np.ndarray | None = None) -> np.ndarray:
    """Devices worth planning on, best first (speed times availability, as far as the planner
    may know them): those up too rarely to matter are left out when reliability is known
    (they cost more in churn than they bring)."""
    avail, speed = view.device_arrays.availability, view.device_arrays.tflops
    keep = np.arange(view.n) if among is None else np.asarray(among, dtype=int)
    if settings.awareness.reliability and (avail[keep] >= 0.5).any():
        keep = keep[avail[keep] >= 0.5]
    return keep[np.argsort(-(speed * avail)[keep], kind="stable")]


def min_availability(settings: PlannerConfig) -> float:
    """The availability a server or relay must have, as far as the planner may know it."""
    return settings.min_availability if settings.awareness.reliability else 0.0
