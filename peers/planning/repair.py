"""Mending a plan after devices leave or join, touching only what it must.

- A shard server that left is replaced, in its shard's place, by a reliable device
  (``schedule.choose_servers`` with the others kept): the stage keeps its ``K_s`` and every
  other shard its server, so nothing replicated moves.
- A cell whose device left takes the spare that trains most there (each candidate costed as
  its pipeline on the throughput model, the swarm's figures held). With too few spares (free
  mode) the pipeline with the most holes is given up and its devices become spares.
- New devices are spares; enough of them (free mode) form new pipelines, kept if the plan
  trains faster with them.
- A short local search among the touched cells and the spares.
- The layer split, H and k are kept unless the number of pipelines changed by a tenth or more
  (``RESCHEDULE_FRACTION``) or a stage no longer fits (then chosen again as a full plan chooses
  them; k stays within the batch split either way). The relays still live stay; spares are listed anew.

``kept_in_place`` keeps cells and shards in place under a full plan instead: it swaps devices
alike for that plan so that the peers of the assignment in force keep what they hold.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from swarmd.peers.planning.builder import LOCAL, GridCandidate, Planner
from swarmd.peers.planning.construction import pipelines_first
from swarmd.peers.planning.plan_cost import Plan, cell_layer_caps
from swarmd.peers.planning.scenario import Scenario, Shape
from swarmd.peers.planning.schedule import (
    choose_local_steps,
    choose_servers,
    regroup,
    server_pool,
    share_micro_batches,
)
from swarmd.peers.planning.search import Search
from swarmd.peers.planning.settings import PlanError, PlannerConfig
from swarmd.peers.planning.throughput import Frozen, Throughput

RESCHEDULE_FRACTION = 0.1
"""A repair chooses the split, k and H again only when it changed the number of pipelines by
this fraction or more: a server's step size and the ledger's share size follow them, and a
pipeline more or less among many does not change what they should be."""


@dataclass(frozen=True)
class Repair:
    plan: Plan
    changed: tuple[tuple[int, int], ...]
    """The cells (pipeline, stage) whose device changed, in the new plan's coordinates."""
    dropped_pipelines: int = 0
    added_pipelines: int = 0


