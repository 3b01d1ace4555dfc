"""A grid's schedule (peers/planning/schedule.py, layers.py, construction.py): k, K_s, the shard
servers, H, the layer split and the grids a construction starts from, on cases worked by hand."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import numpy as np
import pytest

from swarmd.peers.planning.construction import balanced_clusters, pipelines_first, rematch
from swarmd.peers.planning.layers import LayerSplitter
from swarmd.peers.planning.learning import LONGEST_FITTED_STEPS
from swarmd.peers.planning.plan_cost import Plan, cell_layer_caps
from swarmd.peers.planning.scenario import Scenario, Shape, parse_scenario
from swarmd.peers.planning.scenario_gen import synthetic_scenario, synthetic_scenario_dict
from swarmd.peers.planning.schedule import (
    FILL_TARGET,
    HIDE_MARGIN,
    LONGER_GAIN,
    MAX_SHARDS_PER_STAGE,
    MIN_SHARD_ELEMENTS,
    choose_local_steps,
    choose_servers,
    server_pool,
    shard_counts,
    share_micro_batches,
)
from swarmd.peers.planning.throughput import ThroughputModel
from swarmd.peers.planning.transfers import Links, PipelineTimes
from swarmd.peers.taskpool.exchange import MAX_LOCAL_STEPS

pytestmark = pytest.mark.timeout(60)


def times(forward: float, stages: int, send: float, ledger: float, pipelines: int = 1) -> PipelineTimes:
    f = np.full((pipelines, stages), forward)
    return PipelineTimes(
        f, 2 * f, np.full((pipelines, stages - 1), send), np.zeros((pipelines, stages)), np.full(pipelines, ledger)
    )


def test_k_amortises_the_fill_and_the_ledger_within_the_batch_split() -> None:
    # Even stages of 3 s a micro-batch, nothing on the wire: the fill is S - 1 micro-batches.
    for stages in (1, 2, 4, 8):
        k = share_micro_batches(times(1.0, stages, 0.0, 0.0), batch_micro_batches=10_000)
        assert k == max(1, math.ceil((stages - 1) * (1 - FILL_TARGET) / FILL_TARGET - 1e-9)), stages
    # The ledger's round trip is sized for as if paid: 0.3 s against 3 s per micro-batch is 0.1.
    assert share_micro_batches(times(1.0, 1, 0.0, 0.3), 10_000) == 1
    assert share_micro_batches(times(1.0, 1, 0.0, 3.0), 10_000) == 9
    # It is asked for as a share opens, so a share costs the longer of the two, not their sum.
    assert times(1.0, 1, 0.0, 30.0).share_s(9)[0] == pytest.approx(30.0)
    assert times(1.0, 1, 0.0, 30.0).share_s(20)[0] == pytest.approx(60.0)
    # ... and k never exceeds the batch split over the pipelines.
    assert share_micro_batches(times(1.0, 8, 0.0, 0.0, pipelines=20), batch_micro_batches=100) == 5
    with pytest.raises(ValueError, match="must be >= 1"):
        share_micro_batches(times(1.0, 2, 0.0, 0.0), batch_micro_batches=0)


def test_shards_are_as_many_as_the_servers_the_cap_and_the_shard_size_allow() -> None:
    sc = synthetic_scenario(4, regions=1, seed=1)  # 200M parameters
    assert shard_counts(sc, (12,), 1) == [1]
    assert shard_counts(sc, (12,), 20) == [18]  # a tenth of the servers held back as replacements
    assert shard_counts(sc, (12,), 10_000) == [min(MAX_SHARDS_PER_STAGE, int(2e8) // MIN_SHARD_ELEMENTS)]
    tiny = replace(sc, model=replace(sc.model, params=1e5, vocab=10, hidden=16, layers=2))
    assert shard_counts(tiny, (1, 1), 50) == [1, 1]  # shards below MIN_SHARD_ELEMENTS are not cut


def devices(avail_and_up: list[tuple[float, float | None]]) -> Scenario:
    raw = synthetic_scenario_dict(len(avail_and_up), regions=1, seed=2)
    for d, (avail, up) in zip(raw["devices"], avail_and_up, strict=True):
        if up is None:
            d.pop("mean_uptime_h", None), d.pop("mean_downtime_h", None)
        else:
            d["mean_uptime_h"], d["mean_downtime_h"] = up, up * (1 - avail) / avail
    return parse_scenario(raw)


def test_the_server_pool_is_the_reliable_devices_longest_up_first_then_the_most_available() -> None:
    sc = devices([(0.95, 10.0), (0.5, 1.0), (0.99, 100.0), (0.92, 1.0), (0.7, 5.0), (1.0, None)])
    assert server_pool(sc, 0.9, np.arange(6)).tolist() == [5, 2, 0, 3]
    assert server_pool(sc, 0.9, np.arange(6), at_least=6).tolist() == [5, 2, 0, 3, 4, 1]


def test_servers_go_where_the_stage_reaches_them_quickly_spread_and_each_once_per_stage() -> None:
    # Six devices; cells 0 and 1; device 5 is on 1 MB/s links, the rest on 100 MB/s.
    raw = synthetic_scenario_dict(6, regions=1, seed=3, model={**synthetic_scenario_dict(1)["model"], "layers": 2})
    bw = np.full((6, 6), 1e8)
    bw[5, :], bw[:, 5] = 1e6, 1e6
    raw["bandwidth_Bps"], raw["latency_s"] = bw.tolist(), np.full((6, 6), 0.01).tolist()
    sc = parse_scenario(raw)
    grid = np.array([[0, 1]])
    servers = choose_servers(sc, grid, (1, 1), np.arange(6), [3, 3])
    for row in servers:
        assert len(set(row)) == 3 and 5 not in row
    # A device that serves a shard already counts as busier: the six shards spread over the five.
    assert len({*servers[0], *servers[1]}) == 5
    # A repair keeps every server in its shard's place and fills the hole only.
    kept = choose_servers(sc, grid, (1, 1), np.arange(6), [3, 3], keep=((servers[0][0], -1, servers[0][2]), ()))
    assert kept[0][0] == servers[0][0] and kept[0][2] == servers[0][2] and kept[0][1] not in (kept[0][0], kept[0][2])


def test_h_is_the_smallest_that_hides_the_exchange_with_the_margin_or_doubled_from_it() -> None:
    sc = synthetic_scenario(12, regions=2, seed=4)
    model = ThroughputModel(sc)
    cells = tuple((d,) for d in range(8))
    base = Plan(cells, (12,), (8,), shard_servers=((8, 9, 10, 11),), share_micro_batches=4)
    h, result = choose_local_steps(model, base)
    f = result.per_pipeline
    assert 2 <= h <= MAX_LOCAL_STEPS
    ratio = np.sort(f.exchange_s / f.share_s)
    assert h >= HIDE_MARGIN * ratio[int(0.5 * len(ratio))]  # the pipelines carrying most tokens hide it
    assert h * f.share_s.max() >= f.exchange_s.min()
    below = model.evaluate(replace(base, local_steps=h - 1))
    # One fewer does not hide it for some pipeline, or leaves the busiest server short of its
    # margin; or H was doubled past the smallest that hides it, which taught enough more.
    short = ((h - 1) * below.per_pipeline.share_s < HIDE_MARGIN * below.per_pipeline.exchange_s).any()
    if not (short or below.server_utilisation * HIDE_MARGIN > 1):
        half = model.evaluate(replace(base, local_steps=h // 2))
        assert h % 2 == 0 and result.effective_tokens_per_s >= LONGER_GAIN * half.effective_tokens_per_s


def test_h_doubles_past_hiding_while_less_stale_rounds_teach_enough_more() -> None:
    # One region, fast links: H = 16 already hides the exchange, but its rounds arrive half a
    # server step late. Longer rounds train as many raw tokens and arrive less late, so H
    # doubles while that teaches LONGER_GAIN more, and no further.
    sc = synthetic_scenario(12, regions=1, seed=4)
    model = ThroughputModel(sc)
    base = Plan(tuple((d,) for d in range(8)), (12,), (8,), shard_servers=((8, 9, 10, 11),), share_micro_batches=16)
    h, result = choose_local_steps(model, base)
    half = model.evaluate(replace(base, local_steps=h // 2))
    assert 2 <= h <= LONGEST_FITTED_STEPS
    assert half.tokens_per_s == pytest.approx(result.tokens_per_s, rel=0.01)  # the exchange hid already
    assert result.staleness < half.staleness
    assert result.effective_tokens_per_s >= LONGER_GAIN * half.effective_tokens_per_s
    if 2 * h <= LONGEST_FITTED_STEPS:
        double = model.evaluate(replace(base, local_steps=2 * h))
        assert double.effective_tokens_per_s < LONGER_GAIN * result.effective_tokens_per_s


def test_layers_go_where_they_cost_the_pipelines_least_within_memory() -> None:
    sc = synthetic_scenario(6, regions=1, seed=5, model={**synthetic_scenario_dict(1)["model"], "layers": 12})
    caps = np.full((6, 3), 12)
    split = LayerSplitter(sc, caps)
    speeds = sc.device_arrays.tflops
    grid = np.array([[0, 1, 2], [3, 4, 5]])
    layers, missing = split.split(grid)
    assert sum(layers) == 12 and missing == 0 and min(layers) >= 1

    def rate(cut: tuple[int, ...]) -> float:
        head = np.zeros(3)
        head[-1] = sc.model.head_flops_per_sequence()
        step = (np.array(cut) * sc.model.layer_flops_per_sequence() + head) / speeds[grid]
        return float((1.0 / step.max(axis=1)).sum())

    best = max((c for c in itertools.product(range(1, 11), repeat=3) if sum(c) == 12), key=rate)
    assert rate(layers) == pytest.approx(rate(best), rel=1e-9)
    # Memory bounds a stage: the member with least room decides.
    caps[4, 1] = 2
    layers, _ = LayerSplitter(sc, caps).split(grid)
    assert layers[1] <= 2
    caps[:, :] = 3
    assert LayerSplitter(sc, caps).split(grid)[1] == 12 - 9  # three layers fit nowhere


def test_a_cells_memory_holds_fewer_layers_with_local_steps_and_at_the_first_stage() -> None:
    sc = synthetic_scenario(1, regions=1, seed=6)
    caps_grad = cell_layer_caps(sc, np.array([16.0]), 4, local_steps=1)[0]
    caps_local = cell_layer_caps(sc, np.array([16.0]), 4, local_steps=8)[0]
    assert (caps_local <= caps_grad).all() and (caps_local < caps_grad).any()
    assert caps_grad[0] <= caps_grad[1] <= caps_grad[2]  # stage 0 keeps the most in flight and the embedding


def test_balanced_clusters_are_exact_and_close() -> None:
    # Two far-apart groups of three: each cluster is one group.
    pos = np.array([0.0, 0.1, 0.2, 10.0, 10.1, 10.2])
    d = np.abs(pos[:, None] - pos[None, :])
    clusters = balanced_clusters(d, np.arange(6), 2, 3)
    assert sorted(sorted(c.tolist()) for c in clusters) == [[0, 1, 2], [3, 4, 5]]


def test_pipelines_first_keeps_pipelines_close_and_rematch_sums_least() -> None:
    raw = synthetic_scenario_dict(8, regions=1, seed=7)
    region = np.arange(8) // 4
    same = region[:, None] == region[None, :]
    raw["latency_s"], raw["bandwidth_Bps"] = np.where(same, 0.001, 0.05).tolist(), np.where(same, 1e9, 1e6).tolist()
    sc = parse_scenario(raw)
    links = Links(sc)
    grid = pipelines_first(links, np.arange(8), Shape(2, 4), sc.device_arrays.memory_gib)
    assert grid.shape == (4, 2) and sorted(grid.ravel().tolist()) == list(range(8))
    assert all(region[a] == region[b] for a, b in grid)
    mixed = np.array([[0, 4], [4 + 1, 1], [2, 6], [7, 3]])
    fixed = rematch(mixed, links)
    cost = links.activation_block(fixed[:, 0], fixed[:, 1]).diagonal().sum()
    best = min(
        links.activation_block(mixed[:, 0], mixed[list(p), 1]).diagonal().sum()
        for p in itertools.permutations(range(4))
    )
    assert cost == pytest.approx(best)
