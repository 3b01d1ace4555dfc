"""What a plan trains per second on the data path of ``docs/data-path.md``, broken down.

The model prices exactly what the daemon does and the simulator replays, with the same pure
functions (``swarmd.peers.taskpool.exchange``, ``swarmd.peers.wire.sizes``):

- **A share** of pipeline ``p``: ``exchange.share_seconds`` over its stages' forward and
  backward times (a third and two thirds of the stage's flops per micro-batch over the
  device's TFLOPS: a cell keeps its activations) and its boundaries' times for one activation
  (latency plus the message's bytes, in the codec ``sizes.codec_for`` gives the link, over its
  bandwidth; the slower direction, since the gradient comes back the same way).
- **A round** is H shares, then one contribution from every cell to each of its stage's
  ``K_s`` shards, while the cell pulls the deltas the shards stepped since its version. The
  exchange of a cell takes the longest of: any one shard's link each way (latency plus that
  shard's bytes over the link), and everything it sends or receives in a round (the
  contributions, the pulls and its activations) through its interface (a device's up and down
  rates are its fastest link's, ``scenario.interface_rates``). A pull brings a delta in fp16 per
  step (the whole slice in fp32 past ``keep_versions`` steps behind); the steps per round follow
  from the swarm's rate: a shard steps every ``exchange.step_micro_batches`` weighted
  micro-batches.
- **Overlap**: with H > 1 a cell computes its next round while its contribution is in flight,
  at most one outstanding, so a round takes ``max(H x share, exchange)``. With H = 1 the
  rounds are synchronous (a cell waits for the step its contribution went into, the daemon's
  ``SYNC_WAIT_S``): a round takes ``share + exchange`` (its contribution is as stale as the steps
  the other pipelines' contributions make meanwhile, none when the batch is one round of all),
  and the exchange is the contributions' time, then the pulls': each at least its shard
  server's burst (every cell's slice in, then every delta out) and, in a reduction group, a hop
  more through the heads (``transfers.exchange``, ``sequential``).
- **Staleness**: a contribution is as many versions behind as the shards step between the
  version the cell last applied (it applies deltas between shares) and the contribution's
  arrival, about one share and one exchange; it counts ``exchange.staleness_weight`` of it
  (interpolated between whole versions) towards the servers' next step
  (``step_micro_batches``). Trained tokens are the micro-batches the servers apply, as the
  servers and the simulator count them (``trained_tokens``): in gradient mode a gradient
  counts in full or, past ``max_staleness``, not at all; in local mode a late round is
  trained, and what its lateness costs is ``learning.token_efficiency``'s to price (counting
  it again as fewer tokens priced it twice and had the planner prefer more replicas of
  shorter rounds).
- **Servers**: every device's interface carries its cells' traffic and, for each shard it
  serves, every cell's contribution in and every pull out. Where the busiest interface is
  over its rate at the pipelines' pace, the swarm trains that much slower: a shard that cannot
  take its contributions holds up every pipeline (a cell waits with one outstanding).
- **Churn** (departure rates from ``mean_uptime_h``, as the old ``churn_s``): a cell that leaves
  costs its pipeline, on average, half a round of work and the time until a spare holds the
  cell (noticed after ``NOTICE_S``, then the whole slice fetched in fp32); a server that leaves
  stalls every pipeline for what its standby's take-over (after ``NOTICE_S``) exceeds a round.

Tokens per second is the sum over pipelines of weighted round tokens over round time, capped
by the servers, less the churn. The breakdown (``Throughput``) attributes the seconds one
server step takes: compute (the pipelines' slowest stage busy all the time), pipeline (fill,
drain and activations), exchange (rounds that the exchange, the servers or staleness make
longer or count less) and churn.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from swarmd.peers.planning.learning import token_efficiency
from swarmd.peers.planning.plan_cost import Plan, device_tflops
from swarmd.peers.planning.scenario import Scenario
from swarmd.peers.planning.transfers import (
    CellLinks,
    Exchange,
    Links,
    PipelineTimes,
    StageShards,
    cell_links,
    exchange,
    pipeline_times,
    stage_shards,
)
from swarmd.peers.taskpool.exchange import (
    ExchangeConfig,
    fill_fraction,
    staleness_weight,
    step_micro_batches,
    trained_tokens,
)

NOTICE_S = 60.0
"""How long a departure goes unnoticed: a heartbeat's TTL, the simulator's ``detect_s``."""
FIXED_POINT_ROUNDS = 12
"""The swarm's step rate, the deltas per round and the staleness weights depend on one another:
the step rate the pipelines make at an assumed rate falls as the assumed rate rises (staler
contributions, more deltas per round), so the rate they settle at is the one root of a
decreasing function, bracketed between 0 and the rate at 0 and found by regula falsi (Illinois)
in at most this many evaluations ..."""
SETTLED = 1e-3
"""... or as soon as it is within this fraction of the rate it gives."""


@dataclass(frozen=True)
class Throughput:
    """Predicted trained tokens per second of one plan, and where the time goes."""

    tokens_per_s: float
    compute_tokens_per_s: float
    """Every pipeline's slowest stage busy all the time: no fill, no transfers, no exchange."""
    pipeline_tokens_per_s: float
    """With each share's fill, drain and activation transfers (rounds of H shares)."""
    exchange_tokens_per_s: float
    """With rounds of ``max(H x share, exchange)``, the servers' cap and what staleness drops."""
    step_tokens: float
    """Trained tokens one server step counts (``step_micro_batches`` micro-batches)."""
    share_s: float
    """The median pipeline's figures (each pipeline's are in ``per_pipeline``)."""
    exchange_s: float
    round_s: float
    fill_fraction: float
    server_utilisation: float
    """The busiest interface's load over its rate at the pipelines' pace (over 1: servers cap)."""
    staleness: float
    """Token-weighted mean versions a contribution is behind."""
    staleness_weight: float
    churn_fraction: float
    """Of the throughput before churn, the expected share lost to departures."""
    ledger_requests_per_s: float
    """Shares issued per second by the ledger at shard (0, 0): one request per share."""
    steps_per_s: float
    """Server steps per second, before churn."""
    efficiency: float
    """What a trained token teaches against synchronous training (``learning.token_efficiency``
    of the plan's pipelines as replicas, H and, with H > 1, the staleness in
    outer steps; with H = 1 the staleness weights have priced that already)."""
    per_pipeline: PipelineFigures = field(repr=False, compare=False)
    frozen: Frozen = field(repr=False, compare=False)
    """The swarm-wide figures settled for this plan: what a search holds while it moves cells."""

    @property
    def effective_tokens_per_s(self) -> float:
        """Trained tokens per second at what they teach: the rate a plan is chosen by."""
        return self.tokens_per_s * self.efficiency

    @property
    def iteration_s(self) -> float:
        """Seconds per server step: the run's update, as FORMAT.md's ``iteration_s``."""
        return self.step_tokens / self.tokens_per_s if self.tokens_per_s > 0 else math.inf

    def breakdown(self) -> dict[str, float]:
        """FORMAT.md's ``predicted``: one server step's seconds, by what they are spent on."""
        compute, pipeline, exchange = (
            self.step_tokens / r if r > 0 else math.inf
            for r in (self.compute_tokens_per_s, self.pipeline_tokens_per_s, self.exchange_tokens_per_s)
        )
        return {
            "iteration_s": self.iteration_s,
            "compute_s": compute,
            "pipeline_comm_s": pipeline - compute,
            "sync_comm_s": exchange - pipeline,
            "churn_s": self.iteration_s - exchange,
        }

    def to_json(self) -> dict[str, float]:
        """At most 16 figures: what the signed plan record carries as ``predicted``."""
        out = {
            **self.breakdown(),
            "tokens_per_s": self.tokens_per_s,
            "compute_tokens_per_s": self.compute_tokens_per_s,
            "pipeline_tokens_per_s": self.pipeline_tokens_per_s,
            "exchange_tokens_per_s": self.exchange_tokens_per_s,
            "share_s": self.share_s,
            "exchange_s": self.exchange_s,
            "round_s": self.round_s,
            "server_utilisation": self.server_utilisation,
            "staleness_weight": self.staleness_weight,
            "churn_fraction": self.churn_fraction,
            "ledger_requests_per_s": self.ledger_requests_per_s,
        }
        return {k: round(float(v), 6) if math.isfinite(v) else 1e18 for k, v in out.items()}


