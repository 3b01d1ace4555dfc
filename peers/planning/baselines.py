"""Baseline schedulers that swarmd's planner is measured against, on the reference cost of FORMAT.md.

Each is a reimplementation from its publication's description, takes a ``Scenario`` and a
``Shape`` (``S`` stages times ``N`` pipelines) and returns a ``Plan`` of exactly that shape that
uses each device at most once, the layers cut evenly, the first member of each stage group as
its parameter server and no relays. The publications place work on swarms whose shape they
choose and change freely; the yardstick compares plans of one fixed grid, so each is adapted to
fill that grid, as said below. Randomised ones take a ``seed`` and are deterministic given it.

- ``random_best``: the sanity baseline. Draws random placements and keeps the cheapest on the
  reference cost. A scheduler that does not beat it has learned nothing about the network.
- ``petals_greedy``: Petals (Borzunov et al., "Petals: Collaborative Inference and Fine-tuning
  of Large Models", ACL 2023 demo; "Distributed Inference and Fine-tuning of Large Language
  Models Over The Internet", NeurIPS 2023). A joining server takes the blocks whose swarm
  throughput is lowest. Adapted: a span of blocks becomes a stage, a server's measured
  throughput becomes its ``tflops`` (network-oblivious), and a stage takes only ``N`` servers,
  so a full stage is skipped. Servers join fastest first, which is the order that balances best,
  and when the grid has fewer slots than devices the slowest are the ones left out.
- ``dtfm_evolutionary``: DT-FM (Yuan et al., "Decentralized Training of Foundation Models in
  Heterogeneous Environments", NeurIPS 2022). Devices are partitioned into ``S`` balanced
  data-parallel groups by a hybrid genetic algorithm (crossover, swap mutation, local search on
  the best). A partition is scored on the coarsened graph: the edge between two groups costs
  the bottleneck matching of their activation transfers, the stage order is the cheapest open
  path through the groups (an open-loop TSP). Adapted: the score is the reference cost instead
  of the paper's cost model (its compute term is equal for every partition of a fixed grid),
  and the path is solved exactly over subsets when ``S <= 10``.
- ``swarm_wiring``: SWARM parallelism (Ryabinin et al., "SWARM Parallelism: Training Large Models
  Can Be Surprisingly Communication-Efficient", ICML 2023). Peers join the stage of lowest
  throughput and rebalance by moving to the bottleneck stage; each peer sends its activations
  to a peer of the next stage drawn in proportion to that peer's throughput as the sender sees
  it. Adapted: SWARM routes every micro-batch afresh; a grid has fixed pipelines, so one draw of
  that routing is frozen as a matching per stage boundary (senders draw in turn, without
  replacement). Stage sizes are fixed, so a rebalancing move becomes a swap. Peers arrive in
  random order (the seed), the fastest ``S * N`` of them.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from scipy.optimize import linear_sum_assignment

from swarmd.peers.planning.open_path import best_stage_order
from swarmd.peers.planning.plan_cost import (
    Plan,
    bottleneck_matching,
    device_tflops,
    even_layers,
    micro_batches_per_pipeline,
    stage_flops_per_sequence,
)
from swarmd.peers.planning.scenario import Scenario, Shape

RANDOM_CHUNK = 256
"""Placements ``random_best`` draws and scores at once. Every chunk is drawn whole and cut, so
the first ``k`` placements are the same whatever the number of samples."""
DTFM_ELITE = 4
"""How many of the best partitions get a local search each generation."""
DTFM_LOCAL_TRIES = 40
"""Random swaps tried on each of them, each improving one kept. On volunteers-48, spending more
of the 5000 evaluations on local search (4 x 40 against 2 x 10 per generation) found plans
about 8% cheaper, averaged over three seeds."""
DTFM_MUTATION = 0.5
"""Chance that a child of crossover also gets a swap."""


# -- shared pieces ----------------------------------------------------------------------------------


def _check_shape(scenario: Scenario, shape: Shape) -> None:
    if shape.stages < 1 or shape.data_parallel < 1:
        raise ValueError(f"shape {shape.stages} x {shape.data_parallel}: both must be at least 1")
    if shape.devices > scenario.n:
        raise ValueError(
            f"shape {shape.stages} x {shape.data_parallel} needs {shape.devices} devices; the scenario has {scenario.n}"
        )
    if shape.stages > scenario.model.layers:
        raise ValueError(f"{shape.stages} stages for {scenario.model.layers} layers: at most one stage per layer")


def _plan(scenario: Scenario, grid: np.ndarray, **meta: object) -> Plan:
    return Plan(
        pipelines=tuple(tuple(int(d) for d in row) for row in grid),
        layers_per_stage=even_layers(scenario.model.layers, grid.shape[1]),
        parameter_servers=tuple(int(d) for d in grid[0]),
        relays=(),
        meta=dict(meta),
    )


def _sync_matrix(scenario: Scenario, shape: Shape) -> np.ndarray:
    """What device i adds to its data-parallel cost for each other member j of its group."""
    share = scenario.grad_bytes(shape) / shape.data_parallel
    out = 2.0 * (scenario.latency_s + share / scenario.bandwidth_Bps)
    np.fill_diagonal(out, 0.0)
    return out


def _activation_matrix(scenario: Scenario, shape: Shape) -> np.ndarray:
    return scenario.transfer_s(scenario.activation_bytes(shape))


def _grid_costs(sync: np.ndarray, act: np.ndarray, grids: np.ndarray) -> np.ndarray:
    """The reference cost of a batch of grids ``(B, N, S)`` at once."""
    groups = grids.transpose(0, 2, 1)  # (B, S, N)
    dp = sync[groups[..., :, None], groups[..., None, :]].sum(axis=-1).max(axis=(1, 2))
    pipe = act[grids[:, :, :-1], grids[:, :, 1:]].max(axis=1).sum(axis=1)
    return dp + 2.0 * pipe


def _fill_slowest(tflops: np.ndarray, arrivals: np.ndarray, shape: Shape, layers: tuple[int, ...]) -> list[list[int]]:
    """Each arriving device joins the stage of lowest throughput (tflops per layer) that still
    has room; a stage's members in arrival order."""
    per_layer = np.asarray(layers, dtype=float)
    members: list[list[int]] = [[] for _ in range(shape.stages)]
    total = np.zeros(shape.stages)
    for d in arrivals:
        room = np.array([len(m) < shape.data_parallel for m in members])
        s = int(np.argmin(np.where(room, total / per_layer, np.inf)))
        members[s].append(int(d))
        total[s] += tflops[d]
    return members