def repair(
    scenario: Scenario,
    previous: Plan,
    previous_ids: Sequence[str],
    settings: PlannerConfig | None = None,
    *,
    time_budget_s: float = 0.05,
    live: Sequence[int] | np.ndarray | None = None,
) -> Repair:
    """Mend ``previous`` (whose device indices refer to ``previous_ids``) for the devices of
    ``scenario`` now (module doc).

    ``live``: the devices of ``scenario`` that take part, ascending (all when None); the plans'
    indices are then the whole scenario's. The simulator mends this way: a scenario restricted
    to the live devices is a copy of both n x n matrices per change (1.6 GB at 10,000)."""
    settings = settings or PlannerConfig()
    started = time.perf_counter()
    planner = Planner(scenario, settings, None if live is None else np.asarray(live, dtype=int))
    if live is None:
        index = scenario.index()
    else:
        ids = scenario.ids
        index = {ids[i]: int(i) for i in live}

    def here(devices: Sequence[int]) -> list[int]:
        return [index.get(previous_ids[d], -1) for d in devices]

    grid = np.array([here(row) for row in previous.pipelines], dtype=int)
    n_stages = grid.shape[1]
    local = previous.local_steps > 1
    layers = previous.layers_per_stage
    caps = planner.caps(n_stages, local)
    # Every shard keeps its server; one that left is replaced in its place (K_s kept), unless
    # fewer devices are live than the stage has shards: then its shards are cut anew.
    pool = server_pool(
        planner.view, planner.min_availability, planner.usable, at_least=max(len(row) for row in previous.shard_servers)
    )
    counts = [min(len(row), len(pool)) for row in previous.shard_servers]
    kept_servers = tuple(
        tuple(here(row)) if len(row) == k else () for row, k in zip(previous.shard_servers, counts, strict=True)
    )
    servers = choose_servers(planner.view, grid, layers, pool, counts, kept_servers)
    serving = {d for row in servers for d in row}
    placed = set(grid.ravel().tolist())
    outside = [int(d) for d in planner.usable if int(d) not in placed]
    spare = [d for d in outside if d not in serving] + [d for d in outside if d in serving]  # free devices first
    model = planner.model
    k = previous.micro_batches_per_share(scenario)
    settings_x = model.exchange_settings(k, previous.local_steps, int(grid.shape[0]))
    groups = regroup(previous.reduce_groups, int(grid.shape[0]), servers)
    stages = model.stages(layers, servers, groups)
    held = previous.meta.get("prediction")
    frozen = held.frozen if isinstance(held, Throughput) else Frozen(steps_per_s=0.0)
    fixed = scenario.parallelism is not None
    changed: list[tuple[int, int]] = []
    dropped = added = 0

    holes = [(int(p), int(s)) for p, s in zip(*np.nonzero(grid < 0), strict=True)]
    while holes:
        open_stages = sorted({s for _, s in holes})
        fitting = [d for d in spare if (caps[d, open_stages] >= np.asarray(layers)[open_stages]).any()]
        if len(fitting) < len(holes) and not fixed and grid.shape[0] > 1:
            # Not enough spares: give up the pipeline with the most holes; its devices are spares.
            worst = int(np.argmax((grid < 0).sum(axis=1)))
            spare += [int(d) for d in grid[worst] if d >= 0]
            grid = np.delete(grid, worst, axis=0)
            changed = [(p - (p > worst), s) for p, s in changed if p != worst]
            holes = [(p - (p > worst), s) for p, s in holes if p != worst]
            dropped += 1
            continue
        p, s = holes.pop(0)
        options = np.array([d for d in spare if caps[d, s] >= layers[s]], dtype=int)
        if not len(options):
            why = (
                "the fixed shape cannot be kept: wait for devices to join or plan a smaller shape"
                if fixed
                else "not even one pipeline of the run's stages can be kept: wait for devices to join"
            )
            raise PlanError(
                f"{len(holes) + 1} cell(s) of the plan lost their device and no spare can hold stage {s} "
                f"({layers[s]} layers); {why}"
            )
        rows = np.repeat(grid[p][None, :], len(options), axis=0)
        rows[:, s] = options
        for _, t in [h for h in holes if h[0] == p]:
            rows[:, t] = options  # provisional: only this cell's choice is being compared
        rates = model.rows(rows, layers, stages, settings_x, frozen).tokens_per_s
        grid[p, s] = int(options[int(np.argmax(rates))])
        spare.remove(int(grid[p, s]))
        changed.append((p, s))

    shape_changed = dropped > 0
    if not fixed:
        grid, new_rows = _grow(planner, grid, spare, layers, local, servers, previous)
        if new_rows:
            changed += [(grid.shape[0] - 1 - i, s) for i in range(new_rows) for s in range(n_stages)]
            spare = [d for d in spare if d not in set(grid.ravel().tolist())]
            added, shape_changed = new_rows, True

    touched = list(dict.fromkeys(changed))
    if touched:
        search = Search(
            model,
            grid,
            [d for d in spare if d not in serving],
            layers,
            stages,
            settings_x,
            frozen,
            caps,
            started + time_budget_s,
            settings.seed,
        )
        for p, s in touched:
            if time.perf_counter() >= search.deadline:
                break
            search.improve_cell(p, s, within=set(touched))
        grid = search.grid

    moved = abs(grid.shape[0] - previous.shape.data_parallel) >= RESCHEDULE_FRACTION * previous.shape.data_parallel
    if (shape_changed and moved) or (planner.splitter(n_stages, local).stage_caps(grid) < np.asarray(layers)).any():
        found = planner.schedule(grid, local, servers=servers)
        if found is None:
            raise PlanError(
                f"the repaired grid ({grid.shape[1]} stages x {grid.shape[0]} pipelines) cannot hold the "
                "model's layers: plan afresh"
            )
    else:
        k = min(k, math.ceil(model.batch_micro_batches / grid.shape[0]))  # within the batch split
        found = GridCandidate(
            grid,
            layers,
            servers,
            previous.local_steps,
            k,
            groups=regroup(previous.reduce_groups, int(grid.shape[0]), servers),
        )
    relays = tuple(r for r in here(previous.relays) if r >= 0)
    result = planner.finish(found, started, relays=relays)
    return Repair(result, tuple(touched), dropped, added)


