"""peers/planning/loss_curve.py: Chinchilla's fit, its inverse, and the default target."""

from __future__ import annotations

import pytest

from swarmd.peers.planning.loss_curve import default_target_loss, floor_loss, loss_at, tokens_to_loss

pytestmark = pytest.mark.timeout(30)


def test_the_published_fit() -> None:
    """Hoffmann et al. 2022, approach 3: Chinchilla (70B, 1.4T tokens) at about 1.94."""
    assert loss_at(70e9, 1.4e12) == pytest.approx(1.94, abs=0.01)


@pytest.mark.parametrize("params", [35e6, 200e6, 1.3e9])
def test_tokens_to_loss_inverts_the_curve(params: float) -> None:
    for tokens in (1e8, 4e9, 1e11):
        assert tokens_to_loss(params, loss_at(params, tokens)) == pytest.approx(tokens, rel=1e-9)


def test_more_tokens_and_more_parameters_lower_the_loss() -> None:
    assert loss_at(200e6, 2e9) < loss_at(200e6, 1e9)
    assert loss_at(1.3e9, 1e9) < loss_at(200e6, 1e9)
    assert floor_loss(200e6) < loss_at(200e6, 1e12)


def test_the_default_target_is_the_compute_optimal_budget() -> None:
    assert tokens_to_loss(200e6, default_target_loss(200e6)) == pytest.approx(20 * 200e6, rel=1e-9)


def test_a_loss_below_the_floor_is_refused_with_the_floor() -> None:
    with pytest.raises(
        ValueError, match=r"out of reach for 2e\+08 parameters: the fit's floor for that size is 2\.302"
    ):
        tokens_to_loss(200e6, 2.0)
