"""models/parameter_shard.py: a step that comes out non-finite is undone whole (weights,
optimizer state, residual, centre, version), counted and warned about once, returns no step,
and gives its shares back (``unknown``) so that their resend makes the next step normally."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import torch

from swarmd.models.parameter_shard import Outcome, ParameterShard
from swarmd.models.shard_config import ShardConfig

pytestmark = pytest.mark.timeout(60)

SIZE = 200


def gradient(seed: int, scale: float = 1.0) -> torch.Tensor:
    return torch.randn(SIZE, generator=torch.Generator().manual_seed(seed)) * scale


def state_of(shard: ParameterShard) -> dict[str, Any]:
    """Everything a step changes, copied."""
    optimizer = {
        k: v.clone() if isinstance(v, torch.Tensor) else v
        for k, v in shard._optimizer.state.get(shard._param, {}).items()
    }
    centre = None if shard._centred is None or shard._centred.centre is None else shard._centred.centre.clone()
    return dict(
        weights=shard._param.detach().clone(),
        optimizer=optimizer,
        residual=shard.residual,
        centre=centre,
        version=shard.version,
        committed=shard.committed_version,
    )


def assert_same(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        if isinstance(a[k], dict):
            assert a[k].keys() == b[k].keys(), k
            for name in a[k]:
                assert torch.equal(torch.as_tensor(a[k][name]), torch.as_tensor(b[k][name])), (k, name)
        elif isinstance(a[k], torch.Tensor):
            assert torch.equal(a[k], b[k]), k
        else:
            assert a[k] == b[k], k


def stepped(shard: ParameterShard, share_id: int, seed: int, scale: float = 1.0) -> None:
    result = shard.contribute(gradient(seed, scale), shard.version, 1, [share_id], 1.0)
    assert result.outcome is Outcome.BUFFERED and result.step is not None
    shard.confirm(result.step.version)


@pytest.mark.parametrize(
    "config",
    [
        ShardConfig(mode="gradient", lr=1e-2, weight_decay=0.1),
        ShardConfig(mode="gradient", lr=1e-2, aggregation="centred-clip"),
        ShardConfig(mode="local", lr=1e-3, outer_lr=0.7, outer_momentum=0.9),
    ],
    ids=["adamw", "adamw-centred-clip", "nesterov"],
)
def test_a_poisoned_update_is_undone_and_the_resent_round_steps_as_if_it_never_happened(
    config: ShardConfig, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    initial = gradient(0)
    shard = ParameterShard(0, SIZE, initial, config, step_micro_batches=1)
    reference = ParameterShard(0, SIZE, initial, config, step_micro_batches=1)
    for i in (1, 2, 3):  # optimizer state, residual and centre are all non-trivial by now
        stepped(shard, i, i)
        stepped(reference, i, i)
    before = state_of(shard)

    honest_step = shard._optimizer.step

    def overflowing_step() -> None:  # the real update, then a bug's NaN and an overflow's Inf
        honest_step()
        with torch.no_grad():
            shard._param[7] = float("nan")
            shard._param[11] = float("inf")

    monkeypatch.setattr(shard._optimizer, "step", overflowing_step)
    with caplog.at_level(logging.WARNING, logger="swarmd.models.parameter_shard"):
        result = shard.contribute(gradient(4), shard.version, 1, [40, 41], 1.0)
    assert result.outcome is Outcome.BUFFERED and result.step is None and result.version == 3
    assert_same(state_of(shard), before)
    assert shard.counters.dropped_steps == 1 and shard.counters.steps == 3
    assert shard.buffered_micro_batches == 0
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "[0, 200)" in warnings[0].getMessage() and "version 4" in warnings[0].getMessage()
    # The shares are given back, neither done nor buffered: a pull reports them unknown, and the
    # cells' resend is taken afresh (not refused as a duplicate).
    assert shard.unknown([3, 40, 41]) == [40, 41] and shard.committed([40, 41]) == set()
    # Given back by drop 1, unlike an ID never seen (a contribution still on its way).
    assert shard.given_back([3, 40, 41, 42]) == {40: 1, 41: 1}
    served = shard.weights()
    assert shard.deltas_since(3) == [] and served is not None and served[0] == 3
    assert torch.equal(served[1], before["weights"])

    monkeypatch.setattr(shard._optimizer, "step", honest_step)
    resent = shard.contribute(gradient(4), shard.version, 1, [40, 41], 1.0)
    assert resent.outcome is Outcome.BUFFERED and resent.step is not None and resent.step.version == 4
    assert resent.step.share_ids == (40, 41)
    shard.confirm(4)
    stepped(reference, 40, 4)
    assert torch.equal(shard._param.detach(), reference._param.detach())
    assert torch.equal(shard.residual, reference.residual)
    assert shard.committed([40, 41]) == {40, 41} and shard.counters.dropped_steps == 1
    assert shard.given_back([40, 41]) == {}  # sent again: not given back any more


def test_an_outer_lr_that_overflows_fp32_on_the_first_step_leaves_the_optimizer_unstarted() -> None:
    # No fault injected: a step of 1e38 times a pseudo-gradient of 1e3 is Inf in fp32.
    config = ShardConfig(mode="local", lr=1e-3, outer_lr=1e38, outer_momentum=0.9)
    initial = gradient(0)
    shard = ParameterShard(0, SIZE, initial, config, step_micro_batches=2)
    assert shard.contribute(gradient(1, 1e3), 0, 1, [1], 1.0).step is None  # buffered, not a step yet
    result = shard.contribute(gradient(2, 1e3), 0, 1, [2], 1.0)
    assert result.step is None and shard.version == 0 and shard.counters.dropped_steps == 1
    assert shard._optimizer.state.get(shard._param, {}) == {}  # no momentum from the dropped step
    assert torch.equal(shard._param.detach(), initial) and torch.equal(shard.residual, torch.zeros(SIZE))
    assert shard.unknown([1, 2]) == [1, 2] and shard.given_back([1, 2]) == {1: 1, 2: 1}
    # A pseudo-gradient the lr does not blow up steps from the untouched state.
    reference = ParameterShard(0, SIZE, initial, config, step_micro_batches=2)
    for shards in (shard, reference):
        shards.contribute(gradient(3, 1e-40), 0, 1, [3], 1.0)
        after = shards.contribute(gradient(4, 1e-40), 0, 1, [4], 1.0)
        assert after.step is not None and after.step.version == 1
    assert torch.equal(shard._param.detach(), reference._param.detach())
    assert bool(torch.isfinite(shard._param).all()) and not torch.equal(shard._param.detach(), initial)


def test_a_flush_that_comes_out_non_finite_returns_nothing_and_keeps_the_settled_ids(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    shard = ParameterShard(0, SIZE, gradient(0), ShardConfig(mode="gradient", lr=1e-2), step_micro_batches=4)
    shard.contribute(gradient(1), 0, 1, [1], 1.0)
    assert shard.contribute(gradient(2), 0, 1, [2], 0.0).outcome is Outcome.DROPPED  # settled, not applied
    honest_step = shard._optimizer.step

    def nan_step() -> None:
        honest_step()
        shard._param.data.fill_(float("nan"))

    monkeypatch.setattr(shard._optimizer, "step", nan_step)
    assert shard.flush() is None and shard.version == 0 and shard.counters.dropped_steps == 1
    # The applied share is given back; the settled one stays settled and goes with the next step.
    assert shard.unknown([1, 2]) == [1] and shard.committed([2]) == {2} and shard.given_back([1, 2]) == {1: 1}
    monkeypatch.setattr(shard._optimizer, "step", honest_step)
    shard.contribute(gradient(1), 0, 1, [1], 1.0)
    step = shard.flush()
    assert step is not None and step.version == 1 and set(step.share_ids) == {1, 2}
