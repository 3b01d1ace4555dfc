"""peers/planning/learning.py: the token-efficiency model meets every published configuration it
was built from within a factor of 1.5, and behaves as a quality model must between them."""

from __future__ import annotations

import pytest

from swarmd.peers.planning.learning import loss_gap, most_useful_replicas, token_efficiency

pytestmark = pytest.mark.timeout(30)

PUBLISHED = [
    # (params, replicas, H, efficiency the source gives or implies, source)
    (150e6, 8, 500, 0.65, "DiLoCo 2023: 8 replicas, 15.02 against 14.72 in sequence"),
    (150e6, 64, 500, 0.09, "DiLoCo 2023: 64 replicas, 14.96"),
    (35e6, 8, 30, 0.845**3.9, "scaling laws, Table 4: +3.9% at 35M"),
    (550e6, 8, 30, 0.845**1.7, "scaling laws, Table 4: +1.7% at 550M"),
    (2.4e9, 8, 30, 0.845**1.1, "scaling laws, Table 4: +1.1% at 2.4B"),
]


MEASURED = [
    # (params, replicas, H, efficiency measured, source): the swarm's own exchange on the default
    # run's model with the outer step exchange.outer_step_for gives (docs/results.md,
    # bench_token_efficiency --outer-steps 100 --outer 0:0.9).
    (875_264, 1, 16, 1.00, "one replica ended below the synchronous curve (0.175, 0.9)"),
    (875_264, 2, 4, 0.92, "two replicas, H = 4"),
    (875_264, 2, 16, 0.89, "two replicas, H = 16"),
    (875_264, 4, 4, 0.55, "four replicas, H = 4"),
    (875_264, 4, 16, 0.60, "four replicas, H = 16"),
]


@pytest.mark.parametrize(("params", "replicas", "steps", "found", "source"), PUBLISHED + MEASURED)
def test_the_published_and_measured_configurations_within_a_factor_of_one_and_a_half(
    params: float, replicas: int, steps: int, found: float, source: str
) -> None:
    predicted = token_efficiency(params, replicas, steps)
    assert found / 1.5 <= predicted <= found * 1.5, (source, predicted)


def test_the_scaling_law_gaps_themselves() -> None:
    for params, gap in ((35e6, 0.039), (550e6, 0.017), (2.4e9, 0.011)):
        assert loss_gap(params, 8, 30) == pytest.approx(gap, rel=0.05)


def test_synchronous_training_is_the_yardstick() -> None:
    """One step a round on time is synchronous training, however many pipelines average it; so
    is one replica, however long its rounds."""
    assert token_efficiency(1e9, 64, 1) == 1.0
    assert token_efficiency(1e9, 1, 500) == 1.0


def test_more_replicas_longer_rounds_staler_contributions_and_smaller_models_teach_less() -> None:
    base = dict(params=200e6, replicas=8, local_steps=30)
    at = token_efficiency(**base)  # type: ignore[arg-type]
    assert token_efficiency(**{**base, "replicas": 16}) < at  # type: ignore[arg-type]
    assert token_efficiency(**{**base, "local_steps": 4}) > at  # type: ignore[arg-type]
    assert token_efficiency(**base, staleness=1.0) <= at  # type: ignore[arg-type]
    assert token_efficiency(**{**base, "params": 2e9}) > at  # type: ignore[arg-type]
    # Past 30 published-size steps the round's length no longer matters (DiLoCo's 500 = 30).
    assert token_efficiency(**{**base, "local_steps": 500}) == at  # type: ignore[arg-type]


def test_what_the_planner_once_chose_teaches_almost_nothing() -> None:
    """docs/results.md's 1,000-device figure: 759 replicas of H = 685 inner steps of one
    2,048-token micro-batch each, a 200M model: its tokens teach what about 9 replicas' do."""
    efficiency = token_efficiency(200e6, 759, 685)
    assert efficiency < 0.015
    assert token_efficiency(200e6, 8, 685) > 40 * efficiency
    assert 759 * efficiency < 10


def test_replicas_past_the_most_useful_count_add_no_learning_and_take_none() -> None:
    for params, steps in ((150e6, 500), (200e6, 4), (1.3e9, 30), (35e6, 16)):
        peak = most_useful_replicas(params, steps)
        worth = [m * token_efficiency(params, m, steps) for m in range(1, 2000)]
        best = next(m for m, w in enumerate(worth, 1) if w >= max(worth) * (1 - 1e-9))
        assert abs(best - peak) <= 1, (params, steps, best, peak)
        assert all(b >= a * (1 - 1e-9) for a, b in zip(worth, worth[1:], strict=False))
        assert worth[-1] == pytest.approx(worth[best - 1], rel=0.01)
    # DiLoCo 2023: 8, 16 and 64 replicas at H = 500 teach about as much in all (15.02, 14.91, 14.96).
    assert most_useful_replicas(150e6, 500) == pytest.approx(29, abs=2)
    assert most_useful_replicas(1e9, 1) == float("inf")
