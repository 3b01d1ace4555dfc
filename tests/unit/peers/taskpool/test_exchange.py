"""The exchange schedule's rules (peers/taskpool/exchange.py), worked out by hand."""

from __future__ import annotations

from dataclasses import replace

import pytest

from swarmd.peers.taskpool.exchange import (
    ExchangeConfig,
    outer_step_for,
    shard_range,
    shard_sizes,
    share_seconds,
    staleness_weight,
    step_micro_batches,
)

pytestmark = pytest.mark.timeout(10)


def test_shards_cover_the_stage_exactly_once_and_differ_by_at_most_one() -> None:
    for elements, shards in [(10, 1), (10, 3), (1001, 7), (7, 7)]:
        ranges = [shard_range(elements, shards, k) for k in range(shards)]
        assert ranges[0][0] == 0 and ranges[-1][1] == elements
        assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:], strict=False))
        sizes = shard_sizes(elements, shards)
        assert max(sizes) - min(sizes) <= 1 and sum(sizes) == elements
    with pytest.raises(ValueError, match="non-empty"):
        shard_range(3, 4, 0)


def test_gradients_count_in_full_within_the_bound_and_pseudo_gradients_fade() -> None:
    grad = ExchangeConfig(batch_micro_batches=8, share_micro_batches=4, max_staleness=2)
    assert [staleness_weight(t, grad) for t in range(4)] == [1.0, 1.0, 1.0, 0.0]
    local = ExchangeConfig(batch_micro_batches=8, share_micro_batches=4, local_steps=10, max_staleness=3)
    assert staleness_weight(0, local) == 1.0
    assert staleness_weight(3, local) == pytest.approx(0.5)
    assert staleness_weight(4, local) == 0.0
    # An outer step: H times the lesser of the batch and one share of every pipeline.
    assert step_micro_batches(grad) == 8 and step_micro_batches(local) == 40
    assert step_micro_batches(replace(local, pipelines=2)) == 80 == step_micro_batches(replace(local, pipelines=5))
    with pytest.raises(ValueError, match="from the future"):
        staleness_weight(-1, grad)


def test_one_stage_share_is_its_compute_and_a_pipeline_adds_fill_and_bottleneck() -> None:
    assert share_seconds([1.0], [2.0], [], 5) == pytest.approx(15.0)
    # Two stages, 1 s forward and 2 s backward each, 0.5 s per activation: the first
    # micro-batch crosses everything (7 s), each other adds the slowest stage (3 s).
    assert share_seconds([1.0, 1.0], [2.0, 2.0], [0.5], 4) == pytest.approx(7.0 + 3 * 3.0)
    # A slow link is the bottleneck.
    assert share_seconds([1.0, 1.0], [2.0, 2.0], [5.0], 3) == pytest.approx(16.0 + 2 * 16.0 / 3)


def test_settings_name_the_bad_value() -> None:
    with pytest.raises(ValueError, match="local_steps = 0"):
        ExchangeConfig(batch_micro_batches=1, share_micro_batches=1, local_steps=0)
    assert ExchangeConfig(batch_micro_batches=4, share_micro_batches=2, local_steps=3).round_micro_batches == 6
    with pytest.raises(ValueError, match="outer_lr = -0.1"):
        ExchangeConfig(batch_micro_batches=1, share_micro_batches=1, outer_lr=-0.1)


def test_the_outer_step_grows_with_the_round_to_dilocos() -> None:
    """Short rounds take a fraction of DiLoCo's rate (they overshoot at its whole rate, as
    bench_token_efficiency measured); from 64 steps the whole 0.7 with momentum 0.9."""
    rates = [outer_step_for(h)[0] for h in (2, 4, 16, 64, 500)]
    assert rates == sorted(rates) and rates[-2:] == [0.7, 0.7]
    assert outer_step_for(4)[0] == pytest.approx(0.1, abs=0.01)
    assert {outer_step_for(h)[1] for h in (2, 64)} == {0.9}
    given = ExchangeConfig(
        batch_micro_batches=1, share_micro_batches=1, local_steps=4, outer_lr=0.5, outer_momentum=0.5
    )
    assert given.outer_step == (0.5, 0.5)
    by_h = ExchangeConfig(batch_micro_batches=1, share_micro_batches=1, local_steps=16)
    assert by_h.outer_lr == 0 and by_h.outer_step == outer_step_for(16)
    with pytest.raises(ValueError, match="local_steps = 0"):
        outer_step_for(0)
