"""The plan, what holding a cell of it costs in memory, and the reference yardstick of FORMAT.md.

A plan puts ``S`` stages times ``N`` pipelines of devices on a grid (``pipelines[p][s]``), cuts
the model's layers over the stages, and names each stage's parameter server, the ``K_s``
servers of its shards, the relays, the spares, and the exchange schedule it was planned for:
``local_steps`` (H) shares of ``share_micro_batches`` (k) per round (``docs/data-path.md``).
What such a plan is predicted to train per second is ``swarmd.peers.planning.throughput``'s.

**Memory** (``cell_max_layers``): a cell's peak as ``swarmd.models.cell_memory`` predicts it
(its stage's fp32 weights, gradients, global copy and round sum, or with H > 1 local steps the
round's base and AdamW's moments; the activations of the micro-batches its stage has in flight
under 1F1B, in the scenario's precision; the last stage's logits), for the scenario's model read
as a Llama block (``scenario_block``), plus what the data path keeps beside it. Where a stage's
activations would not fit a member but would with activation checkpointing, the plan marks the
stage checkpointed (``Plan.checkpointing``) and its backward pays one more forward
(``recompute_flops_per_sequence``).

**Reference cost** (``reference_cost``), the yardstick every scheduler is judged by, exactly as
``scenarios/FORMAT.md`` defines it: the data-parallel cost (the worst device's exchange with
the rest of its stage group) plus the pipeline cost (per stage boundary, the slowest pair one
pipeline puts across it, summed over the boundaries, twice for forward and backward). It
prices one synchronous iteration, which is no longer what swarmd runs: it stays as the ruler
on which ``tests/benchmarks/bench_scheduler.py`` compares placements with the baselines.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
from scipy.optimize import linear_sum_assignment
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import maximum_bipartite_matching

from swarmd.models.cell_memory import BlockShape, CellLoad, phase_lines, stage_params
from swarmd.peers.planning.scenario import ModelSpec, Scenario, Shape
from swarmd.peers.taskpool.exchange import MAX_LOCAL_STEPS

DATA_PATH_BYTES_PER_PARAM = 8
"""What a cell's data path keeps per parameter beside ``CellCompute``'s tensors: its last
contribution until committed (4: it is resent to a standby that takes a shard over) and the
int8 codec's error-feedback residual (4)."""
RECOMPUTE_SHARE = 1.0 / 3.0
"""What a checkpointed layer's backward adds: its forward again, a third of its flops."""


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
    reduce_groups: tuple[int, ...] = field(default=(), kw_only=True)
    """G per stage: its pipelines reduce their contributions in groups of G consecutive ones
    before the servers (``swarmd.peers.taskpool.reduction``); empty or 1: no reduction."""
    checkpointing: tuple[bool, ...] = field(default=(), kw_only=True)
    """Per stage: whether its cells checkpoint activations (keep each layer's input, recompute
    the rest in the backward), chosen where the activations in flight would not fit a member
    otherwise (``checkpointed_stages``). Empty: none does."""

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
        if self.checkpointing and len(self.checkpointing) != stages:
            raise ValueError(f"checkpointing names {len(self.checkpointing)} stages, the plan has {stages}")
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

    def checkpointed(self, stage: int) -> bool:
        """Whether stage ``stage``'s cells run with activation checkpointing."""
        return stage < len(self.checkpointing) and bool(self.checkpointing[stage])

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

    def remapped(self, to: Sequence[int] | Mapping[int, int]) -> Plan:
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
            "reduce_groups": list(self.reduce_groups),
            "checkpointing": [self.checkpointed(s) for s in range(len(self.layers_per_stage))],
            "roles": {ids[d]: roles for d, roles in self.roles().items()},
        }


# -- the reference yardstick, over a grid of device indices ----------------------------------------


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


def device_tflops(scenario: Scenario) -> np.ndarray:
    """Each device's speed as the plan is priced at: achieved where measured, else rated
    (``Device.speed_tflops``)."""
    return scenario.device_arrays.tflops.copy()  # the cached array stays as it is


# -- a stage's size and a cell's memory --------------------------------------------------------------


def stage_parameters(scenario: Scenario, layers_per_stage: Sequence[int]) -> list[int]:
    """Each stage's parameter count: its layers', the embedding on the first stage and the
    output head on the last (its own copy when the stages are more than one)."""
    m = scenario.model
    stages = len(layers_per_stage)
    out = []
    for s, layers in enumerate(layers_per_stage):
        params = layers * m.layer_params
        if s == 0:
            params += m.embedding_params
        if s == stages - 1 and stages > 1:
            params += m.embedding_params
        out.append(max(1, int(round(params))))
    return out


def recompute_flops_per_sequence(
    scenario: Scenario, layers: Sequence[int] | np.ndarray, checkpointing: Sequence[bool] = ()
) -> np.ndarray:
    """What each stage's backward adds per sequence under activation checkpointing: its layers'
    forward again (``RECOMPUTE_SHARE`` of their flops; the head is not checkpointed)."""
    again = np.zeros(len(layers))
    for s, on in enumerate(checkpointing):
        if on:
            again[s] = RECOMPUTE_SHARE * float(layers[s]) * scenario.model.layer_flops_per_sequence()
    return again