def _grow(
    planner: Planner,
    grid: np.ndarray,
    spare: list[int],
    layers: tuple[int, ...],
    local: bool,
    servers: tuple[tuple[int, ...], ...],
    previous: Plan,
) -> tuple[np.ndarray, int]:
    """``grid`` with new pipelines from the spares that can hold them, if the plan trains
    faster with them (their devices close for the activations, as a full plan builds them)."""
    n_stages = grid.shape[1]
    need = np.asarray(layers)
    fitting = np.array([d for d in spare if (planner.caps(n_stages, local)[d] >= need.min()).all()], dtype=int)
    count = len(fitting) // n_stages
    if count < 1:
        return grid, 0
    rows = pipelines_first(planner.model.links, fitting, Shape(n_stages, count), planner.memory)
    caps = planner.caps(n_stages, local)
    rows = rows[(caps[rows, np.arange(n_stages)[None, :]] >= need[None, :]).all(axis=1)]
    if not len(rows):
        return grid, 0
    bigger = np.vstack([grid, rows])
    model = planner.model

    def effective(g: np.ndarray) -> float:
        k = share_micro_batches(
            model.times(g, layers, model.stages(layers, servers)),
            model.batch_micro_batches,
            gradient=previous.local_steps == 1,
        )
        trial = GridCandidate(
            g,
            layers,
            servers,
            previous.local_steps,
            k,
            groups=regroup(previous.reduce_groups, int(g.shape[0]), servers),
        ).plan()
        if planner.settings.local_steps is None and previous.local_steps > 1:
            return choose_local_steps(model, trial, start=previous.local_steps)[1].effective_tokens_per_s
        return model.evaluate(trial).effective_tokens_per_s

    return (bigger, len(rows)) if effective(bigger) > effective(grid) else (grid, 0)


def kept_in_place(
    plan: Plan,
    scenario: Scenario,
    cells: Sequence[Sequence[str]],
    shards: Sequence[Sequence[str]],
    tolerance: float,
) -> Plan:
    """``plan`` with devices alike for it swapped, so that the peers of the assignment in force
    keep their places: ``cells[p][s]`` the cell (p, s), then ``shards[s][k]`` the shard (s, k),
    where ``plan`` has that cell or shard (the first place named keeps a peer). ``plan`` itself
    when no swap is needed or allowed. Alike: both hold the plan's layers at the same stages,
    with checkpointing and without (so the plan stays whole and checkpoints alike), and their
    speeds and availabilities are within ``tolerance`` of each other. Links are not compared
    here: the caller weighs the result on the throughput model before it keeps it."""
    index = scenario.index()
    stages = len(plan.layers_per_stage)
    local = LOCAL if plan.local_steps > 1 else 1
    memory = scenario.device_arrays.memory_gib
    layers = np.asarray(plan.layers_per_stage)
    fit = np.concatenate(
        [cell_layer_caps(scenario, memory, stages, local, checkpointing=c) >= layers for c in (False, True)], axis=1
    )
    arrays = scenario.device_arrays

    def near(a: float, b: float) -> bool:
        return abs(a - b) <= tolerance * max(abs(a), abs(b))

    def alike(a: int, b: int) -> bool:
        return (
            bool((fit[a] == fit[b]).all())
            and near(arrays.tflops[a], arrays.tflops[b])
            and near(arrays.availability[a], arrays.availability[b])
        )

    to = list(range(scenario.n))  # the new plan is ``plan.remapped(to)``
    origin = list(range(scenario.n))  # origin[to[d]] == d
    fixed: set[int] = set()
    wanted = [(row, named) for row, named in zip(plan.pipelines, cells, strict=False)]
    wanted += [(row, named) for row, named in zip(plan.shard_servers, shards, strict=False)]
    for row, named in wanted:
        for at, peer in zip(row, named, strict=False):
            want, there = index.get(peer), to[at]
            if want is None or want in fixed or there in fixed:
                continue
            if want != there:
                if not alike(want, there):
                    continue
                a, b = origin[there], origin[want]
                to[a], to[b], origin[want], origin[there] = want, there, a, b
            fixed.add(want)
    return plan if to == list(range(scenario.n)) else plan.remapped(to)