def _fastest(scenario: Scenario, count: int) -> np.ndarray:
    """The ``count`` fastest devices, fastest first (ties by index)."""
    return np.argsort(-device_tflops(scenario), kind="stable")[:count]


# -- random -----------------------------------------------------------------------------------------


def random_best(scenario: Scenario, shape: Shape, *, samples: int = 2000, seed: int = 0) -> Plan:
    """The cheapest on the reference cost of ``samples`` uniformly random placements."""
    _check_shape(scenario, shape)
    if samples < 1:
        raise ValueError(f"samples = {samples}: must be at least 1")
    rng = np.random.default_rng(seed)
    sync, act = _sync_matrix(scenario, shape), _activation_matrix(scenario, shape)
    best_cost, best_grid = np.inf, np.empty(0)
    for start in range(0, samples, RANDOM_CHUNK):
        perms = np.argsort(rng.random((RANDOM_CHUNK, scenario.n)), axis=1)[: samples - start]
        grids = perms[:, : shape.devices].reshape(-1, shape.data_parallel, shape.stages)
        costs = _grid_costs(sync, act, grids)
        k = int(np.argmin(costs))
        if costs[k] < best_cost:  # strictly: an earlier placement wins ties, so more samples never lose
            best_cost, best_grid = float(costs[k]), grids[k]
    return _plan(scenario, best_grid, candidates=samples)


# -- Petals -----------------------------------------------------------------------------------------


def petals_greedy(scenario: Scenario, shape: Shape) -> Plan:
    """Servers join fastest first, each taking the stage of lowest throughput with room; pipeline
    ``p`` runs through the ``p``-th member to join each stage."""
    _check_shape(scenario, shape)
    layers = even_layers(scenario.model.layers, shape.stages)
    members = _fill_slowest(device_tflops(scenario), _fastest(scenario, shape.devices), shape, layers)
    return _plan(scenario, np.array(members).T)


