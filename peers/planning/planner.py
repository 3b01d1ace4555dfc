"""swarmd's scheduler: which device runs which stage of which pipeline, pure functions over a snapshot.

The same code plans in the daemon (the elected coordinator, from the live matrix), in
``swarmd plan`` (from a scenario file) and in the simulator. Method (DESIGN.md, "The
scheduler"), each step cheap enough to plan 1,000 devices in seconds:

1. **Shape.** Fixed when the scenario gives ``parallelism``. Otherwise every stage count from
   the fewest whose layers fit in memory up to a few times that is tried with as many
   pipelines as the devices allow, and with fewer (leaving the slowest, worst-connected or
   least reliable devices out); each is built (step 2) and costed, and the best is refined.
2. **Construction.** Two clusterings on the latency and bandwidth graph, both balanced:
   *groups first* (stage groups of devices close for the data-parallel exchange; the groups
   then ordered along the cheapest path of bottleneck matchings, the coarsened graph) and
   *pipelines first* (each pipeline's devices close for the activations; inside a pipeline,
   devices ordered by speed so that a stage's group is of like devices). Whichever costs less
   under the own model (``swarmd.peers.planning.plan_cost``) is kept.
3. **Layers** split by each stage group's slowest device, within its memory.
4. **Local search** on the own model: swaps of two cells, or of a cell and an unused device,
   aimed first at the cells that make the cost (the worst member of the worst data-parallel
   group, both ends of the slowest pipeline link, the slowest device of the slowest stage),
   then anywhere while time is left; between rounds each boundary is re-matched (bottleneck
   matching) and the stage order improved by swapping stages.
5. **Roles.** Each stage's parameter server is the member that is most reliable (measured
   availability) and, among those that pass the threshold, cheapest to exchange with and to
   carry the stage's tensors through (the task pool is at the server); relays
   are reliable devices through which a pipeline link is faster than direct.

Each awareness can be switched off alone (``Awareness``): the planner then sees a uniform
network (every link the mean latency and bandwidth), uniform devices (mean speed and memory),
or devices that never leave; the plan is still costed on the real scenario, so the switch
measures what that knowledge is worth.

``repair`` mends a plan after devices leave or join, touching only the cells it must.
"""

from __future__ import annotations

import math
import threading
import time
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from swarmd.peers.planning.open_path import best_stage_order
from swarmd.peers.planning.plan_cost import (
    Plan,
    bottleneck_matching,
    churn_s,
    compute_s,
    embedding_memory_bytes,
    layer_memory_bytes,
    max_layers,
    predict,
)
from swarmd.peers.planning.scenario import Scenario, ScenarioError, Shape

INFEASIBLE_PENALTY_S = 1e9
"""Added per layer that does not fit in memory, so that the search walks toward plans that fit."""


@dataclass(frozen=True)
class Awareness:
    """What the planner may know; each switched off alone for ablations."""

    network: bool = True
    devices: bool = True
    reliability: bool = True


@dataclass(frozen=True)
class PlannerSettings:
    awareness: Awareness = field(default_factory=Awareness)
    time_budget_s: float = 1.5
    """Local search stops when this has passed (construction and shape choice come first)."""
    seed: int = 0
    min_availability: float = 0.9
    """A parameter server or relay must be up at least this fraction of the time (when
    reliability is known and the planner may use it)."""
    max_shapes: int = 12
    """Free mode: at most this many shapes are built and costed."""
    stages: int | None = None
    """Free mode with the stage count fixed (a running swarm: the run spec cuts the model),
    the number of pipelines left to the planner."""


class PlanError(ScenarioError):
    """No plan exists: the devices cannot hold the model, or too few are left."""


# -- the scenario as the planner may see it -------------------------------------------------------


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
        tflops = float(np.mean([d.tflops for d in devices]))
        memory = float(np.mean([d.memory_gib for d in devices]))
        devices = tuple(replace(d, tflops=tflops, memory_gib=memory) for d in devices)
    if not awareness.reliability:
        devices = tuple(replace(d, mean_uptime_h=None, mean_downtime_h=None) for d in devices)
    return replace(scenario, devices=devices, latency_s=lat, bandwidth_Bps=bw)


# -- the search state -----------------------------------------------------------------------------


