"""swarmd's scheduler: the plan that trains fastest on the data path, pure functions over a snapshot.

The same code plans in the daemon (the elected coordinator, from the live matrix), in
``swarmd plan`` (from a scenario file) and in the simulator. The objective is effective tokens
per second: the throughput model's trained tokens per second (``swarmd.peers.planning.throughput``)
times what each teaches against synchronous training (``learning.token_efficiency``), so that
more pipelines or longer local rounds win only where they add learning; FORMAT.md's reference
cost stays the ruler on which placements are compared with the baselines. Method, each step
cheap enough to plan 1,000 devices in seconds:

1. **Shape.** Fixed when the scenario gives ``parallelism``. Otherwise stage counts from the
   fewest whose layers fit some device (one: pure data parallelism, no activations at all)
   upward, each with as many pipelines as the devices that can hold a cell allow, and fewer
   (the slowest left out: a round of fewer pipelines pulls fewer deltas and is less stale; in
   local mode also eight, about the most replicas that add learning). Memory counts the mode:
   with H > 1 local steps a cell holds AdamW's state too; a run that leaves H to the planner is
   planned in both modes and the one that trains more effective tokens is kept.
2. **Construction** (``construction``): pipelines of devices close for the activations, each
   ordered along its cheapest path, re-matched at every boundary; one stage: the devices that
   train fastest alone.
3. **Schedule** (``layers``, ``schedule``): the layer split for pipelines that run on their
   own, k, the shard servers (K_s per stage, reliable, quick to reach, spread), H.
4. **Local search** (``search``) on the model, the swarm-wide figures held; then the split and
   the schedule again, while the time budget lasts.
5. **Roles.** Relays (reliable devices through which a pipeline link is faster than direct) and
   spares (devices outside the grid that can take a lapsed cell, then the servers and relays
   that hold no cell).

``repair`` (``swarmd.peers.planning.repair``) mends a plan after devices leave or join,
touching only the cells it must.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from swarmd.peers.planning.builder import FINALISTS, GridCandidate, Planner
from swarmd.peers.planning.plan_cost import Plan, cell_layer_caps
from swarmd.peers.planning.repair import Repair, repair
from swarmd.peers.planning.scenario import Scenario
from swarmd.peers.planning.settings import Awareness, PlanError, PlannerConfig, planning_view

__all__ = ["Awareness", "PlanError", "PlannerConfig", "Repair", "plan", "planning_view", "repair"]


def plan(
    scenario: Scenario, settings: PlannerConfig | None = None, progress: Callable[[float], None] | None = None
) -> Plan:
    """A full plan for ``scenario`` (see the module doc). ``progress(fraction)``: after each
    shape built (the first half) and each finalist refined (the second, by the time budget)."""
    settings = settings or PlannerConfig()
    say = progress or (lambda fraction: None)
    started = time.perf_counter()
    planner = Planner(scenario, settings)
    finalists: list[tuple[GridCandidate, bool]] = []
    if scenario.parallelism is not None:
        shape = scenario.parallelism
        for local in planner.local_mode():
            chosen = planner.eligible(shape.stages, local)
            if len(chosen) < shape.devices:
                chosen = np.concatenate([chosen, np.setdiff1d(planner.usable, chosen)])
            if len(chosen) < shape.devices:
                chosen = np.concatenate([chosen, np.setdiff1d(np.arange(scenario.n), chosen)])
            found = planner.build(shape, local, chosen)
            if found is not None:
                finalists.append((found, local))
                break
    else:
        # Both modes, compared by what they teach a second: many pipelines in local mode touch
        # many tokens and learn little more than eight (``learning``); gradient mode learns from
        # every token as long as its exchange keeps up.
        modes = list(planner.local_mode())
        built = []
        for m, local in enumerate(modes):
            shapes = list(planner.shapes(local))
            for k, shape in enumerate(shapes):
                built.append((planner.build(shape, local, planner.eligible(shape.stages, local)), local))
                say(0.5 * (m + (k + 1) / len(shapes)) / len(modes))
        finalists = sorted(((c, m) for c, m in built if c is not None), key=lambda x: -x[0].effective_tokens_per_s)
        finalists = finalists[:FINALISTS]
    if not finalists:
        raise _no_plan(planner, scenario)
    left = max(0.0, settings.time_budget_s - (time.perf_counter() - started))
    best: GridCandidate | None = None
    for i, (found, local) in enumerate(finalists):
        refined = planner.refine(found, local, time.perf_counter() + left / (len(finalists) - i))
        left = max(0.0, settings.time_budget_s - (time.perf_counter() - started))
        say(0.5 + 0.5 * (i + 1) / len(finalists))
        if best is None or refined.effective_tokens_per_s > best.effective_tokens_per_s:
            best = refined
    assert best is not None
    return planner.finish(best, started)


def _no_plan(planner: Planner, scenario: Scenario) -> PlanError:
    """Why nothing fits, with the numbers: the memory a cell of one layer needs at the least
    (gradient mode, checkpointing where it helps), stage by stage, and what the devices have."""
    shape = scenario.parallelism
    stages = shape.stages if shape else 1
    most = float(planner.memory[planner.usable].max()) if len(planner.usable) else 0.0
    need = [_one_layer_gib(scenario, stages, s) for s in range(stages)]
    what = f"{shape.stages} stages x {shape.data_parallel} pipelines" if shape else "any shape"
    return PlanError(
        f"no plan of {what} fits the devices: a cell of one layer needs "
        f"{', '.join(f'{g:.2f}' for g in need)} GiB (stage by stage, with activation checkpointing) and the "
        f"{len(planner.usable)} usable device(s) have at most {most:.1f} GiB; add devices with more memory "
        "or lower batch.micro_batch"
    )


def _one_layer_gib(scenario: Scenario, stages: int, stage: int) -> float:
    """The least memory that holds one layer of ``stage`` (bisection on ``cell_layer_caps``)."""
    lo, hi = 0.0, 1.0
    while cell_layer_caps(scenario, np.array([hi]), stages, 1)[0, stage] < 1 and hi < 1 << 20:
        lo, hi = hi, hi * 2
    for _ in range(30):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if cell_layer_caps(scenario, np.array([mid]), stages, 1)[0, stage] >= 1 else (mid, hi)
    return hi