# -- DT-FM ------------------------------------------------------------------------------------------

Groups = tuple[tuple[int, ...], ...]


class _CoarseGraph:
    """DT-FM's coarsened graph: one node per data-parallel group. Costs are cached per partition
    (the population holds repeats) and per ordered pair of groups (a child keeps some of its
    parents' groups, and an exact bottleneck costs a dozen assignments)."""

    def __init__(self, scenario: Scenario, shape: Shape) -> None:
        self.sync = _sync_matrix(scenario, shape)
        self.act = _activation_matrix(scenario, shape)
        self._edge: dict[tuple[tuple[int, ...], tuple[int, ...]], float] = {}
        self._cost: dict[Groups, float] = {}

    def edges(self, groups: Groups) -> np.ndarray:
        """``edges[i, j]``: the bottleneck matching cost of activations from group i to group j."""
        members = np.array(groups)
        blocks = self.act[members[:, None, :, None], members[None, :, None, :]]
        # a lower bound on every block's bottleneck, found for all pairs at once
        floor = np.maximum(blocks.min(axis=3).max(axis=2), blocks.min(axis=2).max(axis=2))
        out = np.zeros(floor.shape)
        for i, src in enumerate(groups):
            for j, dst in enumerate(groups):
                if i == j:
                    continue
                value = self._edge.get((src, dst))
                if value is None:
                    value = self._edge[(src, dst)] = _bottleneck(blocks[i, j], floor[i, j])
                out[i, j] = value
        return out

    def cost(self, groups: Groups) -> float:
        """Reference cost of the best plan with these groups (``groups`` in canonical order)."""
        cost = self._cost.get(groups)
        if cost is None:
            members = np.array(groups)
            sync = float(self.sync[members[:, :, None], members[:, None, :]].sum(axis=2).max())
            _, path = best_stage_order(self.edges(groups))
            cost = self._cost[groups] = sync + 2.0 * path
        return cost


def _bottleneck(cost: np.ndarray, floor: float) -> float:
    """The bottleneck value of ``bottleneck_matching``, faster: it is never below ``floor``, the
    dearest of the rows' and columns' cheapest entries, and most often equal to it (then one
    assignment shows it)."""
    over = (cost > floor).astype(float)
    rows, cols = linear_sum_assignment(over)
    if over[rows, cols].sum() == 0:
        return float(floor)
    return bottleneck_matching(cost)[1]


def _groups(labels: np.ndarray, stages: int) -> Groups:
    """The partition of a genome (label ``g < stages``: in group g; ``stages``: unused), in a
    canonical order so that equal partitions share one cache entry."""
    members = np.argsort(labels, kind="stable")[: np.count_nonzero(labels < stages)].reshape(stages, -1)
    members = members[np.argsort(members[:, 0])]  # groups are disjoint: their first members order them
    return tuple(tuple(row) for row in members.tolist())


def _random_genome(n: int, shape: Shape, rng: np.random.Generator) -> np.ndarray:
    labels = np.full(n, shape.stages)
    labels[rng.permutation(n)[: shape.devices]] = np.repeat(np.arange(shape.stages), shape.data_parallel)
    return labels