class Prepared(NamedTuple):
    """Rows' pipeline times, shares and cells' links to their servers (``ThroughputModel.prepare``)."""

    times: PipelineTimes
    share_s: np.ndarray
    links: list[CellLinks]


class PipelineFigures(NamedTuple):
    """Per pipeline: seconds, weights and tokens per second (after the servers' cap and churn)."""

    share_s: np.ndarray
    exchange_s: np.ndarray
    round_s: np.ndarray
    staleness: np.ndarray
    weight: np.ndarray
    """What a contribution counts towards the servers' next step (``staleness_weight``)."""
    applied: np.ndarray
    """The share of contributions the servers apply: those within ``max_staleness``."""
    churn: np.ndarray
    tokens_per_s: np.ndarray


@dataclass(frozen=True)
class Frozen:
    """What a pipeline's figures depend on beyond its own devices: fixed while a search
    compares pipelines, settled by ``ThroughputModel.evaluate`` for a whole plan."""

    steps_per_s: float
    """The shards' step rate (the swarm's weighted micro-batches per second over a step's)."""
    scale: float = 1.0
    """The servers' cap: the fraction of its pace a pipeline keeps."""
    server_leave_rate: float = 0.0
    """Departures per second summed over the servers."""


def compute_bound_tokens_per_s(scenario: Scenario) -> float:
    """Every device of the scenario computing at its rated TFLOPS with nothing else to do."""
    return float(device_tflops(scenario).sum()) * 1e12 / flops_per_token(scenario)


