"""peers/planning/baselines.py: the four baseline schedulers, on synthetic scenarios built here."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from swarmd.peers.planning import baselines
from swarmd.peers.planning.baselines import (
    BASELINES,
    draw_matching,
    dtfm_evolutionary,
    petals_greedy,
    random_best,
    swarm_wiring,
)
from swarmd.peers.planning.open_path import EXACT_ORDER_MAX_STAGES, best_stage_order
from swarmd.peers.planning.plan_cost import Plan, bottleneck_matching, even_layers, reference_cost
from swarmd.peers.planning.scenario import Scenario, Shape, parse_scenario

pytestmark = pytest.mark.timeout(120)

NEAR_S, NEAR_BPS = 0.001, 1e10  # inside a region
FAR_S, FAR_BPS = 0.05, 5e7  # between regions
MODEL = {"hidden": 1024, "seq_len": 2048, "vocab": 50257, "params": 2e8, "dtype_bytes": 2}

# Fast settings for the randomised baselines; BASELINES runs them at their defaults.
QUICK = {
    "random": lambda sc, sh, seed=0: random_best(sc, sh, samples=300, seed=seed),
    "petals-greedy": lambda sc, sh, seed=0: petals_greedy(sc, sh),
    "dtfm-evolutionary": lambda sc, sh, seed=0: dtfm_evolutionary(sc, sh, candidates=300, seed=seed),
    "swarm-wiring": lambda sc, sh, seed=0: swarm_wiring(sc, sh, seed=seed),
}


def scenario(
    tflops: list[float],
    latency: np.ndarray,
    bandwidth: np.ndarray,
    *,
    layers: int = 12,
    act_bytes: float = 1e8,
    grad_bytes: float = 1e8,
) -> Scenario:
    return parse_scenario(
        {
            "name": "synthetic",
            "devices": [{"id": f"d{i}", "tflops": t, "memory_gib": 24} for i, t in enumerate(tflops)],
            "latency_s": latency.tolist(),
            "bandwidth_Bps": bandwidth.tolist(),
            "model": MODEL | {"layers": layers},
            "batch": {"sequences": 64, "micro_batch": 1},
            "cost": {"activation_bytes": act_bytes, "grad_bytes": grad_bytes},
        }
    )


def two_regions(per_region: int, *, act_bytes: float, grad_bytes: float) -> Scenario:
    """Devices 0..per_region-1 in region A, the rest in B; uniform links inside and between."""
    region = np.arange(2 * per_region) // per_region
    same = region[:, None] == region[None, :]
    latency, bandwidth = np.where(same, NEAR_S, FAR_S), np.where(same, NEAR_BPS, FAR_BPS)
    return scenario([50.0] * (2 * per_region), latency, bandwidth, act_bytes=act_bytes, grad_bytes=grad_bytes)


def heterogeneous(n: int, seed: int) -> Scenario:
    """Like the shared examples: three regions, jittered asymmetric links, tflops 15..250."""
    rng = np.random.default_rng(seed)
    region = rng.integers(3, size=n)
    same = region[:, None] == region[None, :]
    latency = np.where(same, 0.002, 0.05) * rng.uniform(0.8, 1.2, (n, n))
    bandwidth = np.where(same, 1.25e9, 1.25e8) * rng.uniform(0.5, 1.5, (n, n))
    return scenario(list(rng.uniform(15, 250, n).round(2)), latency, bandwidth, layers=24)


SMALL = heterogeneous(12, seed=1)
LARGE = heterogeneous(48, seed=2)


def assert_valid(plan: Plan, sc: Scenario, shape: Shape) -> None:
    grid = plan.grid()
    assert grid.shape == (shape.data_parallel, shape.stages)
    used = plan.devices()
    assert len(set(used)) == len(used) and all(0 <= d < sc.n for d in used)
    assert plan.layers_per_stage == even_layers(sc.model.layers, shape.stages)
    assert len(plan.parameter_servers) == shape.stages
    assert all(ps in group for ps, group in zip(plan.parameter_servers, plan.stage_groups(), strict=True))
    assert plan.relays == ()


# -- every baseline ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(QUICK))
@pytest.mark.parametrize(("sc", "shape"), [(SMALL, Shape(3, 4)), (LARGE, Shape(4, 12)), (LARGE, Shape(6, 7))])
def test_a_valid_plan_of_the_shape(name: str, sc: Scenario, shape: Shape) -> None:
    assert_valid(QUICK[name](sc, shape), sc, shape)


@pytest.mark.parametrize("name", sorted(QUICK))
def test_deterministic_for_equal_seeds(name: str) -> None:
    first, again = QUICK[name](SMALL, Shape(3, 4), 7), QUICK[name](SMALL, Shape(3, 4), 7)
    assert first.pipelines == again.pipelines and first.parameter_servers == again.parameter_servers


def test_the_registry_runs_defaults() -> None:
    assert set(BASELINES) == {"random", "petals-greedy", "dtfm-evolutionary", "swarm-wiring"}
    assert_valid(BASELINES["petals-greedy"](SMALL, Shape(3, 4)), SMALL, Shape(3, 4))


@pytest.mark.parametrize("shape", [Shape(4, 4), Shape(13, 1), Shape(0, 3)])
def test_a_shape_that_cannot_be_filled_is_refused(shape: Shape) -> None:
    for name in QUICK:
        with pytest.raises(ValueError, match="shape|stages"):
            QUICK[name](SMALL, shape)


# -- random ------------------------------------------------------------------------------------------


def test_random_best_is_never_worse_with_more_samples() -> None:
    costs = [reference_cost(LARGE, random_best(LARGE, Shape(4, 12), samples=k, seed=3)) for k in (1, 50, 256, 300, 900)]
    assert costs == sorted(costs, reverse=True)
    assert costs[-1] < costs[0]


def test_the_batched_cost_is_the_reference_cost() -> None:
    shape = Shape(4, 6)
    rng = np.random.default_rng(0)
    grids = np.array([rng.permutation(LARGE.n)[: shape.devices].reshape(6, 4) for _ in range(20)])
    batched = baselines._grid_costs(
        baselines._sync_matrix(LARGE, shape), baselines._activation_matrix(LARGE, shape), grids
    )
    for grid, cost in zip(grids, batched, strict=True):
        plan = Plan(tuple(map(tuple, grid)), even_layers(24, 4), tuple(grid[0]))
        assert cost == pytest.approx(reference_cost(LARGE, plan), rel=1e-12)


# -- Petals ------------------------------------------------------------------------------------------


def test_petals_fills_the_slowest_stage_fastest_first() -> None:
    flat = np.full((6, 6), 0.01)
    sc = scenario([10.0, 90.0, 5.0, 100.0, 50.0, 40.0], flat, flat * 1e11)
    # joins: 100 (d3) -> s0; 90 (d1) -> s1; 50 (d4) -> s1 (90 < 100); 40 (d5) -> s0 (100 < 140);
    # 10 (d0) -> s0 (tie at 140, first stage; s0 is now full); 5 (d2) -> s1
    plan = petals_greedy(sc, Shape(2, 3))
    assert plan.pipelines == ((3, 1), (5, 4), (0, 2))


def test_petals_weighs_throughput_per_layer() -> None:
    flat = np.full((4, 4), 0.01)
    sc = scenario([100.0, 60.0, 50.0, 10.0], flat, flat * 1e11, layers=3)  # stages of 2 and 1 layers
    # 100 -> s0 (50 per layer); 60 -> s1 (0); 50 -> s0 (50 < 60; now full); 10 -> s1
    assert petals_greedy(sc, Shape(2, 2)).pipelines == ((0, 1), (2, 3))


@pytest.mark.parametrize("seed", range(5))
def test_petals_and_swarm_balance_stage_throughput(seed: int) -> None:
    sc = heterogeneous(40, seed=seed)
    for build in (petals_greedy, swarm_wiring):
        plan = build(sc, Shape(5, 7))
        tflops = np.array([d.tflops for d in sc.devices])
        rate = np.array([tflops[g].sum() for g in plan.stage_groups()]) / np.array(plan.layers_per_stage)
        # no stage is behind another by more than one device's worth: a random split often is
        assert rate.max() - rate.min() <= tflops[plan.devices()].max() / min(plan.layers_per_stage)


def test_petals_leaves_out_the_slowest() -> None:
    plan = petals_greedy(LARGE, Shape(4, 10))
    tflops = np.array([d.tflops for d in LARGE.devices])
    left = np.setdiff1d(np.arange(LARGE.n), plan.devices())
    assert tflops[left].max() <= tflops[plan.devices()].min()


# -- DT-FM -------------------------------------------------------------------------------------------


def test_dtfm_keeps_pipelines_in_a_region_when_activations_dominate() -> None:
    sc = two_regions(12, act_bytes=1e9, grad_bytes=1e6)
    shape = Shape(4, 6)
    plan = dtfm_evolutionary(sc, shape, candidates=600)
    assert all(len({d // 12 for d in row}) == 1 for row in plan.pipelines)
    # by hand: 3 boundaries inside a region; every stage holds 3 + 3 devices of the two regions
    share = 1e6 / 6
    sync = 2 * 2 * (NEAR_S + share / NEAR_BPS) + 3 * 2 * (FAR_S + share / FAR_BPS)
    expected = sync + 2 * 3 * (NEAR_S + 1e9 / NEAR_BPS)
    assert reference_cost(sc, plan) == pytest.approx(expected)
    assert reference_cost(sc, plan) <= reference_cost(sc, random_best(sc, shape, samples=600))


def test_dtfm_is_no_worse_than_random_on_the_same_budget() -> None:
    for sc, shape in ((SMALL, Shape(3, 4)), (LARGE, Shape(4, 12))):
        dtfm = dtfm_evolutionary(sc, shape, candidates=600)
        assert dtfm.meta["candidates"] == 600
        assert reference_cost(sc, dtfm) <= reference_cost(sc, random_best(sc, shape, samples=600))


def test_no_rewiring_of_dtfm_groups_is_cheaper() -> None:
    """Given its groups, DT-FM's order and matchings are optimal: shuffling members inside the
    groups and the order of the stages never lowers the reference cost."""
    plan = dtfm_evolutionary(SMALL, Shape(3, 4), candidates=300)
    cost = reference_cost(SMALL, plan)
    grid = plan.grid()
    rng = np.random.default_rng(0)
    for _ in range(300):
        shuffled = np.stack([rng.permutation(col) for col in grid.T], axis=1)[:, rng.permutation(3)]
        other = Plan(tuple(map(tuple, shuffled)), plan.layers_per_stage, tuple(shuffled[0]))
        assert reference_cost(SMALL, other) >= cost - 1e-9


def test_dtfm_with_more_stages_than_the_exact_order_handles() -> None:
    sc = heterogeneous(14, seed=4)
    shape = Shape(EXACT_ORDER_MAX_STAGES + 2, 1)
    assert_valid(dtfm_evolutionary(sc, shape, candidates=200), sc, shape)


@pytest.mark.parametrize("seed", range(6))
def test_the_exact_stage_order_is_the_cheapest_path(seed: int) -> None:
    edges = np.random.default_rng(seed).uniform(1, 10, (6, 6))  # asymmetric
    order, cost = best_stage_order(edges)
    brute = min(sum(edges[p[k], p[k + 1]] for k in range(5)) for p in itertools.permutations(range(6)))
    assert sorted(order) == list(range(6))
    assert cost == pytest.approx(brute) == pytest.approx(sum(edges[order[k], order[k + 1]] for k in range(5)))


@pytest.mark.parametrize("seed", range(4))
def test_the_fast_bottleneck_is_the_bottleneck_matching(seed: int) -> None:
    rng = np.random.default_rng(seed)
    for _ in range(50):
        cost = rng.uniform(0, 1, (5, 5)) ** 3
        floor = max(cost.min(axis=1).max(), cost.min(axis=0).max())
        assert baselines._bottleneck(cost, floor) == bottleneck_matching(cost)[1]


@pytest.mark.parametrize("seed", range(3))
def test_the_heuristic_order_is_two_opt_optimal(seed: int) -> None:
    edges = np.random.default_rng(seed).uniform(1, 10, (14, 14))
    order, cost = best_stage_order(edges)
    assert sorted(order) == list(range(14))
    for i, j in itertools.combinations(range(14), 2):
        turned = list(order[:i]) + list(order[i : j + 1])[::-1] + list(order[j + 1 :])
        assert sum(edges[turned[k], turned[k + 1]] for k in range(13)) >= cost - 1e-9


def test_the_heuristic_order_finds_a_line() -> None:
    x = np.random.default_rng(5).permutation(16).astype(float)
    order, cost = best_stage_order(np.abs(x[:, None] - x[None, :]))
    assert cost == pytest.approx(15.0)
    assert list(x[list(order)]) in (sorted(x), sorted(x, reverse=True))


# -- SWARM -------------------------------------------------------------------------------------------


def test_wiring_draws_in_proportion_to_the_weights() -> None:
    rng = np.random.default_rng(0)
    weights = np.array([[3.0, 1.0], [1.0, 1.0]])
    first = np.array([draw_matching(weights, rng)[0] for _ in range(4000)])
    assert (first == 0).mean() == pytest.approx(0.75, abs=0.03)


def test_wiring_is_a_matching_that_follows_strong_links() -> None:
    rng = np.random.default_rng(1)
    weights = np.kron(np.eye(3), np.ones((2, 2))) * 1e6 + 1.0  # three blocks of strong links
    for _ in range(50):
        cols = draw_matching(weights, rng)
        assert sorted(cols) == list(range(6))
        assert all(c // 2 == r // 2 for r, c in enumerate(cols))


def test_swarm_wiring_prefers_near_peers() -> None:
    """Stage groups ignore the network, so some pipelines must cross between the regions, at
    least |A(s) - A(s+1)| at boundary s (A: members in region A); wiring weighted by transfer
    time should hardly cross more often than that."""
    sc = two_regions(6, act_bytes=1e9, grad_bytes=1e6)
    extra = 0
    for seed in range(10):
        grid = swarm_wiring(sc, Shape(3, 4), seed=seed).grid()
        in_a = grid < 6
        crossing = (in_a[:, :-1] != in_a[:, 1:]).sum()
        forced = np.abs(np.diff(in_a.sum(axis=0))).sum()
        extra += int(crossing - forced)
    assert extra <= 2
