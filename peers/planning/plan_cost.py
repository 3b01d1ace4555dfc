"""What a plan costs: the reference yardstick of FORMAT.md and swarmd's own model of its runtime.

A plan puts ``S`` stages times ``N`` pipelines of devices on a grid (``pipelines[p][s]``), cuts
the model's layers over the stages, and names each stage's parameter server, the ``K_s``
servers of its shards, the relays, the spares, and the exchange schedule it was planned for:
``local_steps`` (H) shares of ``share_micro_batches`` (k) per round (``docs/data-path.md``).
The predicted throughput of that data path is ``swarmd.peers.planning.throughput``'s.

**Reference cost** (``reference_cost``), the yardstick every scheduler is judged by, exactly as
``scenarios/FORMAT.md`` defines it: the data-parallel cost (the worst device's exchange with
the rest of its stage group) plus the pipeline cost (per stage boundary, the slowest pair one
pipeline puts across it, summed over the boundaries, twice for forward and backward).

**swarmd's own model** (``predict``) of one iteration, broken down:

- ``compute_s``: each pipeline runs its ``M`` micro-batches through its stages, one stage after
  the other as in 1F1B (fill, then a micro-batch per slowest stage's step); a stage's time is
  its layers' forward and backward flops over the device's throughput. Pipelines run side by
  side, so the slowest one counts.
- ``pipeline_comm_s``: the reference's pipeline term. Counting whole activations per boundary
  without overlap is pessimistic for swarmd's asynchronous pipeline, and for that reason safe.
- ``sync_comm_s``: the reference's data-parallel term. It is exactly the traffic of a stage's
  parameters sharded over the ``N`` members of its group: each sends ``grad_bytes / N`` to
  every other and gets as much back (push gradients to each shard's server, pull its weights).
- ``churn_s``: expected time lost to devices leaving: a device that leaves at rate ``1/U``
  costs, when it goes, half an iteration of its pipeline's work on average plus fetching its
  stage's weights for its replacement.

The own model therefore equals the reference cost plus compute and churn: one scheduler can
minimise it and be judged fairly on the yardstick.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
from scipy.optimize import linear_sum_assignment
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import maximum_bipartite_matching

from swarmd.peers.planning.scenario import Scenario, Shape
from swarmd.peers.taskpool.exchange import MAX_LOCAL_STEPS

OPTIMIZER_BYTES_PER_PARAM = 16
"""What holding a stage costs in memory per parameter on a worker: fp32 weights and gradient
(8) and room for the stashed weight versions a backward may need (8); the AdamW state lives on
the parameter server."""
ACTIVATION_FACTOR = 34
"""Bytes of stashed activations per token, per hidden unit, per layer, in units of dtype
bytes: what a transformer block keeps for its backward (Korthikanti et al.'s 34sh + 5as^2h,
without the attention term, which micro-batches of long sequences make worse)."""


ROLES = ("cell", "shard_server", "relay", "spare")
"""What the plan gives a device: a cell of the grid, a shard of a stage's parameters, relaying,
or standing by to take a cell whose holder lapses (``Plan.roles``)."""


@dataclass(frozen=True)
class Plan:
    pipelines: tuple[tuple[int, ...], ...]
    """pipelines[p][s]: the device (its index in the scenario) that runs stage s in pipeline p."""
    layers_per_stage: tuple[int, ...]
    parameter_servers: tuple[int, ...]
    """The device that coordinates each stage's sharded parameter server: it serves shard 0,
    and stage 0's also keeps the share ledger (``docs/data-path.md``)."""
    relays: tuple[int, ...] = ()
    meta: dict[str, object] = field(default_factory=dict, compare=False)
    shard_servers: tuple[tuple[int, ...], ...] = field(default=(), kw_only=True)
    """shard_servers[s][k]: the device serving shard k of stage s's parameters (``K_s`` of them,
    ``exchange.shard_range``); shard_servers[s][0] is parameter_servers[s]. Empty: one shard per
    stage, at its parameter server."""
    local_steps: int = field(default=1, kw_only=True)
    """H: shares a pipeline trains on between two contributions (1: gradients; more: DiLoCo
    pseudo-gradients)."""
    share_micro_batches: int = field(default=0, kw_only=True)
    """k: micro-batches in one share, flush to flush. 0: not chosen by a planner, the run's
    batch split over the pipelines (``micro_batches_per_share``)."""
    spares: tuple[int, ...] = field(default=(), kw_only=True)
    """Devices outside the grid that the plan gives a role: shard servers, relays, and spares
    that take a lapsed cell (in the order they should be asked)."""

    def __post_init__(self) -> None:
        stages = len(self.layers_per_stage)
        if len(self.parameter_servers) != stages:
            raise ValueError(f"{len(self.parameter_servers)} parameter servers for {stages} stages: need one per stage")
        if not self.shard_servers:
            object.__setattr__(self, "shard_servers", tuple((ps,) for ps in self.parameter_servers))
        if len(self.shard_servers) != stages:
            raise ValueError(f"shard servers for {len(self.shard_servers)} stages, the plan has {stages}")
        for s, (servers, ps) in enumerate(zip(self.shard_servers, self.parameter_servers, strict=True)):
            if not servers or servers[0] != ps or len(set(servers)) != len(servers):
                raise ValueError(
                    f"shard_servers[{s}] = {list(servers)}: must start with the stage's parameter server {ps} "
                    "and name each device once"
                )
        if not 1 <= self.local_steps <= MAX_LOCAL_STEPS:
            raise ValueError(f"local_steps = {self.local_steps} must be in [1, {MAX_LOCAL_STEPS}]")
        if self.share_micro_batches < 0:
            raise ValueError(f"share_micro_batches = {self.share_micro_batches} must be >= 1 (or 0: from the batch)")
        placed = set(self.devices())
        if placed & set(self.spares):
            raise ValueError(f"spares {sorted(placed & set(self.spares))} also hold a cell of the grid")

    @property
    def shape(self) -> Shape:
        return Shape(len(self.pipelines[0]), len(self.pipelines))

    def grid(self) -> np.ndarray:
        return np.asarray(self.pipelines, dtype=int)

    def stage_groups(self) -> list[list[int]]:
        return [list(col) for col in zip(*self.pipelines, strict=True)]

    def devices(self) -> list[int]:
        return [d for row in self.pipelines for d in row]

    def micro_batches_per_share(self, scenario: Scenario) -> int:
        """k as the plan sets it, or (0) the run's batch over the pipelines."""
        return self.share_micro_batches or micro_batches_per_pipeline(scenario, self.shape)

    def roles(self) -> dict[int, list[str]]:
        """Every device the plan names, with what it does there (``ROLES``, in that order)."""
        out: dict[int, list[str]] = {}
        for d in self.devices():
            out.setdefault(d, []).append("cell")
        for d in dict.fromkeys(d for servers in self.shard_servers for d in servers):
            out.setdefault(d, []).append("shard_server")
        for d in self.relays:
            out.setdefault(d, []).append("relay")
        for d in self.spares:
            if d not in out:
                out[d] = ["spare"]
        return out

    def remapped(self, to: Sequence[int]) -> Plan:
        """The same plan with every device index ``d`` replaced by ``to[d]`` (between a
        scenario's indices and those of a restriction of it, as the simulator needs)."""

        def row(devices: Iterable[int]) -> tuple[int, ...]:
            return tuple(int(to[d]) for d in devices)

        return replace(
            self,
            pipelines=tuple(row(r) for r in self.pipelines),
            parameter_servers=row(self.parameter_servers),
            relays=row(self.relays),
            shard_servers=tuple(row(r) for r in self.shard_servers),
            spares=row(self.spares),
        )

    def to_json(self, scenario: Scenario) -> dict[str, object]:
        """FORMAT.md's plan fields, then the data path's (``docs/data-path.md``)."""
        ids = scenario.ids
        return {
            "pipelines": [[ids[d] for d in row] for row in self.pipelines],
            "layers_per_stage": list(self.layers_per_stage),
            "parameter_servers": [ids[d] for d in self.parameter_servers],
            "relays": [ids[d] for d in self.relays],
            "shard_servers": [[ids[d] for d in servers] for servers in self.shard_servers],
            "local_steps": self.local_steps,
            "share_micro_batches": self.micro_batches_per_share(scenario),
            "spares": [ids[d] for d in self.spares],
            "roles": {ids[d]: roles for d, roles in self.roles().items()},
        }