def fastest_device_tokens_per_s(scenario: Scenario) -> float:
    """The fastest device alone at its rated TFLOPS (whether or not the model fits it)."""
    return float(device_tflops(scenario).max()) * 1e12 / flops_per_token(scenario)


def flops_per_token(scenario: Scenario) -> float:
    m = scenario.model
    return (m.layers * m.layer_flops_per_sequence() + m.head_flops_per_sequence()) / m.seq_len


class ThroughputModel:
    """The model over one scenario, with what every evaluation shares prepared once; the
    planner's search evaluates thousands of pipelines on it (``rows``)."""

    def __init__(self, scenario: Scenario, *, max_staleness: int = 4, half: str = "fp16") -> None:
        self.scenario, self.max_staleness, self.half = scenario, max_staleness, half
        self.links = Links(scenario, half)
        self.speed = scenario.device_arrays.tflops * 1e12
        self.leave_rate = scenario.device_arrays.leave_rate_per_s
        self.batch_micro_batches = max(1, math.ceil(scenario.batch_sequences / scenario.micro_batch))
        self._last: tuple[object, Prepared] | None = None

    def settings(self, plan: Plan) -> ExchangeConfig:
        return self.exchange_settings(
            plan.micro_batches_per_share(self.scenario), plan.local_steps, len(plan.pipelines)
        )

    def exchange_settings(self, share_micro_batches: int, local_steps: int, pipelines: int) -> ExchangeConfig:
        return ExchangeConfig(
            batch_micro_batches=self.batch_micro_batches,
            share_micro_batches=share_micro_batches,
            local_steps=local_steps,
            max_staleness=self.max_staleness,
            pipelines=max(1, pipelines),
        )

    def stages(
        self, layers: tuple[int, ...], shard_servers: tuple[tuple[int, ...], ...], groups: tuple[int, ...] = ()
    ) -> list[StageShards]:
        return stage_shards(self.scenario, layers, shard_servers, self.half, groups)

    def times(
        self, rows: np.ndarray, layers: tuple[int, ...], stages: list[StageShards], checkpointing: tuple[bool, ...] = ()
    ) -> PipelineTimes:
        """``rows``' pipeline times, the ledger at shard (0, 0)'s server (``checkpointing``: the
        stages whose backward recomputes their forward)."""
        return pipeline_times(self.scenario, self.links, rows, layers, int(stages[0].servers[0]), checkpointing)

    def tokens(self, micro_batches: float) -> float:
        return trained_tokens(micro_batches, self.scenario.micro_batch, self.scenario.model.seq_len)

    def prepare(
        self,
        rows: np.ndarray,
        layers: tuple[int, ...],
        stages: list[StageShards],
        k: int,
        checkpointing: tuple[bool, ...] = (),
    ) -> Prepared:
        """What ``rows`` evaluates over and over as the swarm's figures settle, gathered once."""
        times = self.times(rows, layers, stages, checkpointing)
        links = [cell_links(self.links, rows[:, s], stage) for s, stage in enumerate(stages)]
        return Prepared(times, times.share_s(k), links)

    def rows(
        self,
        rows: np.ndarray,
        layers: tuple[int, ...],
        stages: list[StageShards],
        settings: ExchangeConfig,
        frozen: Frozen,
        *,
        prepared: Prepared | None = None,
        loads: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> PipelineFigures:
        """Each row's figures as a pipeline of the plan, the swarm around it ``frozen``
        (``prepared``: ``prepare``'s for these rows, when the caller has it). With ``loads`` (up
        and down bytes per second per device, at the pipelines' pace), the rows' traffic is added."""
        h, k = settings.local_steps, settings.share_micro_batches
        prepared = prepared if prepared is not None else self.prepare(rows, layers, stages, k)
        share = prepared.share_s
        activation_round = prepared.times.carried * h * k
        compute = h * share
        period = compute
        for last in (False, True):  # the deltas a round pulls grow with the round: settle the pair
            exchange_s = np.zeros(len(rows))
            deltas = frozen.steps_per_s * period
            for s, cl in enumerate(prepared.links):
                found = exchange(cl, deltas, activation_round[:, s], sequential=h == 1)
                exchange_s = np.maximum(exchange_s, found.seconds)
                if last and loads is not None:
                    self._add_loads(loads, cl, found, activation_round[:, s], period)
            period = compute + exchange_s if h == 1 else np.maximum(compute, exchange_s)
        staleness = frozen.steps_per_s * (share + exchange_s)
        weight = self.weights(staleness, settings)
        applied = self.weights(staleness, settings, applied=True)
        real = period / frozen.scale
        refetch = np.stack([cl.refetch_s for cl in prepared.links], axis=1)
        churn = (self.leave_rate[rows] * (real[:, None] / 2.0 + NOTICE_S + refetch)).sum(axis=1)
        churn += frozen.server_leave_rate * np.maximum(0.0, NOTICE_S - real)
        kept = 1.0 - np.minimum(1.0, churn)
        tokens = applied * self.tokens(h * k) / real * kept
        return PipelineFigures(share, exchange_s, real, staleness, weight, applied, churn, tokens)

    def weights(self, staleness: np.ndarray, settings: ExchangeConfig, *, applied: bool = False) -> np.ndarray:
        """``staleness_weight`` at fractional staleness: between the two whole versions around it
        (``applied``: whether the servers apply it at all, 1 or 0, likewise)."""
        table = np.array(
            [
                (staleness_weight(v, settings) > 0) if applied else staleness_weight(v, settings)
                for v in range(settings.max_staleness + 2)
            ],
            dtype=float,
        )
        top = len(table) - 1
        lo = np.minimum(np.floor(staleness).astype(int), top)
        frac = np.clip(staleness - lo, 0.0, 1.0)
        return table[lo] * (1.0 - frac) + table[np.minimum(lo + 1, top)] * frac

    @staticmethod
    def _add_loads(
        loads: tuple[np.ndarray, np.ndarray], cl: CellLinks, found: Exchange, carried: np.ndarray, period: np.ndarray
    ) -> None:
        up, down = loads
        sent, pulled = found.sent / period[:, None], found.pulled / period[:, None]
        np.add.at(up, cl.cells, sent.sum(axis=1) + (found.relayed + carried) / period)
        np.add.at(down, cl.cells, pulled.sum(axis=1) + (found.received + carried) / period)
        np.add.at(down, cl.servers, (found.to_server / period[:, None]).sum(axis=0))
        np.add.at(up, cl.servers, (pulled * cl.from_server).sum(axis=0))

    # -- a whole plan ----------------------------------------------------------------------------

    def _prepared(
        self,
        grid: np.ndarray,
        layers: tuple[int, ...],
        servers: tuple[tuple[int, ...], ...],
        stages: list[StageShards],
        k: int,
        groups: tuple[int, ...] = (),
        checkpointing: tuple[bool, ...] = (),
    ) -> Prepared:
        """``prepare`` for a whole grid, the last one kept: choosing H evaluates one grid several times."""
        key = (grid.tobytes(), grid.shape, layers, servers, k, groups, checkpointing)
        if self._last is None or self._last[0] != key:
            self._last = (key, self.prepare(grid, layers, stages, k, checkpointing))
        return self._last[1]

    def evaluate(self, plan: Plan) -> Throughput:
        """The plan's predicted throughput (module doc), its swarm-wide figures settled."""
        grid, layers = plan.grid(), plan.layers_per_stage
        settings = self.settings(plan)
        stages = self.stages(layers, plan.shard_servers, plan.reduce_groups)
        servers = np.unique(np.concatenate([st.servers for st in stages]))
        step_mb, round_mb = step_micro_batches(settings), settings.round_micro_batches
        prepared = self._prepared(
            grid,
            layers,
            plan.shard_servers,
            stages,
            settings.share_micro_batches,
            plan.reduce_groups,
            plan.checkpointing,
        )
        times = prepared.times

        def gives(steps: float) -> float:
            figures = self.rows(grid, layers, stages, settings, Frozen(steps_per_s=steps), prepared=prepared)
            return float((figures.weight * round_mb / figures.round_s).sum()) / step_mb

        frozen = Frozen(steps_per_s=settle(gives))
        loads = (np.zeros(self.scenario.n), np.zeros(self.scenario.n))
        paced = self.rows(grid, layers, stages, settings, frozen, prepared=prepared, loads=loads)
        up, down = self.links.up_Bps, self.links.down_Bps
        utilisation = float(np.maximum(loads[0][servers] / up[servers], loads[1][servers] / down[servers]).max())
        capped = Frozen(
            steps_per_s=frozen.steps_per_s,
            scale=1.0 / max(1.0, utilisation),
            server_leave_rate=float(self.leave_rate[servers].sum()),
        )
        final = self.rows(grid, layers, stages, settings, capped, prepared=prepared)
        round_tokens = self.tokens(round_mb)
        before_churn = float((paced.applied * round_tokens / paced.round_s).sum()) * capped.scale
        tokens = final.tokens_per_s
        total = float(tokens.sum())

        def mean(values: np.ndarray) -> float:
            return float((tokens * values).sum() / total) if total > 0 else 0.0

        return Throughput(
            tokens_per_s=total,
            compute_tokens_per_s=float((round_tokens / (round_mb * times.slowest_s())).sum()),
            pipeline_tokens_per_s=float((round_tokens / (settings.local_steps * final.share_s)).sum()),
            exchange_tokens_per_s=before_churn,
            step_tokens=self.tokens(step_mb),
            share_s=float(np.median(final.share_s)),
            exchange_s=float(np.median(final.exchange_s)),
            round_s=float(np.median(final.round_s)),
            fill_fraction=fill_fraction(settings.share_micro_batches, grid.shape[1]),
            server_utilisation=utilisation,
            staleness=mean(final.staleness),
            staleness_weight=mean(final.weight),
            churn_fraction=1.0 - total / before_churn if before_churn > 0 else 0.0,
            ledger_requests_per_s=float((settings.local_steps / final.round_s).sum()),
            steps_per_s=frozen.steps_per_s * capped.scale,
            efficiency=token_efficiency(
                self.scenario.model.params,
                len(plan.pipelines),
                settings.local_steps,
                self.tokens(settings.share_micro_batches),
                staleness=mean(final.staleness) if settings.local_steps > 1 else 0.0,
            ),
            per_pipeline=final,
            frozen=capped,
        )


def settle(gives: Callable[[float], float]) -> float:
    """The rate ``x`` with ``gives(x) == x`` for a non-increasing ``gives`` (``FIXED_POINT_ROUNDS``)."""
    lo, f_lo = 0.0, gives(0.0)
    if f_lo <= 0.0:
        return 0.0
    hi = f_lo
    f_hi = gives(hi) - hi
    if f_hi >= -SETTLED * hi:
        return hi
    side = 0
    x = hi
    for _ in range(FIXED_POINT_ROUNDS - 2):
        x = (lo * f_hi - hi * f_lo) / (f_hi - f_lo)
        f_x = gives(x) - x
        if abs(f_x) <= SETTLED * x:
            break
        if f_x < 0:
            hi, f_hi = x, f_x
            if side == -1:
                f_lo /= 2.0  # Illinois: the end that stays put counts half, so both ends move
            side = -1
        else:
            lo, f_lo = x, f_x
            if side == 1:
                f_hi /= 2.0
            side = 1
    return x


def predict_throughput(scenario: Scenario, plan: Plan, *, max_staleness: int = 4) -> Throughput:
    """``ThroughputModel(scenario).evaluate(plan)``: the plan's predicted trained tokens per second."""
    return ThroughputModel(scenario, max_staleness=max_staleness).evaluate(plan)
