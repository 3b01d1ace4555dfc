"""One planning's context, and each step a plan or a repair takes on a grid.

One planning's context: the scenario as the planner sees it, the model over it, and each
step a plan or a repair takes on a grid (``swarmd.peers.planning.planner`` for the method).

- ``GridCandidate``: a grid with its layer split, shard servers, H and k, and its prediction;
- ``Planner``: the memory caps per stage count and mode, the devices that can hold a cell,
  the free mode's shapes, a grid's schedule (split, servers, k, H), its construction, its
  refinement by local search, and the roles that finish a plan.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from swarmd.peers.planning.construction import LARGE, candidate_pools, pipelines_first
from swarmd.peers.planning.layers import LayerSplitter
from swarmd.peers.planning.learning import ANCHOR_REPLICAS, FLAT_FROM_STEPS, most_useful_replicas
from swarmd.peers.planning.plan_cost import Plan, cell_layer_caps, checkpointed_stages
from swarmd.peers.planning.scenario import Scenario, Shape
from swarmd.peers.planning.schedule import (
    REDUCE_GAIN,
    choose_local_steps,
    choose_servers,
    reduction_options,
    routing_relays,
    server_pool,
    shard_counts,
    share_micro_batches,
    spares,
)
from swarmd.peers.planning.search import Search
from swarmd.peers.planning.settings import (
    Awareness,
    PlannerConfig,
    min_availability,
    planning_view,
    usable_devices,
)
from swarmd.peers.planning.throughput import Frozen, Throughput, ThroughputModel
from swarmd.peers.planning.transfers import StageShards
from swarmd.peers.taskpool.exchange import ExchangeConfig

FINALISTS = 2
"""Free mode: how many of the best-built shapes are refined by local search."""
REFINE_ROUNDS = 3
"""Searches per finalist at most, each followed by a fresh split and schedule."""
LOCAL = 2
"""The local steps whose memory (AdamW on the cell) a local-mode shape is sized for."""


@dataclass
class GridCandidate:
    """A grid with its split and schedule, and what the model predicts for it (None: not yet
    predicted, as a repair's that keeps the previous schedule until ``Planner.finish``)."""

    grid: np.ndarray
    layers: tuple[int, ...]
    servers: tuple[tuple[int, ...], ...]
    local_steps: int
    share: int
    result: Throughput | None = field(default=None, repr=False)
    groups: tuple[int, ...] = ()
    checkpointing: tuple[bool, ...] = ()
    """Per stage, activation checkpointing (``plan_cost.checkpointed_stages``); empty: none."""

    @property
    def effective_tokens_per_s(self) -> float:
        """What candidates are compared by: trained tokens per second at what they teach
        (``learning.token_efficiency``), so that more pipelines or longer rounds win only where
        they add learning, not just tokens."""
        assert self.result is not None, "a candidate is compared only once predicted"
        return self.result.effective_tokens_per_s

    def plan(self, relays: tuple[int, ...] = (), spares: tuple[int, ...] = ()) -> Plan:
        return Plan(
            pipelines=tuple(tuple(int(d) for d in row) for row in self.grid),
            layers_per_stage=self.layers,
            parameter_servers=tuple(servers[0] for servers in self.servers),
            relays=relays,
            shard_servers=self.servers,
            local_steps=self.local_steps,
            share_micro_batches=self.share,
            spares=spares,
            reduce_groups=self.groups,
            checkpointing=self.checkpointing,
        )


class Planner:
    """One planning's context: the scenario as the planner may see it, the model over it, and
    the memory caps per stage count and mode, built once."""

    def __init__(self, scenario: Scenario, settings: PlannerConfig, among: np.ndarray | None = None) -> None:
        self.scenario, self.settings = scenario, settings
        self.view = planning_view(scenario, settings.awareness)
        self.model = ThroughputModel(self.view)
        self.min_availability = min_availability(settings)
        self.usable = usable_devices(self.view, settings, among)
        self.memory = self.view.device_arrays.memory_gib
        self._caps: dict[tuple[int, bool, bool], np.ndarray] = {}
        self._splitters: dict[tuple[int, bool], LayerSplitter] = {}

    def caps(self, stages: int, local: bool, *, checkpointing: bool = True) -> np.ndarray:
        """``cell_layer_caps`` of the view's devices (``checkpointing``: where it fits more)."""
        key = (stages, local, checkpointing)
        if key not in self._caps:
            self._caps[key] = cell_layer_caps(
                self.view, self.memory, stages, LOCAL if local else 1, checkpointing=checkpointing
            )
        return self._caps[key]

    def checkpointing(self, grid: np.ndarray, layers: tuple[int, ...], local: bool) -> tuple[bool, ...]:
        """The stages of ``grid`` that must checkpoint to hold ``layers`` (empty: none)."""
        return checkpointed_stages(self.caps(grid.shape[1], local, checkpointing=False), grid, layers)

    def splitter(self, stages: int, local: bool) -> LayerSplitter:
        key = (stages, local)
        if key not in self._splitters:
            self._splitters[key] = LayerSplitter(self.view, self.caps(stages, local), even=self.settings.even_layers)
        return self._splitters[key]

    def eligible(self, stages: int, local: bool) -> np.ndarray:
        """Usable devices that can hold any cell of an even cut into ``stages`` (best first)."""
        need = self.view.model.layers // stages if stages > 1 else self.view.model.layers
        return self.usable[self.caps(stages, local)[self.usable].min(axis=1) >= max(1, need)]

    def local_mode(self) -> list[bool]:
        """Whether shapes are sized for local steps: as the run fixes H, else local first."""
        fixed = self.settings.local_steps
        return [True, False] if fixed is None else [fixed > 1]

    # -- one grid ----------------------------------------------------------------------------

    def schedule(
        self,
        grid: np.ndarray,
        local: bool,
        keep: tuple[tuple[int, ...], ...] | None = None,
        *,
        servers: tuple[tuple[int, ...], ...] | None = None,
    ) -> GridCandidate | None:
        """``grid`` with its split, k, servers and H, and its prediction (None: layers do not
        fit). ``keep``: servers to keep in their shards' places where the new choice has room;
        ``servers``: the servers, as they are (a repair keeps every shard where it is)."""
        n_pipes, n_stages = grid.shape
        layers, missing = self.splitter(n_stages, local).split(grid)
        if missing:
            return None
        if servers is None:
            pool = server_pool(self.view, self.min_availability, self.usable)
            counts = shard_counts(self.view, layers, len(pool))
            servers = choose_servers(self.view, grid, layers, pool, counts, keep)
        flags = self.checkpointing(grid, layers, local)
        times = self.model.times(grid, layers, self.model.stages(layers, servers), flags)
        fixed = self.settings.local_steps
        gradient = fixed == 1 if fixed is not None else not local
        k = share_micro_batches(times, self.model.batch_micro_batches, gradient=gradient)
        best: GridCandidate | None = None
        for groups in reduction_options(grid.shape[0], servers, gradient):
            h0 = 1 if fixed is None else fixed
            base = GridCandidate(grid, layers, servers, h0, k, groups=groups, checkpointing=flags).plan()
            if fixed is not None or not local:
                h, result = base.local_steps, self.model.evaluate(base)
            else:
                h, result = choose_local_steps(self.model, base, start=LOCAL)
            if best is None or result.effective_tokens_per_s > best.effective_tokens_per_s * (
                REDUCE_GAIN if groups else 1 + 1e-9
            ):
                best = GridCandidate(grid, layers, servers, h, k, result, groups, flags)
        return best

    def build(self, shape: Shape, local: bool, candidates: np.ndarray) -> GridCandidate | None:
        """The best construction of ``shape`` from ``candidates`` (best first), scheduled."""
        best: GridCandidate | None = None
        pools = candidate_pools(self.model.links, candidates, shape, pools=3 if self.view.n <= LARGE else 1)
        for pool in pools:
            found = self.schedule(pipelines_first(self.model.links, pool, shape, self.memory), local)
            if found is not None and (best is None or found.effective_tokens_per_s > best.effective_tokens_per_s):
                best = found
        return best

    # -- shapes ------------------------------------------------------------------------------

    @property
    def useful_replicas(self) -> int:
        """The replica count that teaches the most in all at long rounds (whose gap is the
        largest, so the count the least): a shape of that many pipelines is always tried. The
        model prices no inner batch (``learning``: measured indifferent), so one micro-batch's
        tokens stand for every share."""
        share = self.model.tokens(1)
        return max(1, round(most_useful_replicas(self.view.model.params, int(FLAT_FROM_STEPS), share)))

    def shapes(self, local: bool) -> list[Shape]:
        """Free mode's shapes (module doc, step 1). The stage counts are those at which more
        devices can hold a cell than with one stage fewer, from the fewest up: more stages
        than that for the same devices only add boundaries. Each with as many pipelines as
        those devices allow, half as many, and as many as the batch feeds one micro-batch each
        (beyond that, servers step several times per round and every round pulls as many
        deltas)."""
        stage_range = (
            [self.settings.stages] if self.settings.stages is not None else range(1, self.view.model.layers + 1)
        )
        fits = {s: len(self.eligible(s, local)) for s in stage_range}
        levels, seen = [], 0
        for s, count in fits.items():
            if count >= s and count > seen:
                levels.append(s)
                seen = count
        wanted = self.settings.max_shapes
        fed = self.model.batch_micro_batches
        out: list[Shape] = []
        for s in levels[: max(1, wanted // 3)]:
            most = fits[s] // s
            counts = {most, max(1, most // 2), min(most, fed)}
            if local:  # replicas past the most useful count add tokens, not learning (``learning``)
                counts |= {min(most, ANCHOR_REPLICAS), min(most, self.useful_replicas)}
            out += [Shape(s, n) for n in sorted(counts, reverse=True)]
        return out[: max(1, wanted)]

    # -- refinement --------------------------------------------------------------------------

    def refine(self, found: GridCandidate, local: bool, deadline: float) -> GridCandidate:
        """Search, then split and schedule again, while it helps and time is left."""
        best = found
        for round_ in range(REFINE_ROUNDS):
            if time.perf_counter() >= deadline:
                break
            grid = self._search(best, local, deadline, self.settings.seed + round_)
            if np.array_equal(grid, best.grid):
                break
            again = self.schedule(grid, local, keep=best.servers)
            if again is None or again.effective_tokens_per_s <= best.effective_tokens_per_s * (1 + 1e-9):
                break
            best = again
        return best

    def _search(self, found: GridCandidate, local: bool, deadline: float, seed: int) -> np.ndarray:
        n_stages = found.grid.shape[1]
        caps = self.caps(n_stages, local)
        servers = {d for row in found.servers for d in row}
        placed = set(found.grid.ravel().tolist())
        spare = [int(d) for d in self.eligible(n_stages, local) if int(d) not in placed and int(d) not in servers]
        stages = self.model.stages(found.layers, found.servers, found.groups)
        settings = self.model.exchange_settings(found.share, found.local_steps, int(found.grid.shape[0]))
        assert found.result is not None
        frozen = found.result.frozen
        if n_stages == 1:
            return self._select_single(found, spare, stages, settings, frozen)
        search = Search(self.model, found.grid, spare, found.layers, stages, settings, frozen, caps, deadline, seed)
        search.run()
        return search.grid

    def _select_single(
        self,
        found: GridCandidate,
        spare: list[int],
        stages: list[StageShards],
        settings: ExchangeConfig,
        frozen: Frozen,
    ) -> np.ndarray:
        """One stage: the grid's devices and the spares each costed as a pipeline alone, the
        best kept (each pipeline is one device, so this is the search's answer at once)."""
        pool = np.concatenate([found.grid[:, 0], np.asarray(spare, dtype=int)])
        caps = self.caps(1, found.local_steps > 1)
        pool = pool[caps[pool, 0] >= found.layers[0]]
        rates = self.model.rows(pool[:, None], found.layers, stages, settings, frozen).tokens_per_s
        keep = pool[np.argsort(-rates, kind="stable")[: len(found.grid)]]
        return keep[:, None]

    # -- roles -------------------------------------------------------------------------------

    def finish(self, best: GridCandidate, started: float, relays: Sequence[int] | None = None) -> Plan:
        """The plan of ``best`` with its relays (``relays``: those to keep, as a repair does; else
        elected by ``routing_relays``) and spares, predicted on the real scenario."""
        if relays is None:
            relays = routing_relays(self.view, self.model.links, best.grid, self.min_availability)
        relays = list(relays)
        caps = self.caps(best.grid.shape[1], best.local_steps > 1)
        others = [d for row in best.servers for d in row] + relays
        best = replace(best, checkpointing=self.checkpointing(best.grid, best.layers, best.local_steps > 1))
        result = best.plan(relays=tuple(relays), spares=spares(self.usable, best.grid, caps, best.layers, others))
        # The planner's own model when it may know everything (its view is the scenario's).
        seen = self.settings.awareness == Awareness()
        prediction = (self.model if seen else ThroughputModel(self.scenario)).evaluate(result)
        return replace(result, meta={"runtime_s": time.perf_counter() - started, "prediction": prediction})