@dataclass(frozen=True)
class Prediction:
    iteration_s: float
    compute_s: float
    pipeline_comm_s: float
    sync_comm_s: float
    churn_s: float

    def to_json(self) -> dict[str, float]:
        return {
            "iteration_s": round(self.iteration_s, 6),
            "compute_s": round(self.compute_s, 6),
            "pipeline_comm_s": round(self.pipeline_comm_s, 6),
            "sync_comm_s": round(self.sync_comm_s, 6),
            "churn_s": round(self.churn_s, 6),
        }


# -- the pieces, over a grid of device indices ----------------------------------------------------


def dp_costs(scenario: Scenario, grid: np.ndarray) -> np.ndarray:
    """Per stage, the data-parallel cost of its group: max over members of the sum over the
    others of 2 * (latency + grad_bytes / (N * bandwidth))."""
    n_pipes, n_stages = grid.shape
    if n_pipes == 1:
        return np.zeros(n_stages)
    shape = Shape(n_stages, n_pipes)
    share = scenario.grad_bytes(shape) / n_pipes
    out = np.empty(n_stages)
    for s in range(n_stages):
        members = grid[:, s]
        sub = np.ix_(members, members)
        cost = 2.0 * (scenario.latency_s[sub] + share / scenario.bandwidth_Bps[sub])
        out[s] = cost.sum(axis=1).max()  # the diagonal is 0 + share / inf = 0
    return out