def scenario_block(model: ModelSpec) -> BlockShape:
    """The block a scenario's model stands for in the cell memory model: a Llama block of its
    hidden width (heads of 64, no grouped queries), whose MLP takes the parameters a layer has
    beyond attention's ``4 h^2`` (``models.cell_memory``)."""
    h = model.hidden
    layer = int(round(model.layer_params))
    return BlockShape(
        family="llama",
        hidden=h,
        intermediate=max(1, (layer - 4 * h * h) // (3 * h)),
        heads=max(1, h // 64),
        kv_heads=max(1, h // 64),
        vocab=model.vocab,
        layer_params=layer,
        first_params=int(model.embedding_params),
        last_params=int(model.embedding_params) + h,
    )


def precision_of(model: ModelSpec) -> str:
    """The cells' precision for the scenario's ``dtype_bytes``: 2 is bf16 autocast, else fp32."""
    return "bf16" if model.dtype_bytes == 2 else "fp32"


def activation_memory_bytes(scenario: Scenario, layers: int) -> float:
    """One micro-batch's activations kept through ``layers`` blocks for the backward (bf16
    autocast's weight copies included), without checkpointing."""
    block = scenario_block(scenario.model)
    tokens = scenario.micro_batch * scenario.model.seq_len
    precision = precision_of(scenario.model)
    copies = 2 * block.layer_matmul_params() if precision == "bf16" else 0
    return layers * (block.layer_bytes_per_token(precision) * tokens + copies)


def in_flight(stage: int, stages: int) -> int:
    """Micro-batches whose activations stage ``stage`` keeps at once under 1F1B: one per stage
    still to run the micro-batch's forward and backward, its own included."""
    return stages - stage


def cell_load(scenario: Scenario, stage: int, stages: int, local_steps: int, checkpointing: bool = False) -> CellLoad:
    """How a cell of stage ``stage`` of ``stages`` runs (``models.cell_memory.CellLoad``)."""
    return CellLoad(
        first=stage == 0,
        last=stage == stages - 1,
        micro_batch=scenario.micro_batch,
        seq_len=scenario.model.seq_len,
        in_flight=in_flight(stage, stages),
        precision=precision_of(scenario.model),
        checkpointing=checkpointing,
        mode="gradient" if local_steps == 1 else "local",
    )


def cell_max_layers(
    scenario: Scenario,
    memory_gib: np.ndarray,
    stage: int,
    stages: int,
    local_steps: int,
    checkpointing: bool = False,
) -> np.ndarray:
    """How many layers of stage ``stage`` of ``stages`` fit on devices of ``memory_gib``: the
    cell's peak (``models.cell_memory``) and what its data path keeps beside it
    (``DATA_PATH_BYTES_PER_PARAM``) within the device's memory."""
    block = scenario_block(scenario.model)
    load = cell_load(scenario, stage, stages, local_steps, checkpointing)
    budget = np.asarray(memory_gib, dtype=float) * (1 << 30)
    edges = stage_params(block, 0, load)
    most = np.full(budget.shape, np.inf)
    for fixed, per_layer in phase_lines(block, load).values():
        fixed += DATA_PATH_BYTES_PER_PARAM * edges
        per_layer += DATA_PATH_BYTES_PER_PARAM * block.layer_params
        most = np.minimum(most, (budget - fixed) / per_layer)
    return np.floor(np.maximum(most, 0.0)).astype(int)


def cell_layer_caps(
    scenario: Scenario, memory_gib: np.ndarray, stages: int, local_steps: int, *, checkpointing: bool = True
) -> np.ndarray:
    """caps[d, s]: the layers device ``d`` can hold at stage ``s`` of ``stages``, with
    activation checkpointing where that fits more (``checkpointing``: allowed)."""
    out = []
    for s in range(stages):
        caps = cell_max_layers(scenario, memory_gib, s, stages, local_steps)
        if checkpointing:
            caps = np.maximum(caps, cell_max_layers(scenario, memory_gib, s, stages, local_steps, True))
        out.append(caps)
    return np.stack(out, axis=-1)


def checkpointed_stages(plain_caps: np.ndarray, grid: np.ndarray, layers: Sequence[int]) -> tuple[bool, ...]:
    """Which stages of ``grid`` with ``layers`` need checkpointing: those with a member whose
    memory holds fewer of the stage's layers without it (``plain_caps``: ``cell_layer_caps``
    with ``checkpointing=False``). Empty when none does."""
    stage_caps = plain_caps[grid, np.arange(grid.shape[1])[None, :]].min(axis=0)
    flags = tuple(bool(n > cap) for n, cap in zip(layers, stage_caps, strict=True))
    return flags if any(flags) else ()


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