def _swap(labels: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Mutation: two devices of different groups (or a member and an unused device) trade places."""
    i = int(rng.integers(len(labels)))
    others = np.flatnonzero(labels != labels[i])
    out = labels.copy()
    if len(others):
        j = int(rng.choice(others))
        out[i], out[j] = labels[j], labels[i]
    return out


def _crossover(a: np.ndarray, b: np.ndarray, shape: Shape, rng: np.random.Generator) -> np.ndarray:
    """Crossover for balanced partitions, normalised as in Bui and Moon's genetic graph
    partitioning: relabel ``b``'s groups to the groups of ``a`` they share most devices with
    (labels mean nothing across genomes), take each device's label from either parent at random,
    then repair: groups over size give random members up, groups under size take random unused
    devices. Copying whole groups instead would make the child of two bisections a parent."""
    stages, width = shape.stages, shape.data_parallel
    overlap = np.zeros((stages + 1, stages + 1))
    np.add.at(overlap, (a, b), 1.0)
    rows, cols = linear_sum_assignment(-overlap[:stages, :stages])
    relabel = np.full(stages + 1, stages)
    relabel[cols] = rows
    child = np.where(rng.random(len(a)) < 0.5, a, relabel[b])
    for g in range(stages):
        members = np.flatnonzero(child == g)
        if len(members) > width:
            child[rng.choice(members, size=len(members) - width, replace=False)] = stages
    for g in range(stages):
        short = width - int((child == g).sum())
        if short:
            child[rng.choice(np.flatnonzero(child == stages), size=short, replace=False)] = g
    return child


def _tournament(costs: list[float], rng: np.random.Generator) -> int:
    i, j = rng.integers(len(costs), size=2)
    return int(i if costs[i] <= costs[j] else j)


def dtfm_evolutionary(
    scenario: Scenario, shape: Shape, *, population: int = 100, candidates: int = 5000, seed: int = 0
) -> Plan:
    """DT-FM's hybrid genetic search over balanced partitions into data-parallel groups, the
    stage order and the pipelines from the coarsened graph (module doc).

    Its moves are swaps, and the data-parallel cost is a group's worst member, so it can stall
    where every single swap is uphill: two regions of six split into two groups of six, each
    group three and three, gets dearer with each swap towards one group per region (the device
    left alone in the other region pays for five far partners) before it gets cheaper."""
    _check_shape(scenario, shape)
    if population < 2 or candidates < 1:
        raise ValueError(f"population = {population}, candidates = {candidates}: need at least 2 and 1")
    rng = np.random.default_rng(seed)
    graph = _CoarseGraph(scenario, shape)
    size = min(population, candidates)
    pool = [_random_genome(scenario.n, shape, rng) for _ in range(size)]
    costs = [graph.cost(_groups(g, shape.stages)) for g in pool]
    evaluated = size
    while evaluated < candidates:
        children: list[np.ndarray] = []
        for _ in range(min(size // 2 + 1, candidates - evaluated)):
            child = _crossover(pool[_tournament(costs, rng)], pool[_tournament(costs, rng)], shape, rng)
            children.append(_swap(child, rng) if rng.random() < DTFM_MUTATION else child)
        evaluated += len(children)
        child_costs = [graph.cost(_groups(c, shape.stages)) for c in children]
        for i in np.argsort(costs, kind="stable")[:DTFM_ELITE]:
            tries = min(DTFM_LOCAL_TRIES, candidates - evaluated)
            evaluated += tries
            better, cost = _local_search(graph, pool[i], costs[i], shape, rng, tries)
            if cost < costs[i]:
                children.append(better)
                child_costs.append(cost)
        pool, costs = _survivors(pool + children, costs + child_costs, size, shape)
    best = _groups(pool[int(np.argmin(costs))], shape.stages)
    return _plan(scenario, _pipelines(graph, best), candidates=evaluated)


def _local_search(
    graph: _CoarseGraph, labels: np.ndarray, cost: float, shape: Shape, rng: np.random.Generator, tries: int
) -> tuple[np.ndarray, float]:
    """Random swaps, each kept when it lowers the cost."""
    for _ in range(tries):
        candidate = _swap(labels, rng)
        c = graph.cost(_groups(candidate, shape.stages))
        if c < cost:
            labels, cost = candidate, c
    return labels, cost


def _survivors(
    pool: list[np.ndarray], costs: list[float], size: int, shape: Shape
) -> tuple[list[np.ndarray], list[float]]:
    """The ``size`` cheapest distinct partitions: duplicates would crowd the population out."""
    seen: set[Groups] = set()
    keep: list[int] = []
    for i in np.argsort(costs, kind="stable"):
        key = _groups(pool[i], shape.stages)
        if key not in seen:
            seen.add(key)
            keep.append(int(i))
        if len(keep) == size:
            break
    return [pool[i] for i in keep], [costs[i] for i in keep]


def _pipelines(graph: _CoarseGraph, groups: Groups) -> np.ndarray:
    """The grid of a partition: groups in path order, pipelines threaded through the bottleneck
    matchings between consecutive groups (each a bijection, so they compose)."""
    order, _ = best_stage_order(graph.edges(groups))
    width = len(groups[0])
    grid = np.empty((width, len(order)), dtype=int)
    position = np.arange(width)
    grid[:, 0] = np.asarray(groups[order[0]])[position]
    for k in range(1, len(order)):
        src, dst = groups[order[k - 1]], groups[order[k]]
        cols, _ = bottleneck_matching(graph.act[np.ix_(src, dst)])
        position = cols[position]
        grid[:, k] = np.asarray(dst)[position]
    return grid


# -- SWARM ------------------------------------------------------------------------------------------


def swarm_wiring(scenario: Scenario, shape: Shape, *, seed: int = 0) -> Plan:
    """Throughput-balanced stages, then one draw of SWARM's stochastic wiring per boundary."""
    _check_shape(scenario, shape)
    rng = np.random.default_rng(seed)
    tflops = device_tflops(scenario)
    layers = even_layers(scenario.model.layers, shape.stages)
    members = _fill_slowest(tflops, rng.permutation(_fastest(scenario, shape.devices)), shape, layers)
    _rebalance(members, tflops, layers)
    return _plan(scenario, _wire(scenario, shape, members, layers, rng))


def _rebalance(members: list[list[int]], tflops: np.ndarray, layers: tuple[int, ...]) -> None:
    """SWARM's migration to the bottleneck stage, as swaps: while a swap between the stages of
    highest and lowest throughput raises the lower of the two, make the best such swap."""
    per_layer = np.asarray(layers, dtype=float)
    # every swap raises the sorted throughputs lexicographically, so this ends; the cap is a guard
    for _ in range(sum(len(m) for m in members) ** 2):
        total = np.array([tflops[m].sum() for m in members])
        rate = total / per_layer
        hi, lo = int(np.argmax(rate)), int(np.argmin(rate))
        out, into = tflops[members[hi]][:, None], tflops[members[lo]][None, :]
        lifted = np.minimum((total[hi] - out + into) / per_layer[hi], (total[lo] - into + out) / per_layer[lo])
        a, b = np.unravel_index(int(np.argmax(lifted)), lifted.shape)
        if lifted[a, b] <= rate[lo] * (1 + 1e-12):
            return
        members[hi][a], members[lo][b] = members[lo][b], members[hi][a]


def _wire(
    scenario: Scenario, shape: Shape, members: list[list[int]], layers: tuple[int, ...], rng: np.random.Generator
) -> np.ndarray:
    """Pipelines threaded stage by stage: each sender of stage s draws its peer of stage s+1 with
    weight 1 / (its micro-batch compute + the micro-batch's activations over that link)."""
    per_micro = scenario.activation_bytes(shape) / micro_batches_per_pipeline(scenario, shape)
    transfer = scenario.transfer_s(per_micro)
    flops = stage_flops_per_sequence(scenario, np.asarray(layers, dtype=float)) * scenario.micro_batch
    tflops = device_tflops(scenario)
    grid = np.empty((shape.data_parallel, shape.stages), dtype=int)
    grid[:, 0] = members[0]
    for s in range(1, shape.stages):
        receivers = np.asarray(members[s])
        compute = flops[s] / (tflops[receivers] * 1e12)
        weights = 1.0 / (compute[None, :] + transfer[np.ix_(grid[:, s - 1], receivers)])
        grid[:, s] = receivers[draw_matching(weights, rng)]
    return grid


def draw_matching(weights: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A random perfect matching: row by row, each row draws a column not yet taken with
    probability proportional to its weight. Returns ``cols`` (row i goes to ``cols[i]``)."""
    free = np.ones(weights.shape[1], dtype=bool)
    cols = np.empty(weights.shape[0], dtype=int)
    for i, row in enumerate(weights):
        w = np.where(free, row, 0.0)
        cols[i] = int(rng.choice(len(w), p=w / w.sum()))
        free[cols[i]] = False
    return cols


BASELINES: dict[str, Callable[[Scenario, Shape], Plan]] = {
    "random": random_best,
    "petals-greedy": petals_greedy,
    "dtfm-evolutionary": dtfm_evolutionary,
    "swarm-wiring": swarm_wiring,
}
"""The baselines by name, with their default settings."""