def boundary_costs(scenario: Scenario, grid: np.ndarray, act_transfer: np.ndarray | None = None) -> np.ndarray:
    """Per boundary s -> s+1, the slowest pipeline's transfer of its activations across it."""
    n_pipes, n_stages = grid.shape
    if n_stages == 1:
        return np.zeros(0)
    src, dst = grid[:, :-1], grid[:, 1:]
    if act_transfer is None:
        # The plan's pairs only (as ``transfer_s`` would give them): the whole matrix is
        # 800 MB and a second at 10,000 devices, and every repair is costed here.
        nbytes = scenario.activation_bytes(Shape(n_stages, n_pipes))
        return (scenario.latency_s[src, dst] + nbytes / scenario.bandwidth_Bps[src, dst]).max(axis=0)
    return act_transfer[src, dst].max(axis=0)


def reference_cost(scenario: Scenario, plan: Plan) -> float:
    """The yardstick of FORMAT.md: data-parallel cost + pipeline cost (see the module doc)."""
    grid = plan.grid()
    return float(dp_costs(scenario, grid).max() + 2.0 * boundary_costs(scenario, grid).sum())


def stage_flops_per_sequence(scenario: Scenario, layers: np.ndarray) -> np.ndarray:
    """Forward and backward flops per sequence of each stage (the head on the last)."""
    flops = layers * scenario.model.layer_flops_per_sequence()
    flops[-1] += scenario.model.head_flops_per_sequence()
    return flops


def micro_batches_per_pipeline(scenario: Scenario, shape: Shape) -> int:
    return max(1, math.ceil(scenario.batch_sequences / (shape.data_parallel * scenario.micro_batch)))


def compute_s(scenario: Scenario, grid: np.ndarray, layers: np.ndarray, tflops: np.ndarray | None = None) -> float:
    """The slowest pipeline's 1F1B compute time: fill plus a step of its slowest stage per
    further micro-batch."""
    n_pipes, n_stages = grid.shape
    speeds = (tflops if tflops is not None else device_tflops(scenario))[grid] * 1e12
    step = stage_flops_per_sequence(scenario, layers.astype(float))[None, :] * scenario.micro_batch / speeds
    m = micro_batches_per_pipeline(scenario, Shape(n_stages, n_pipes))
    return float((step.sum(axis=1) + (m - 1) * step.max(axis=1)).max())


def churn_s(
    scenario: Scenario, grid: np.ndarray, base_s: float, servers: np.ndarray | None = None,
    leave_rates: np.ndarray | None = None,
) -> float:  # fmt: skip
    """Expected seconds per iteration lost to departures (module doc). ``leave_rates``: each
    device's, when the caller has them at hand (the planner costs thousands of grids)."""
    if leave_rates is None:
        leave_rates = scenario.device_arrays.leave_rate_per_s
    rates = leave_rates[grid]
    if not rates.any():
        return 0.0
    n_pipes, n_stages = grid.shape
    weights = scenario.grad_bytes(Shape(n_stages, n_pipes))
    if servers is None:
        servers = grid[0]
    refetch = scenario.latency_s[servers[None, :], grid] + weights / scenario.bandwidth_Bps[servers[None, :], grid]
    return float((rates * base_s * (base_s / 2.0 + refetch)).sum())


def device_tflops(scenario: Scenario) -> np.ndarray:
    return np.array([d.tflops for d in scenario.devices], dtype=float)


def predict(scenario: Scenario, plan: Plan, stage_dp_s: np.ndarray | None = None) -> Prediction:
    """``stage_dp_s``: ``dp_costs`` of the plan's grid when the caller has them (the planner keeps
    the blocks of large stage groups; at thousands of devices they are most of the work)."""
    grid = plan.grid()
    layers = np.asarray(plan.layers_per_stage, dtype=float)
    comp = compute_s(scenario, grid, layers)
    pipe = 2.0 * float(boundary_costs(scenario, grid).sum())
    sync = float((dp_costs(scenario, grid) if stage_dp_s is None else stage_dp_s).max())
    base = comp + pipe + sync
    churn = churn_s(scenario, grid, base, np.asarray(plan.parameter_servers, dtype=int))
    return Prediction(base + churn, comp, pipe, sync, churn)


# -- memory ---------------------------------------------------------------------------------------