class PairCost:
    """A kind of traffic's time on the edges i -> j, ``factor * (latency + nbytes / bandwidth)``,
    computed for the pairs asked for (``pair[rows, cols]``, ``block``) with the very operations
    the whole matrix would take, so the values are the same: the planner reads sub-blocks only,
    and a whole n x n matrix is 800 MB at 10,000 devices (one per kind and shape)."""

    def __init__(self, view: Scenario, nbytes: float, factor: float = 1.0) -> None:
        self.latency, self.bandwidth = view.latency_s, view.bandwidth_Bps
        self.nbytes, self.factor = nbytes, factor

    def __getitem__(self, key: tuple[np.ndarray | int, ...]) -> np.ndarray:
        t = self.latency[key] + self.nbytes / self.bandwidth[key]
        return t if self.factor == 1.0 else self.factor * t

    def block(self, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
        return self[np.ix_(rows, cols)]

    def symmetric(self, members: np.ndarray) -> np.ndarray:
        """Both directions summed among ``members``: ``(pair + pair.T)[members][:, members]``."""
        sub = self.block(members, members)
        return sub + sub.T


SHORTLIST = 24
"""Spares costed exactly per cell, at most, on a large grid (``GridCost.shortlist``)."""
SHORTLIST_CELLS = 1024
"""Grids of fewer cells cost every spare: there a full cost is well under a millisecond."""
SHORTLIST_SAMPLE = 32
"""Members of a stage group a spare's exchange with the group is estimated from."""
BLOCK_CACHE_MIN = 64
"""Stage groups at least this large keep their data-parallel block between calls."""
BLOCK_CACHE_ELEMENTS = 1 << 27
"""At most this many cached block entries (1 GiB of float64) beside the one in use: enough
for every stage group of a 10,000-device plan (two stages of 3,900 pipelines, three blocks
each), whose blocks a search reads in turn; fewer and each read evicts the one needed next."""


@dataclass
class _Block:
    members: np.ndarray
    latency: np.ndarray
    bandwidth: np.ndarray
    dp: np.ndarray
    nbytes: float
    """The share ``dp`` was computed for (it changes with the number of pipelines)."""
    factor: float


class GroupBlocks:
    """Latency, bandwidth and data-parallel blocks of large stage groups, kept per pair of
    matrices. A swap changes a member or two of a group, a repair a few, an added or dropped
    pipeline one: reading a fresh 2,000 x 2,000 block out of 10,000 x 10,000 matrices for each
    costs tens of milliseconds; patching or re-indexing a kept one does not."""

    MOVED = 4
    """A kept block is patched when at most this many members differ."""
    _per_thread = threading.local()
    """The coordinator plans in worker threads: each keeps its own blocks."""

    def __init__(self, latency: np.ndarray, bandwidth: np.ndarray) -> None:
        # Weakly: the blocks must not keep a dropped scenario's matrices alive.
        self._latency, self._bandwidth = weakref.ref(latency), weakref.ref(bandwidth)
        self.kept: list[_Block] = []

    @property
    def latency(self) -> np.ndarray:
        found = self._latency()
        assert found is not None
        return found

    @property
    def bandwidth(self) -> np.ndarray:
        found = self._bandwidth()
        assert found is not None
        return found

    @classmethod
    def of(cls, view: Scenario) -> GroupBlocks:
        """The blocks over ``view``'s matrices (the matrices themselves, not equal ones)."""
        live = [b for b in getattr(cls._per_thread, "live", []) if b._latency() is not None]
        for blocks in live:
            if blocks._latency() is view.latency_s and blocks._bandwidth() is view.bandwidth_Bps:
                return blocks
        blocks = cls(view.latency_s, view.bandwidth_Bps)
        cls._per_thread.live = [blocks, *live[:1]]  # a scenario and a planning view at most
        return blocks

    def dp(self, members: np.ndarray, pair: PairCost) -> np.ndarray:
        block = self._find(members)
        if block is None:
            ix = np.ix_(members, members)
            block = _Block(np.array(members), self.latency[ix], self.bandwidth[ix], pair[ix], pair.nbytes, pair.factor)
        self.kept.insert(0, block)
        total = 0
        for k, b in enumerate(self.kept):
            total += 3 * b.dp.size
            if k > 0 and total > BLOCK_CACHE_ELEMENTS:
                del self.kept[k:]
                break
        if block.nbytes != pair.nbytes or block.factor != pair.factor:
            block.dp = pair.factor * (block.latency + pair.nbytes / block.bandwidth)
            block.nbytes, block.factor = pair.nbytes, pair.factor
        return block.dp

    def _find(self, members: np.ndarray) -> _Block | None:
        """A kept block brought to ``members`` (taken out of ``kept``), or None."""
        n = len(members)
        for k, b in enumerate(self.kept):
            if len(b.members) == n:
                moved = np.flatnonzero(b.members != members)
                if len(moved) <= self.MOVED:
                    self._patch(b, members, moved)
                    return self.kept.pop(k)
        for k, b in enumerate(self.kept):
            if abs(len(b.members) - n) > self.MOVED:
                continue
            where = {int(d): i for i, d in enumerate(b.members)}
            pos = np.array([where.get(int(d), -1) for d in members])
            fresh = np.flatnonzero(pos < 0)
            if len(fresh) > self.MOVED:
                continue
            ix = np.ix_(np.where(pos < 0, 0, pos), np.where(pos < 0, 0, pos))
            b = _Block(np.array(members), b.latency[ix], b.bandwidth[ix], b.dp[ix], b.nbytes, b.factor)
            self._patch(b, members, fresh)
            del self.kept[k]
            return b
        return None

    def _patch(self, b: _Block, members: np.ndarray, rows: np.ndarray) -> None:
        """``members`` at positions ``rows`` are new: read their rows and columns afresh."""
        if not len(rows):
            return
        b.members[rows] = members[rows]
        for here, there in ((np.ix_(rows, np.arange(len(members))), np.ix_(members[rows], members)),
                            (np.ix_(np.arange(len(members)), rows), np.ix_(members, members[rows]))):  # fmt: skip
            lat, bw = self.latency[there], self.bandwidth[there]
            b.latency[here], b.bandwidth[here] = lat, bw
            b.dp[here] = b.factor * (lat + b.nbytes / bw)


class GridCost:
    """The own model of ``swarmd.peers.planning.plan_cost`` for one shape, with what a swap needs cached.

    ``cost(grid)`` is the predicted iteration time (plus a penalty for layers that do not fit);
    its pieces are the same as ``predict``'s, computed over arrays prepared once per shape.
    The pair costs are read per block (``PairCost``); a large stage group's data-parallel block
    is kept and patched where a swap changed a member, since a swap changes one or two."""

    def __init__(self, view: Scenario, shape: Shape) -> None:
        self.view, self.shape = view, shape
        n_pipes = shape.data_parallel
        self.act = PairCost(view, view.activation_bytes(shape))
        share = view.grad_bytes(shape) / n_pipes
        self.dp_pair = PairCost(view, share, 2.0) if n_pipes > 1 else None
        arrays = view.device_arrays
        self.device_tflops = arrays.tflops
        self.tflops = self.device_tflops * 1e12
        self.rates = arrays.leave_rate_per_s
        self.availability = arrays.availability
        memory = arrays.memory_gib
        self.cap_inner = max_layers(view, memory, first=False, last=False)
        self.cap_edge = max_layers(view, memory, first=True, last=False)
        self.layer_flops = view.model.layer_flops_per_sequence() * view.micro_batch
        self.head_flops = view.model.head_flops_per_sequence() * view.micro_batch
        self.weights_bytes = view.grad_bytes(shape)
        self._splits: dict[bytes, tuple[np.ndarray, int]] = {}

    # pieces
    def dp_stage(self, members: np.ndarray) -> float:
        if self.dp_pair is None:
            return 0.0
        return float(self.dp_block(members).sum(axis=1).max())

    def dp_block(self, members: np.ndarray) -> np.ndarray:
        """``dp_pair`` among ``members`` (not to be modified). Large groups' blocks are kept
        (``GroupBlocks``, shared by every GridCost over the same matrices: a repair builds
        new ones), a kept block that differs in a few members patched in their rows and
        columns: the same values as a fresh block, at a fraction of the reads."""
        assert self.dp_pair is not None
        if len(members) < BLOCK_CACHE_MIN:
            return self.dp_pair.block(members, members)
        return GroupBlocks.of(self.view).dp(members, self.dp_pair)

    def layer_caps(self, grid: np.ndarray) -> np.ndarray:
        caps = self.cap_inner[grid].min(axis=0)
        caps[0] = self.cap_edge[grid[:, 0]].min()
        caps[-1] = self.cap_edge[grid[:, -1]].min()
        return caps

    def split_layers(self, grid: np.ndarray) -> tuple[np.ndarray, int]:
        """Layers per stage minimising the slowest stage's time (each stage as fast as its
        slowest member), within memory; returns them and how many layers did not fit.
        Memoised on the stages' speeds and capacities: most swaps change neither."""
        speed = self.tflops[grid].min(axis=0)
        caps = self.layer_caps(grid)
        key = speed.tobytes() + caps.tobytes()
        found = self._splits.get(key)
        if found is None:
            if len(self._splits) > 100_000:
                self._splits.clear()
            found = self._splits[key] = self._split(speed, caps)
        return found[0].copy(), found[1]

    def _split(self, speed: np.ndarray, caps: np.ndarray) -> tuple[np.ndarray, int]:
        n_stages = len(speed)
        layers_total = self.view.model.layers
        head = np.zeros(n_stages)
        head[-1] = self.head_flops
        layers = np.ones(n_stages, dtype=int)
        # Water-filling: each further layer goes where it makes the smallest slowest-stage time.
        # Closed form first (proportional to speed), then exact greedy steps for the remainder.
        ideal = (layers_total * self.layer_flops + head.sum()) * speed / speed.sum()
        layers = np.maximum(1, np.minimum(np.floor((ideal - head) / self.layer_flops).astype(int), caps))
        layers = np.maximum(layers, 1)
        while layers.sum() > layers_total:
            time_now = (layers * self.layer_flops + head) / speed
            time_now[layers <= 1] = -np.inf
            layers[int(np.argmax(time_now))] -= 1
        missing = 0
        while layers.sum() < layers_total:
            after = ((layers + 1) * self.layer_flops + head) / speed
            after[layers >= caps] = np.inf
            s = int(np.argmin(after))
            if not math.isfinite(after[s]):
                missing = layers_total - int(layers.sum())
                layers[int(np.argmin((layers * self.layer_flops + head) / speed))] += missing
                break
            layers[s] += 1
        return layers, missing

    def compute(self, grid: np.ndarray, layers: np.ndarray) -> float:
        return compute_s(self.view, grid, layers, self.device_tflops)

    def edges(self, grid: np.ndarray) -> np.ndarray:
        """edges[p, s]: pipeline p's activation transfer across boundary s."""
        return self.act[grid[:, :-1], grid[:, 1:]]

    def churn(self, grid: np.ndarray, base: float, servers: np.ndarray) -> float:
        return churn_s(self.view, grid, base, servers, self.rates)

    def servers(self, grid: np.ndarray, min_availability: float) -> np.ndarray:
        return np.array([self.server_of(grid, s, min_availability) for s in range(grid.shape[1])], dtype=int)

    def server_of(self, grid: np.ndarray, s: int, min_availability: float) -> int:
        """Stage ``s``'s most dependable member: availability first (those past the threshold
        count as equal), then the cheapest to exchange the stage's weights with the others and
        to carry the stage's tensors (``carried``)."""
        members = grid[:, s]
        members = members[members >= 0]
        avail = self.availability[members]
        eligible = avail >= min_availability
        if not eligible.any():
            eligible = avail >= avail.max()
        sub = (
            self.view.latency_s[np.ix_(members, members)]
            + self.weights_bytes / self.view.bandwidth_Bps[np.ix_(members, members)]
        )
        exchange = sub.sum(axis=0) + sub.sum(axis=1) + self.carried(grid, s, members)
        exchange[~eligible] = np.inf
        return int(members[int(np.argmin(exchange))])

    def carried(self, grid: np.ndarray, s: int, members: np.ndarray) -> np.ndarray:
        """What each of ``members`` would spend per iteration carrying stage ``s``'s tensors as
        its host: the daemon's data path takes every tensor through the host of the stage it
        goes to (the task pool is there), so each pipeline's activation from the stage before
        and gradient from the stage after come into the host and go out to the pipeline's
        worker of this stage. In a group of two the weights' exchange costs the same either
        way; this is what keeps the stage off the member with the slower link."""

        def present(column: np.ndarray) -> np.ndarray:
            return column[column >= 0]  # a repair's grid may still have holes

        total = np.zeros(len(members))
        into = [present(grid[:, t]) for t in (s - 1, s + 1) if 0 <= t < grid.shape[1]]
        for senders in into:
            total += self.act.block(senders, members).sum(axis=0)
        total += len(into) * self.act.block(members, present(grid[:, s])).sum(axis=1)
        return total

    def shortlist(self, grid: np.ndarray, cell: tuple[int, int], spare: list[int]) -> list[int]:
        """The spares worth costing in ``cell``: all of them on a grid under ``SHORTLIST_CELLS``
        or up to ``SHORTLIST`` spares; past that, the fastest half and the half closest to the
        cell's traffic (the exchange with a sample of the stage's group, the links to its
        pipeline neighbours), in ``spare``'s order. Costing a spare is a full ``cost``
        (milliseconds at thousands of devices) and a large swarm has thousands of spares."""
        if len(spare) <= SHORTLIST or grid.size < SHORTLIST_CELLS:
            return spare
        p, s = cell
        pool = np.asarray(spare)
        near = np.zeros(len(pool))
        if self.dp_pair is not None:
            group = np.delete(grid[:, s], p)
            sample = group[group >= 0][:SHORTLIST_SAMPLE]  # (a repair's grid may still have holes)
            if len(sample):
                near += self.dp_pair.block(pool, sample).mean(axis=1) * (grid.shape[0] - 1)
        if s > 0 and grid[p, s - 1] >= 0:
            near += 2.0 * self.act[grid[p, s - 1], pool]
        if s < grid.shape[1] - 1 and grid[p, s + 1] >= 0:
            near += 2.0 * self.act[pool, grid[p, s + 1]]
        half = SHORTLIST // 2
        chosen = set(np.argsort(-self.tflops[pool], kind="stable")[:half].tolist())
        chosen.update(np.argsort(near, kind="stable")[: SHORTLIST - len(chosen)].tolist())
        return [spare[i] for i in sorted(chosen)]

    def total(self, grid: np.ndarray, dp: np.ndarray) -> float:
        layers, missing = self.split_layers(grid)
        base = self.compute(grid, layers) + dp.max() + 2.0 * float(self.edges(grid).max(axis=0).sum())
        churn = self.churn(grid, base, grid[0]) if self.rates.any() else 0.0
        return base + churn + missing * INFEASIBLE_PENALTY_S

    def cost(self, grid: np.ndarray) -> float:
        dp = np.array([self.dp_stage(grid[:, s]) for s in range(grid.shape[1])])
        return self.total(grid, dp)


# -- construction ---------------------------------------------------------------------------------


def balanced_clusters(d: np.ndarray, candidates: np.ndarray, k: int, size: int) -> list[np.ndarray]:
    """``k`` clusters of exactly ``size`` devices from ``candidates`` (at least ``k * size``),
    close under ``d`` (symmetric, among the candidates, in their order): seeds spread by
    farthest-point, then devices placed in order of regret (how much worse their second-best
    cluster is), each cluster's distance the mean to its members so far. Devices left over are
    the ones farthest from every cluster."""
    cand = np.asarray(candidates)
    # The first seed: the device with the tightest neighbourhood of ``size``.
    # (The ``size`` smallest per row, in order: the same sums as sorting whole rows, at a fraction.)
    tight = np.sort(np.partition(d, size - 1, axis=1)[:, :size], axis=1).sum(axis=1)
    seeds = [int(np.argmin(tight))]
    nearest = d[seeds[0]].copy()
    for _ in range(1, k):
        nearest_masked = nearest.copy()
        nearest_masked[seeds] = -np.inf
        seeds.append(int(np.argmax(nearest_masked)))
        nearest = np.minimum(nearest, d[seeds[-1]])
    members: list[list[int]] = [[s] for s in seeds]
    sums = d[:, seeds].copy()  # sum of distances from each device to each cluster's members
    open_ = np.ones(k, dtype=bool)
    unplaced = np.setdiff1d(np.arange(len(cand)), seeds)
    need = k * size - k
    while need > 0:
        counts = np.array([len(m) for m in members], dtype=float)
        mean = sums[unplaced] / counts[None, :]
        mean[:, ~open_] = np.inf
        if open_.sum() >= 2:
            two = np.partition(mean, 1, axis=1)[:, :2]
            regret = np.where(np.isfinite(two[:, 1]), two[:, 1] - np.minimum(two[:, 0], two[:, 1]), 0.0)
        else:
            regret = np.zeros(len(unplaced))
        choice = np.argmin(mean, axis=1)
        # Decided devices first (large regret), and among them the close ones. Small swarms
        # place one device per round; large ones a batch per round on the same means, which
        # keeps a thousand devices to a few dozen rounds.
        order = np.argsort(-(regret - mean[np.arange(len(unplaced)), choice]), kind="stable")
        batch = 1 if len(cand) <= 200 else max(1, len(unplaced) // 16)
        done = []
        for row in order[:batch]:
            c = int(choice[row])
            if not open_[c] or need == 0:
                continue
            i = int(unplaced[row])
            members[c].append(i)
            sums[:, c] += d[:, i]
            done.append(row)
            need -= 1
            if len(members[c]) == size:
                open_[c] = False
        unplaced = np.delete(unplaced, done)
    return [cand[np.array(m)] for m in members]


def path_order(cost: np.ndarray) -> list[int]:
    """An open path through every node minimising the summed ``cost[a][b]`` of its steps
    (``swarmd.peers.planning.open_path``)."""
    if len(cost) == 0:
        return []
    return list(best_stage_order(cost)[0])


def rematch(grid: np.ndarray, act: PairCost) -> np.ndarray:
    """Re-pair the pipelines at every boundary by bottleneck matching of the activation links,
    stage by stage from the first (permuting the rows of the later stages together keeps the
    boundaries already matched)."""
    grid = grid.copy()
    for s in range(grid.shape[1] - 1):
        cols, _ = bottleneck_matching(act[np.ix_(grid[:, s], grid[:, s + 1])])
        grid[:, s + 1 :] = grid[cols, s + 1 :]
    return grid


def groups_first(cost: GridCost, candidates: np.ndarray) -> np.ndarray:
    """Stage groups close for the data-parallel exchange, ordered along the coarsened graph."""
    shape = cost.shape
    pair = cost.act if cost.dp_pair is None else cost.dp_pair
    groups = balanced_clusters(pair.symmetric(candidates), candidates, shape.stages, shape.data_parallel)
    between = np.zeros((shape.stages, shape.stages))
    for a in range(shape.stages):
        for b in range(shape.stages):
            if a != b:
                between[a, b] = bottleneck_matching(cost.act.block(groups[a], groups[b]))[1]
    order = path_order(between)
    grid = np.stack([groups[g] for g in order], axis=1)
    return rematch(grid, cost.act)


def pipelines_first(cost: GridCost, candidates: np.ndarray) -> np.ndarray:
    """Pipelines of devices close for the activations, each ordered along its cheapest path and
    then (device awareness) aligned so that like devices share a stage."""
    shape = cost.shape
    pipes = balanced_clusters(cost.act.symmetric(candidates), candidates, shape.data_parallel, shape.stages)
    rows = []
    for members in pipes:
        if shape.stages > 1:
            order = path_order(cost.act.block(members, members))
            rows.append(members[order])
        else:
            rows.append(members)
    return np.stack(rows)


# -- local search ---------------------------------------------------------------------------------


class Search:
    """Swap moves on a grid, costed incrementally (only the touched stage groups' data-parallel
    cost is recomputed)."""

    def __init__(self, cost: GridCost, grid: np.ndarray, spare: Iterable[int], deadline: float, seed: int) -> None:
        self.c = cost
        self.grid = grid.copy()
        self.spare = list(spare)
        self.deadline = deadline
        self.rng = np.random.default_rng(seed)
        self.dp = np.array([cost.dp_stage(self.grid[:, s]) for s in range(grid.shape[1])])
        self.value = cost.total(self.grid, self.dp)
        self.moves = 0

    def _try(self, cells: Sequence[tuple[int, int]], devices: Sequence[int]) -> float:
        """The cost with ``devices`` put in ``cells`` (the grid is restored)."""
        old = [int(self.grid[p, s]) for p, s in cells]
        for (p, s), d in zip(cells, devices, strict=True):
            self.grid[p, s] = d
        stages = {s for _, s in cells}
        dp = self.dp.copy()
        for s in stages:
            dp[s] = self.c.dp_stage(self.grid[:, s])
        value = self.c.total(self.grid, dp)
        for (p, s), d in zip(cells, old, strict=True):
            self.grid[p, s] = d
        return value

    def _apply(self, cells: Sequence[tuple[int, int]], devices: Sequence[int], value: float) -> None:
        for (p, s), d in zip(cells, devices, strict=True):
            old = int(self.grid[p, s])
            self.grid[p, s] = d
            if old in devices:
                continue
            # a spare came in: the device it replaced becomes spare
            self.spare[self.spare.index(d)] = old
        for s in {s for _, s in cells}:
            self.dp[s] = self.c.dp_stage(self.grid[:, s])
        self.value = value
        self.moves += 1

    def improve_cell(self, p: int, s: int, within: set[tuple[int, int]] | None = None) -> bool:
        """The best swap of cell (p, s) with any other cell of another stage (of ``within``
        only, when given) or any spare."""
        n_pipes, n_stages = self.grid.shape
        here = int(self.grid[p, s])
        best, best_move = self.value - 1e-9 * max(1.0, self.value), None
        for q in range(n_pipes):
            # (A row of swaps costs milliseconds at thousands of devices: the deadline holds.)
            if q and time.perf_counter() >= self.deadline:
                break
            for t in range(n_stages):
                if t == s or (within is not None and (q, t) not in within):
                    continue
                other = int(self.grid[q, t])
                v = self._try([(p, s), (q, t)], [other, here])
                if v < best:
                    best, best_move = v, ([(p, s), (q, t)], [other, here])
        for d in self.c.shortlist(self.grid, (p, s), self.spare):
            v = self._try([(p, s)], [d])
            if v < best:
                best, best_move = v, ([(p, s)], [d])
        if best_move is None:
            return False
        self._apply(best_move[0], best_move[1], best)
        return True

    def critical_cells(self) -> list[tuple[int, int]]:
        """The cells that make the cost: the worst member of the worst group, both ends of the
        slowest link, the slowest member of the slowest stage."""
        g = self.grid
        cells = []
        s = int(np.argmax(self.dp))
        if self.c.dp_pair is not None:
            members = g[:, s]
            p = int(np.argmax(self.c.dp_block(members).sum(axis=1)))
            cells.append((p, s))
        if g.shape[1] > 1:
            edges = self.c.edges(g)
            pe, b = (int(x) for x in np.unravel_index(int(np.argmax(edges)), edges.shape))
            cells += [(pe, b), (pe, b + 1)]
        layers, _ = self.c.split_layers(g)
        flops = layers * self.c.layer_flops
        step = flops[None, :] / self.c.tflops[g]
        ps, s2 = (int(x) for x in np.unravel_index(int(np.argmax(step)), step.shape))
        cells.append((ps, s2))
        return list(dict.fromkeys(cells))

    def run(self) -> None:
        while time.perf_counter() < self.deadline:
            if any(self.improve_cell(p, s) for p, s in self.critical_cells()):
                continue
            if not self._sweep():
                break

    def _sweep(self) -> bool:
        """One pass over every cell in random order; True if anything improved."""
        n_pipes, n_stages = self.grid.shape
        cells = [(p, s) for p in range(n_pipes) for s in range(n_stages)]
        improved = False
        for k in self.rng.permutation(len(cells)):
            if time.perf_counter() >= self.deadline:
                break
            improved |= self.improve_cell(*cells[k])
        return improved


# -- shapes ---------------------------------------------------------------------------------------


def min_stages(view: Scenario) -> int:
    """The fewest stages whose layers fit on the larger half of the devices' memory."""
    per_layer = layer_memory_bytes(view)
    memory = np.sort([d.memory_gib * (1 << 30) for d in view.devices])[::-1]
    typical = memory[max(0, len(memory) // 2 - 1)]
    edge = typical - embedding_memory_bytes(view)
    if edge < per_layer:
        raise PlanError(
            f"a first or last stage needs {(embedding_memory_bytes(view) + per_layer) / (1 << 30):.1f} GiB "
            f"(embedding and one layer); the larger half of the devices have {typical / (1 << 30):.1f} GiB or less"
        )
    fit = max(1, int(typical // per_layer))
    return max(1, min(view.model.layers, math.ceil(view.model.layers / fit)))


def candidate_shapes(view: Scenario, usable: int, max_shapes: int) -> list[Shape]:
    first = min_stages(view)
    top = min(view.model.layers, usable, max(first * 4, first + 3))
    stage_counts = sorted(set(np.linspace(first, top, num=min(top - first + 1, max_shapes // 2)).astype(int)))
    shapes: list[Shape] = []
    for s in stage_counts:
        most = usable // s
        for n in sorted({most, max(1, most * 3 // 4), max(1, most // 2)}, reverse=True):
            if n >= 1:
                shapes.append(Shape(int(s), int(n)))
    return shapes[: max(max_shapes, 1)]


def pipeline_counts(stages: int, usable: int) -> list[Shape]:
    """The shapes with ``stages`` stages worth trying: as many pipelines as the devices allow,
    three quarters and half of that."""
    most = usable // stages
    if most < 1:
        raise PlanError(f"{usable} usable device(s) cannot form one pipeline of {stages} stages")
    return [Shape(stages, n) for n in sorted({most, max(1, most * 3 // 4), max(1, most // 2)}, reverse=True)]


def usable_devices(view: Scenario, settings: PlannerSettings, among: np.ndarray | None = None) -> np.ndarray:
    """Devices worth planning on, best first (speed times availability, as far as the planner
    may know them): those up too rarely to matter are left out when reliability is known
    (they cost more in churn than they bring)."""
    avail, speed = view.device_arrays.availability, view.device_arrays.tflops
    keep = np.arange(view.n) if among is None else np.asarray(among, dtype=int)
    if settings.awareness.reliability and (avail[keep] >= 0.5).any():
        keep = keep[avail[keep] >= 0.5]
    return keep[np.argsort(-(speed * avail)[keep], kind="stable")]


def candidate_pools(cost: GridCost, usable: np.ndarray, shape: Shape, pools: int = 3) -> list[np.ndarray]:
    """The device sets a construction draws from when the shape leaves devices out, each a
    quarter more than it needs so that the clustering can still pass over a bad one: the
    fastest (``usable`` is best first), and the tightest neighbourhoods on the graph (a seed
    and its nearest devices under both kinds of traffic), from seeds that differ."""
    need = min(len(usable), math.ceil(shape.devices * 1.25))
    if need >= len(usable):
        return [usable]
    out = [usable[:need]]
    sub = cost.act.symmetric(usable)
    if cost.dp_pair is not None:
        dp = cost.dp_pair.block(usable, usable)
        sub += dp
        sub += dp.T
        del dp
    nearest = np.argsort(sub, axis=1)[:, :need]  # each row starts with the device itself
    tightness = np.take_along_axis(sub, nearest, axis=1).sum(axis=1)
    taken: set[int] = set()
    for seed in np.argsort(tightness):
        if len(out) > pools or int(seed) in taken:
            continue
        members = usable[nearest[seed]]
        out.append(members)
        taken.update(int(i) for i in nearest[seed])
    return out


# -- planning -------------------------------------------------------------------------------------


def build(view: Scenario, shape: Shape, usable: np.ndarray) -> tuple[GridCost, np.ndarray, float]:
    """Both constructions on every candidate pool for ``shape``; the cheapest grid and its cost."""
    cost = GridCost(view, shape)
    best_grid, best_value = None, math.inf
    for pool in candidate_pools(cost, usable, shape, pools=3 if view.n <= LARGE else 1):
        for construct in (groups_first, pipelines_first):
            grid = construct(cost, pool)
            if shape.stages > 1:
                grid = rematch(grid, cost.act)
            value = cost.cost(grid)
            if value < best_value:
                best_grid, best_value = grid, value
    assert best_grid is not None
    return cost, best_grid, best_value


LARGE = 200
"""Past this many devices, constructions are cheaper (fewer candidate pools, fewer shapes, and
clustering in batches) so that a thousand devices plan in seconds."""
FINALISTS = 2
"""Free mode: how many of the best-built shapes are refined by local search."""


def plan(scenario: Scenario, settings: PlannerSettings | None = None) -> Plan:
    """A full plan for ``scenario`` (see the module doc)."""
    settings = settings or PlannerSettings()
    started = time.perf_counter()
    view = planning_view(scenario, settings.awareness)
    usable = usable_devices(view, settings)
    if scenario.parallelism is not None:
        if len(usable) < scenario.parallelism.devices:
            usable = np.arange(scenario.n)  # the shape is the user's: use whom it takes
        finalists = [build(view, scenario.parallelism, usable)]
    else:
        if settings.stages is not None:
            shapes = pipeline_counts(settings.stages, len(usable))
        else:
            shapes = candidate_shapes(
                view, len(usable), settings.max_shapes if view.n <= LARGE else settings.max_shapes // 2
            )
        finalists = sorted((build(view, shape, usable) for shape in shapes), key=lambda b: b[2])[:FINALISTS]
    budget_each = max(0.0, settings.time_budget_s - (time.perf_counter() - started)) / len(finalists)
    best: tuple[float, GridCost, np.ndarray] | None = None
    for cost, grid, _ in finalists:
        deadline = time.perf_counter() + budget_each
        placed = set(grid.ravel().tolist())
        spare = [int(d) for d in usable if int(d) not in placed]
        grid = refine(cost, grid, spare, deadline, settings.seed)
        value = cost.cost(grid)
        if best is None or value < best[0]:
            best = (value, cost, grid)
    assert best is not None
    return finish(scenario, view, best[1], best[2], settings, started)


STALL_KICKS = 12
"""Iterated local search stops after this many kicks in a row found nothing better."""


def refine(cost: GridCost, grid: np.ndarray, spare: list[int], deadline: float, seed: int) -> np.ndarray:
    """Descend to a local optimum, then kick it (a few random swaps between stages) and descend
    again, keeping the best, until ``STALL_KICKS`` kicks in a row found nothing better or time
    is up: single swaps alone stall where two groups must trade several members at once."""
    rng = np.random.default_rng(seed)
    best, best_spare = descend(cost, grid, spare, deadline, seed)
    best_value = cost.cost(best)
    stalls = 0
    while stalls < STALL_KICKS and time.perf_counter() < deadline:
        kicked = kick(best, rng)
        grid, new_spare = descend(cost, kicked, list(best_spare), deadline, int(rng.integers(1 << 31)))
        value = cost.cost(grid)
        if value < best_value - 1e-9 * max(1.0, best_value):
            best, best_spare, best_value, stalls = grid, new_spare, value, 0
        else:
            stalls += 1
    return best


def kick(grid: np.ndarray, rng: np.random.Generator, swaps: int = 3) -> np.ndarray:
    """``grid`` with a few cells of different stages swapped at random."""
    out = grid.copy()
    n_pipes, n_stages = grid.shape
    if n_stages < 2:
        return out
    for _ in range(swaps):
        s, t = rng.choice(n_stages, size=2, replace=False)
        p, q = rng.integers(n_pipes, size=2)
        out[p, s], out[q, t] = out[q, t], out[p, s]
    return out


def descend(
    cost: GridCost, grid: np.ndarray, spare: list[int], deadline: float, seed: int
) -> tuple[np.ndarray, list[int]]:
    """Local search, re-matching and stage reordering in rounds until nothing improves or time is up."""
    value = cost.cost(grid)
    while True:
        search = Search(cost, grid, spare, deadline, seed)
        search.run()
        grid, spare = search.grid, search.spare
        if grid.shape[1] > 1:
            grid = best_of(cost, [grid, rematch(grid, cost.act), reorder_stages(cost, grid)])
        new = cost.cost(grid)
        if new >= value - 1e-9 * max(1.0, value) or time.perf_counter() >= deadline:
            return grid, spare
        value = new


def best_of(cost: GridCost, grids: list[np.ndarray]) -> np.ndarray:
    return min(grids, key=cost.cost)


def reorder_stages(cost: GridCost, grid: np.ndarray) -> np.ndarray:
    """The stage groups along the cheapest path of the coarsened graph, re-matched."""
    n_stages = grid.shape[1]
    between = np.zeros((n_stages, n_stages))
    for a in range(n_stages):
        for b in range(n_stages):
            if a != b:
                between[a, b] = bottleneck_matching(cost.act.block(grid[:, a], grid[:, b]))[1]
    order = path_order(between)
    return rematch(grid[:, order], cost.act)


def finish(
    scenario: Scenario, view: Scenario, cost: GridCost, grid: np.ndarray, settings: PlannerSettings, started: float
) -> Plan:
    """Layers, roles and the prediction on the real scenario."""
    layers, missing = cost.split_layers(grid)
    if missing:
        gib = 1 << 30
        raise PlanError(
            f"{missing} of {scenario.model.layers} layers fit on no stage of the best plan found "
            f"({grid.shape[1]} stages x {grid.shape[0]} pipelines): a layer needs "
            f"{layer_memory_bytes(scenario) / gib:.2f} GiB on a worker (the first and last stage "
            f"{embedding_memory_bytes(scenario) / gib:.2f} GiB more), and the stages hold at most "
            f"{cost.layer_caps(grid).tolist()} layers; add devices with more memory or lower batch.micro_batch"
        )
    min_avail = settings.min_availability if settings.awareness.reliability else 0.0
    servers = cost.servers(grid, min_avail)
    relays = routing_relays(view, cost, grid, min_avail)
    result = Plan(
        pipelines=tuple(tuple(int(d) for d in row) for row in grid),
        layers_per_stage=tuple(int(x) for x in layers),
        parameter_servers=tuple(int(x) for x in servers),
        relays=tuple(relays),
    )
    runtime = time.perf_counter() - started
    return replace(result, meta={"runtime_s": runtime, "prediction": predict(scenario, result)})


def routing_relays(view: Scenario, cost: GridCost, grid: np.ndarray, min_availability: float) -> list[int]:
    """Reliable devices through which some pipeline link is faster than direct (forwarding in
    chunks: both latencies, the slower of the two bandwidths), best first; at most one per link."""
    if grid.shape[1] < 2:
        return []
    avail = cost.availability
    reliable = np.flatnonzero(avail >= min_availability)
    if len(reliable) == 0:
        return []
    nbytes = view.activation_bytes(cost.shape)
    chosen: dict[int, float] = {}
    for s in range(grid.shape[1] - 1):
        for p in range(grid.shape[0]):
            a, b = int(grid[p, s]), int(grid[p, s + 1])
            direct = cost.act[a, b]
            via = (
                view.latency_s[a, reliable]
                + view.latency_s[reliable, b]
                + nbytes / np.minimum(view.bandwidth_Bps[a, reliable], view.bandwidth_Bps[reliable, b])
            )
            via[(reliable == a) | (reliable == b)] = np.inf
            k = int(np.argmin(via))
            if via[k] < direct:
                relay = int(reliable[k])
                chosen[relay] = chosen.get(relay, 0.0) + float(direct - via[k])
    return sorted(chosen, key=lambda r: -chosen[r])


# -- repair ---------------------------------------------------------------------------------------


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
    settings: PlannerSettings | None = None,
    *,
    time_budget_s: float = 0.05,
    live: Sequence[int] | None = None,
) -> Repair:
    """Mend ``previous`` (whose device indices refer to ``previous_ids``) for the devices of
    ``scenario`` now: a departed device's cell is filled from the spares (the one that costs
    least there) or, with none to spare, its pipeline is dropped and its devices become
    spares; new devices are spares, a hole is filled first, and enough of them form a new
    pipeline. Then a short local search among the touched cells and the spares only. The layer
    split is kept unless a stage no longer fits or the shape changed (then recomputed).

    ``live``: the devices of ``scenario`` that take part, ascending (all when None); the plans'
    indices are then the whole scenario's. The simulator mends this way: a scenario restricted
    to the live devices is a copy of both n x n matrices per change (1.6 GB at 10,000)."""
    settings = settings or PlannerSettings()
    started = time.perf_counter()
    view = planning_view(scenario, settings.awareness)
    if live is None:
        index = scenario.index()
    else:
        ids = scenario.ids
        index = {ids[i]: int(i) for i in live}
    old_grid = np.array([[index.get(previous_ids[d], -1) for d in row] for row in previous.pipelines], dtype=int)
    n_pipes, n_stages = old_grid.shape
    in_plan = set(old_grid[old_grid >= 0].tolist())
    spare = [i for i in usable_devices(view, settings, None if live is None else np.asarray(live)).tolist()
             if i not in in_plan]  # fmt: skip
    holes = [(int(p), int(s)) for p, s in zip(*np.nonzero(old_grid < 0), strict=True)]
    grid = old_grid.copy()
    changed: list[tuple[int, int]] = []
    dropped = added = 0
    cost = GridCost(view, Shape(n_stages, n_pipes))
    fixed = scenario.parallelism is not None
    while holes:
        if len(spare) < len(holes) and not fixed and grid.shape[0] > 1:
            # Not enough spares: give up the pipeline with the most holes; its devices are spares.
            worst = max(range(grid.shape[0]), key=lambda p: int((grid[p] < 0).sum()))
            spare += [int(d) for d in grid[worst] if d >= 0]
            grid = np.delete(grid, worst, axis=0)
            changed = [(p - (p > worst), s) for p, s in changed if p != worst]
            holes = [(p - (p > worst), s) for p, s in holes if p != worst]
            dropped += 1
            cost = GridCost(view, Shape(n_stages, grid.shape[0]))
            continue
        if not spare:
            why = (
                "the fixed shape cannot be kept: wait for devices to join or plan a smaller shape"
                if fixed
                else "not even one pipeline of the run's stages can be kept: wait for devices to join"
            )
            raise PlanError(f"{len(holes)} cell(s) of the plan lost their device and no device is spare; {why}")
        p, s = holes.pop(0)
        grid[p, s] = _best_fill(cost, grid, (p, s), spare, holes)
        spare.remove(int(grid[p, s]))
        changed.append((p, s))
    if not fixed and len(spare) >= n_stages:
        for new_row in _new_pipelines(view, grid, spare):
            grid = np.vstack([grid, new_row])
            changed += [(grid.shape[0] - 1, s) for s in range(n_stages)]
            added += 1
        taken = set(grid.ravel().tolist())
        spare = [d for d in spare if d not in taken]
        cost = GridCost(view, Shape(n_stages, grid.shape[0]))
    # A short search on what changed only: a touched cell may take a better spare or trade
    # places with another touched cell; the rest of the plan stays as it was.
    search = Search(cost, grid, spare, started + time_budget_s, settings.seed)
    touched = list(dict.fromkeys(changed))
    for p, s in touched:
        if time.perf_counter() >= search.deadline:
            break
        search.improve_cell(p, s, within=set(touched))
    grid = search.grid
    layers = np.asarray(previous.layers_per_stage)
    if (layers > cost.layer_caps(grid)).any() or dropped or added:
        layers, _ = cost.split_layers(grid)
    min_avail = settings.min_availability if settings.awareness.reliability else 0.0
    servers = [
        old if old in grid[:, s] else cost.server_of(grid, s, min_avail)
        for s, old in enumerate(index.get(previous_ids[d], -1) for d in previous.parameter_servers)
    ]
    result = Plan(
        pipelines=tuple(tuple(int(d) for d in row) for row in grid),
        layers_per_stage=tuple(int(x) for x in layers),
        parameter_servers=tuple(int(x) for x in servers),
        relays=tuple(r for r in (index.get(previous_ids[d], -1) for d in previous.relays) if r >= 0),
    )
    # On the planner's own view of the network its cached blocks give the data-parallel costs.
    seen = view.latency_s is scenario.latency_s and view.bandwidth_Bps is scenario.bandwidth_Bps
    dp = np.array([cost.dp_stage(grid[:, s]) for s in range(n_stages)]) if seen and grid.shape[0] > 1 else None
    runtime = time.perf_counter() - started
    result = replace(result, meta={"runtime_s": runtime, "prediction": predict(scenario, result, dp)})
    return Repair(result, tuple(dict.fromkeys(changed)), dropped, added)


def _best_fill(
    cost: GridCost, grid: np.ndarray, cell: tuple[int, int], spare: list[int], holes: list[tuple[int, int]]
) -> int:
    """The spare that costs least in ``cell`` (other holes filled provisionally with it too, so
    the grid can be costed)."""
    p, s = cell
    best, best_value = spare[0], math.inf
    # The stages with no hole keep their data-parallel cost whatever fills the holes.
    touched = sorted({s, *(t for _, t in holes)})
    dp = np.array([0.0 if t in touched else cost.dp_stage(grid[:, t]) for t in range(grid.shape[1])])
    for d in cost.shortlist(grid, cell, spare):
        trial = grid.copy()
        trial[p, s] = d
        for q, t in holes:
            trial[q, t] = d  # provisional: only this cell's choice is being compared
        for t in touched:
            dp[t] = cost.dp_stage(trial[:, t])
        value = cost.total(trial, dp)
        if value < best_value:
            best, best_value = d, value
    return best


def _new_pipelines(view: Scenario, grid: np.ndarray, spare: list[int]) -> list[np.ndarray]:
    """Pipelines from spares while there are enough: for each stage, the spare most like the
    stage's members (the cheapest data-parallel exchange with them, at the shape with the new
    pipeline's predecessors added), in order.

    Each spare's summed latency and inverse bandwidth to each stage group is kept and grows by
    the member each new pipeline adds, instead of re-reading spares x members pairs per
    pipeline: a repair at thousands of devices may add hundreds of pipelines."""
    n_pipes, n_stages = grid.shape
    left = np.asarray(spare, dtype=int)
    free = np.ones(len(left), dtype=bool)
    lat, bw = view.latency_s, view.bandwidth_Bps
    lat_sum = [lat[np.ix_(left, grid[:, s])].sum(axis=1) for s in range(n_stages)]
    inv_sum = [(1.0 / bw[np.ix_(left, grid[:, s])]).sum(axis=1) for s in range(n_stages)]
    rows: list[np.ndarray] = []
    while free.sum() >= n_stages:
        pipes = n_pipes + len(rows)
        share = view.grad_bytes(Shape(n_stages, pipes)) / pipes
        picks = []
        for s in range(n_stages):
            if pipes > 1:
                closeness = 2.0 * (lat_sum[s] + share * inv_sum[s])
                closeness[~free] = np.inf
                k = int(np.argmin(closeness))
            else:  # one pipeline: no exchange yet, the first spare in order
                k = int(np.argmax(free))
            picks.append(k)
            free[k] = False
        row = left[picks]
        for s, d in enumerate(row):
            lat_sum[s] += lat[left, d]
            inv_sum[s] += 1.0 / bw[left, d]
        rows.append(row)
    return rows