def layer_memory_bytes(scenario: Scenario) -> float:
    """What one layer of a stage needs on a worker: its parameters' state and its activations
    for one micro-batch."""
    m = scenario.model
    params = m.layer_params * OPTIMIZER_BYTES_PER_PARAM
    acts = ACTIVATION_FACTOR * scenario.micro_batch * m.seq_len * m.hidden * m.dtype_bytes
    return params + acts


def embedding_memory_bytes(scenario: Scenario) -> float:
    return scenario.model.embedding_params * OPTIMIZER_BYTES_PER_PARAM


def max_layers(scenario: Scenario, memory_gib: np.ndarray, first: bool, last: bool) -> np.ndarray:
    """How many layers fit on devices of ``memory_gib`` at a stage (the first and last also
    hold the embedding or the tied head)."""
    budget = memory_gib * (1 << 30)
    if first or last:
        budget = budget - embedding_memory_bytes(scenario)
    return np.floor(np.maximum(budget, 0.0) / layer_memory_bytes(scenario)).astype(int)


# -- lower bounds ---------------------------------------------------------------------------------


def compute_lower_bound_s(scenario: Scenario) -> float:
    """No plan computes an iteration faster than every device of the scenario working on it
    with no idle time and no communication."""
    total = scenario.batch_sequences * (
        scenario.model.layers * scenario.model.layer_flops_per_sequence() + scenario.model.head_flops_per_sequence()
    )
    return total / (device_tflops(scenario).sum() * 1e12)


def reference_lower_bound(scenario: Scenario, shape: Shape) -> float:
    """A bound no plan of ``shape`` can beat on the reference cost.

    Pipeline: each of the ``S - 1`` boundaries carries activations over at least one edge, no
    cheaper than the scenario's cheapest. Data parallel: when the plan must use every device,
    the group of the device whose ``N - 1`` cheapest partners are dearest costs at least that
    much; otherwise, at least the ``N - 1`` cheapest partners of the device that has them
    cheapest."""
    n = scenario.n
    act = scenario.transfer_s(scenario.activation_bytes(shape))
    off = ~np.eye(n, dtype=bool)
    pipeline = 2.0 * (shape.stages - 1) * float(act[off].min()) if shape.stages > 1 else 0.0
    if shape.data_parallel == 1:
        return pipeline
    share = scenario.grad_bytes(shape) / shape.data_parallel
    dp = 2.0 * (scenario.latency_s + share / scenario.bandwidth_Bps)
    np.fill_diagonal(dp, np.inf)
    cheapest = np.sort(dp, axis=1)[:, : shape.data_parallel - 1].sum(axis=1)
    data_parallel = float(cheapest.max() if shape.devices == n else cheapest.min())
    return pipeline + data_parallel


# -- matchings ------------------------------------------------------------------------------------


def even_layers(layers: int, stages: int) -> tuple[int, ...]:
    """``layers`` cut into ``stages`` near-equal counts (the first ones take the remainder)."""
    base, extra = divmod(layers, stages)
    return tuple(base + (1 if s < extra else 0) for s in range(stages))


def bottleneck_matching(cost: np.ndarray) -> tuple[np.ndarray, float]:
    """A perfect matching of rows to columns whose dearest pair is as cheap as possible, and
    among those, the cheapest in sum. Returns ``cols`` (row i goes to ``cols[i]``) and the
    bottleneck. Binary search over the distinct costs, each tested with an assignment."""
    values = np.unique(cost)

    def feasible(k: int) -> bool:
        # Whether the pairs within values[k] hold a matching of every row (or column): a
        # maximum matching on those pairs (Hopcroft-Karp), many times cheaper at thousands of
        # pipelines than an assignment over the whole matrix, and the same answer.
        matched = maximum_bipartite_matching(csr_matrix(cost <= values[k]), perm_type="column")
        return int((matched >= 0).sum()) == min(cost.shape)

    # No matching beats the dearest of the rows' and columns' cheapest pairs; the answer is
    # usually close above it: gallop up from there, then bisect.
    floor = max(cost.min(axis=1).max(), cost.min(axis=0).max())
    lo = int(np.searchsorted(values, floor))
    step, hi = 1, lo
    while not feasible(hi):
        lo = hi + 1
        hi = min(len(values) - 1, hi + step)
        step *= 2
    while lo < hi:
        mid = (lo + hi) // 2
        if feasible(mid):
            hi = mid
        else:
            lo = mid + 1
    limit = values[lo]
    capped = np.where(cost > limit, np.inf, cost)
    capped = np.where(np.isinf(capped), cost.max() * cost.shape[0] * 4 + 1.0, capped)
    rows, cols = linear_sum_assignment(capped)
    return cols, float(limit)
