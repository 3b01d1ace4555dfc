"""models/parameter_shard.py: sharded optimizers equal one, fp16 deltas with error feedback,
exact replay at a standby, idempotent share IDs, staleness drops, checks, and checkpoints."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from swarmd.errors import SwarmdError
from swarmd.models.lr_schedule import LrSchedule
from swarmd.models.parameter_shard import Outcome, ParameterShard
from swarmd.models.shard_config import ContributionError, ShardConfig, ShardError

pytestmark = pytest.mark.timeout(60)

SIZE = 1000
CUT = 437  # two uneven shards: [0, 437) and [437, 1000)


def vector(seed: int, scale: float = 1.0) -> torch.Tensor:
    return torch.randn(SIZE, generator=torch.Generator().manual_seed(seed)) * scale


def adamw(**kw: object) -> ShardConfig:
    base: dict[str, object] = dict(mode="gradient", lr=1e-2, weight_decay=0.1, betas=(0.8, 0.99), eps=1e-6)
    base.update(kw)
    return ShardConfig(**base)  # type: ignore[arg-type]


def nesterov(**kw: object) -> ShardConfig:
    base: dict[str, object] = dict(mode="local", lr=1e-3, outer_lr=0.7, outer_momentum=0.9)
    base.update(kw)
    return ShardConfig(**base)  # type: ignore[arg-type]


def two_shards(config: ShardConfig, initial: torch.Tensor, step_micro_batches: int = 1) -> list[ParameterShard]:
    ranges = [(0, CUT), (CUT, SIZE)]
    return [ParameterShard(lo, hi, initial[lo:hi], config, step_micro_batches=step_micro_batches) for lo, hi in ranges]


def contribute_all(shards: list[ParameterShard], full: torch.Tensor, share_id: int, micro_batches: int = 1) -> None:
    for shard in shards:
        result = shard.contribute(full[shard.lo : shard.hi], shard.version, micro_batches, [share_id], 1.0)
        assert result.outcome is Outcome.BUFFERED
        if result.step is not None:
            shard.confirm(result.step.version)


def unrounded(shards: list[ParameterShard]) -> torch.Tensor:
    """Weights plus residual: the trajectory the optimizer would follow without fp16 deltas."""
    parts = []
    for s in shards:
        weights = s.weights()
        assert weights is not None
        parts.append(weights[1] + s.residual)
    return torch.cat(parts)


@pytest.mark.parametrize("mode", ["gradient", "local"])
def test_two_shards_equal_one_unsharded_optimizer(mode: str) -> None:
    initial = vector(0)
    config = adamw() if mode == "gradient" else nesterov()
    shards = two_shards(config, initial)
    param = torch.nn.Parameter(initial.clone())
    reference: torch.optim.Optimizer = (
        torch.optim.AdamW([param], lr=1e-2, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1)
        if mode == "gradient"
        else torch.optim.SGD([param], lr=0.7, momentum=0.9, nesterov=True)
    )
    for step in range(6):
        grad = vector(100 + step, scale=0.01)
        contribute_all(shards, grad, share_id=step)
        param.grad = grad.clone()
        reference.step()
        assert [s.version for s in shards] == [step + 1, step + 1]
    torch.testing.assert_close(unrounded(shards), param.detach(), atol=1e-6, rtol=0)


def test_weights_are_old_plus_the_fp16_delta_and_the_residual_keeps_the_rest() -> None:
    initial = vector(1)
    (shard,) = [ParameterShard(0, SIZE, initial, adamw(), step_micro_batches=1)]
    param = torch.nn.Parameter(initial.clone())
    reference = torch.optim.AdamW([param], lr=1e-2, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1)
    grad = vector(2, scale=0.01)
    result = shard.contribute(grad, 0, 1, [7], 1.0)
    assert result.step is not None and result.step.delta.dtype == torch.float16
    param.grad = grad.clone()
    reference.step()
    change = param.detach() - initial
    delta = result.step.delta
    # fp16 is what the cells get; the residual is what it rounded off, kept for the next step.
    assert torch.equal(delta, change.to(torch.float16))
    assert torch.equal(shard.residual, change - delta.float())
    assert shard.residual.abs().max() > 0  # the rounding is real at lr 1e-2
    shard.confirm(result.step.version)
    weights = shard.weights()
    assert weights is not None and torch.equal(weights[1], initial + delta.float())

    # The next step carries the residual: its delta is fp16(change + residual).
    before, residual = weights[1], shard.residual
    grad2 = vector(3, scale=0.01)
    second = shard.contribute(grad2, 1, 1, [8], 1.0)
    assert second.step is not None
    param.data.copy_(before)  # the reference steps from the authoritative weights too
    param.grad = grad2.clone()
    reference.step()
    carried = (param.detach() - before) + residual
    assert torch.equal(second.step.delta, carried.to(torch.float16))
    shard.confirm(2)
    after = shard.weights()
    assert after is not None and torch.equal(after[1], before + second.step.delta.float())


def test_a_cell_applying_the_deltas_holds_the_server_weights_bit_for_bit() -> None:
    initial = vector(4)
    shard = ParameterShard(CUT, SIZE, initial[CUT:], adamw(), step_micro_batches=2)
    cell_copy = initial[CUT:].clone()
    have = 0
    for step in range(5):
        for half in range(2):
            result = shard.contribute(vector(10 * step + half, 0.01)[CUT:], shard.version, 1, [2 * step + half], 1.0)
        assert result.step is not None
        assert shard.deltas_since(have) == []  # not committed until confirmed
        shard.confirm(result.step.version)
        deltas = shard.deltas_since(have)
        assert deltas is not None and [v for v, _ in deltas] == [step + 1]
        for _, delta in deltas:
            cell_copy += delta.float()
        have = deltas[-1][0]
    weights = shard.weights()
    assert weights is not None and torch.equal(weights[1], cell_copy)


def test_a_standby_replaying_the_log_on_an_older_checkpoint_matches_bit_for_bit(tmp_path: Path) -> None:
    initial = vector(5)
    primary = ParameterShard(0, SIZE, initial, adamw(), step_micro_batches=1)
    log = []
    for step in range(6):
        result = primary.contribute(vector(50 + step, 0.01), primary.version, 1, [step], 1.0)
        assert result.step is not None
        log.append(result.step)
        primary.confirm(result.step.version)
        if step == 1:
            primary.checkpoint(tmp_path / "replica.safetensors", {"ledger": "{}"})
    standby = ParameterShard.from_checkpoint(tmp_path / "replica.safetensors", adamw(), step_micro_batches=1)
    assert standby.version == 2
    for entry in log:  # the first two are in the checkpoint already: skipped
        applied = standby.apply_logged(entry.version, entry.delta, entry.share_ids)
        assert applied == (entry.version > 2)
    a, b = primary.weights(), standby.weights()
    assert a is not None and b is not None and a[0] == b[0] == 6 and torch.equal(a[1], b[1])
    assert standby.committed(range(10)) == set(range(6))
    # A resend to the new holder of a share the old one committed is not applied twice.
    again = standby.contribute(vector(99, 0.01), 6, 1, [3], 1.0)
    assert again.outcome is Outcome.DUPLICATE and standby.version == 6
    assert standby.deltas_since(4) is not None  # replayed deltas serve pulls
    with pytest.raises(ShardError, match="does not follow"):
        standby.apply_logged(8, log[0].delta, [])


def test_duplicates_are_acknowledged_not_applied() -> None:
    shard = ParameterShard(0, SIZE, vector(6), adamw(), step_micro_batches=4)
    assert shard.contribute(vector(1, 0.01), 0, 2, [1, 2], 1.0).outcome is Outcome.BUFFERED
    assert shard.contribute(vector(1, 0.01), 0, 2, [2, 1], 1.0).outcome is Outcome.DUPLICATE  # a resend
    step = shard.contribute(vector(2, 0.01), 0, 2, [4], 1.0).step
    assert step is not None and set(step.share_ids) == {1, 2, 4}
    assert shard.committed([1, 2, 4]) == set()  # applied, not yet logged at the standby
    shard.confirm(step.version)
    assert shard.committed([1, 2, 4, 5]) == {1, 2, 4}
    assert shard.contribute(vector(3, 0.01), 1, 1, [4], 1.0).outcome is Outcome.DUPLICATE
    assert shard.counters.duplicates == 2 and shard.counters.applied == 2 and shard.version == 1


def test_a_contribution_naming_shares_partly_taken_is_refused_and_settles_nothing() -> None:
    # Issue 26's squat: one contribution naming a share already in and the next 1,023 IDs was
    # answered ALREADY_APPLIED and its fresh IDs settled, so every honest contribution for them
    # was a duplicate and nothing trained on them. Now it is refused whole and settles nothing.
    shard = ParameterShard(0, SIZE, vector(6), adamw(), step_micro_batches=4)
    assert shard.contribute(vector(1, 0.01), 0, 2, [1], 1.0).outcome is Outcome.BUFFERED
    squat = [1, *range(2, 1025)]
    with pytest.raises(ContributionError) as refused:
        shard.contribute(vector(2, 0.01), 0, 1, squat, 1.0)
    assert refused.value.reason == "overlap" and shard.counters.refused_by == {"overlap": 1}
    assert shard.unknown(list(range(2, 1025))) == list(range(2, 1025)) and shard.buffered_micro_batches == 2
    honest = shard.contribute(vector(3, 0.01), 0, 2, [2], 1.0)  # the share's own contribution is taken
    assert honest.outcome is Outcome.BUFFERED and honest.step is not None
    assert set(honest.step.share_ids) == {1, 2}  # only what was applied is logged as done


def test_a_sum_of_several_cells_is_taken_whole_or_refused_never_in_part() -> None:
    # A reduction head's sum names shares of two cells; one of them sent its slice by itself
    # first (it gave up on its head): the sum cannot be taken apart, so it is refused and
    # nothing of it is settled: the head sends the parts one by one.
    shard = ParameterShard(0, SIZE, vector(6), adamw(), step_micro_batches=8)
    assert shard.contribute(vector(1, 0.01), 0, 2, [1], 1.0).outcome is Outcome.BUFFERED
    with pytest.raises(ContributionError) as refused:
        shard.contribute(vector(2, 0.01), 0, 4, [1, 2], 1.0, parts=2)
    assert refused.value.reason == "overlap" and shard.buffered_micro_batches == 2
    assert shard.committed([2]) == set()  # the other cell's share is not settled unapplied
    assert shard.contribute(vector(3, 0.01), 0, 2, [2], 1.0).outcome is Outcome.BUFFERED
    assert shard.contribute(vector(4, 0.01), 0, 4, [3, 4], 1.0, parts=2).outcome is Outcome.BUFFERED


def test_recent_share_ids_are_bounded() -> None:
    shard = ParameterShard(0, SIZE, vector(7), adamw(recent_share_ids=3), step_micro_batches=1)
    for i in range(5):
        shard.confirm(shard.contribute(vector(i, 0.01), shard.version, 1, [i], 1.0).version)
    assert shard.committed(range(5)) == {2, 3, 4}


def test_staleness_weight_zero_drops_and_a_low_weight_shrinks_the_step() -> None:
    initial = vector(8)
    shard = ParameterShard(0, SIZE, initial, nesterov(outer_momentum=0.0), step_micro_batches=2)
    dropped = shard.contribute(vector(1), 0, 1, [1], 0.0)
    assert dropped.outcome is Outcome.DROPPED and shard.buffered_micro_batches == 0
    assert shard.counters.dropped == 1 and shard.committed([1]) == {1}
    # Plain SGD (no momentum): the step is outer_lr times the buffered sum over the counted micro-batches.
    g = vector(2)
    shard.contribute(g, 0, 1, [2], 1.0)
    step = shard.contribute(g, 0, 1, [3], 0.5).step
    assert step is not None and 1 in step.share_ids  # the dropped ID reaches the standby's log
    expected = -0.7 * (1.0 * g + 0.5 * g) / 2
    torch.testing.assert_close(unrounded_single(shard) - initial, expected, atol=1e-6, rtol=0)


def unrounded_single(shard: ParameterShard) -> torch.Tensor:
    shard.confirm(shard.version)
    return unrounded([shard])


def test_step_threshold_is_changeable_and_flush_steps_a_partial_buffer() -> None:
    shard = ParameterShard(0, SIZE, vector(9), adamw(), step_micro_batches=10)
    assert shard.contribute(vector(1, 0.01), 0, 3, [1], 1.0).step is None
    shard.step_micro_batches = 5
    assert shard.contribute(vector(2, 0.01), 0, 3, [2], 1.0).step is not None
    assert shard.flush() is None
    shard.contribute(vector(3, 0.01), 1, 1, [3], 1.0)
    flushed = shard.flush()
    assert flushed is not None and flushed.version == 2 and flushed.micro_batches == 1
    with pytest.raises(ShardError, match="step_micro_batches"):
        shard.step_micro_batches = 0


@pytest.mark.parametrize(
    ("kwargs", "reason"),
    [
        ({"vector": torch.zeros(SIZE - 1)}, "length"),
        ({"vector": torch.zeros(SIZE, dtype=torch.long)}, "dtype"),
        ({"vector": torch.full((SIZE,), float("nan"))}, "finite"),
        ({"vector": torch.full((SIZE,), float("inf"))}, "finite"),
        ({"base_version": 1}, "version"),
        ({"micro_batches": 0}, "micro_batches"),
        ({"share_ids": []}, "share_ids"),
        ({"share_ids": [1, 1]}, "share_ids"),
        ({"share_ids": [-1]}, "share_ids"),
        ({"weight": 1.5}, "weight"),
        ({"weight": float("nan")}, "weight"),
    ],
)
def test_malformed_contributions_are_refused_before_they_touch_anything(kwargs: dict[str, object], reason: str) -> None:
    shard = ParameterShard(0, SIZE, vector(10), adamw(), step_micro_batches=1)
    args: dict[str, object] = dict(vector=torch.zeros(SIZE), base_version=0, micro_batches=1, share_ids=[1], weight=1.0)
    args.update(kwargs)
    with pytest.raises(ContributionError) as info:
        shard.contribute(**args)  # type: ignore[arg-type]
    assert info.value.reason == reason and isinstance(info.value, SwarmdError)
    assert shard.counters.refused == 1 and shard.version == 0 and shard.buffered_micro_batches == 0
    assert shard.committed([1]) == set()


def test_a_contribution_above_the_running_median_norm_is_clipped_and_an_absurd_one_refused() -> None:
    config = adamw(norm_warmup=4, max_norm_factor=10.0, refuse_norm_factor=100.0)
    shard = ParameterShard(0, SIZE, vector(11), config, step_micro_batches=100)
    huge = vector(0, scale=1000.0)
    norms = []
    for i in range(4):
        assert shard.norm_bound() is None
        shard.contribute(vector(i, scale=1.0 + i / 10), 0, 1, [i], 1.0)
        norms.append(float(vector(i, scale=1.0 + i / 10).norm()))
    bound = shard.norm_bound()
    ordered = sorted(norms)
    assert bound == pytest.approx(10 * (ordered[1] + ordered[2]) / 2)  # 10 x the median of the four
    with pytest.raises(ContributionError) as info:
        shard.contribute(huge, 0, 1, [99], 1.0)
    assert info.value.reason == "norm" and shard.counters.refused == 1 and shard.buffered_micro_batches == 4
    assert shard.contribute(vector(5, scale=5.0), 0, 1, [5], 1.0).outcome is Outcome.BUFFERED
    assert shard.counters.clipped == 0
    large = vector(6, scale=30.0)  # 30 x: above the clipping bound, below the refusal
    assert shard.contribute(large, 0, 1, [6], 1.0).outcome is Outcome.BUFFERED
    assert shard.counters.clipped == 1


def test_pulls_see_committed_versions_only_and_fall_back_to_weights() -> None:
    shard = ParameterShard(0, SIZE, vector(12), adamw(keep_versions=2), step_micro_batches=1)
    for i in range(3):
        step = shard.contribute(vector(i, 0.01), shard.version, 1, [i], 1.0).step
        assert step is not None
        shard.confirm(step.version)
    deltas = shard.deltas_since(1)
    assert deltas is not None and [v for v, _ in deltas] == [2, 3]
    assert shard.deltas_since(0) is None  # older than the kept history
    assert shard.deltas_since(3) == []
    assert shard.deltas_since(7) is None  # a lineage this shard does not know
    shard.contribute(vector(9, 0.01), 3, 1, [9], 1.0)
    assert shard.version == 4 and shard.weights() is None  # version 4 awaits its log at the standby
    assert shard.deltas_since(3) == []
    with pytest.raises(ShardError, match="confirm version 5"):
        shard.confirm(5)
    shard.confirm(4)
    weights = shard.weights()
    assert weights is not None and weights[0] == 4


@pytest.mark.parametrize("mode", ["gradient", "local"])
def test_checkpoint_round_trip_resumes_exactly(mode: str, tmp_path: Path) -> None:
    config = adamw() if mode == "gradient" else nesterov()
    shard = ParameterShard(CUT, SIZE, vector(13)[CUT:], config, step_micro_batches=1)
    for i in range(3):
        shard.confirm(shard.contribute(vector(i, 0.01)[CUT:], shard.version, 1, [10 + i], 1.0).version)
    shard.contribute(vector(5, 0.01)[CUT:], 3, 1, [20], 0.0)  # a dropped share: settled, remembered
    path = shard.checkpoint(tmp_path / "shard.safetensors", {"ledger": '{"cursor": 12}'})
    restored = ParameterShard.from_checkpoint(path, config, step_micro_batches=1, expected_range=(CUT, SIZE))
    assert restored.version == restored.committed_version == 3
    assert restored.metadata == {"ledger": '{"cursor": 12}'}
    assert torch.equal(restored.residual, shard.residual)
    assert restored.committed(range(30)) == {10, 11, 12, 20}
    # The same next step on both: identical only if the optimizer state came back too.
    grad = vector(42, 0.01)[CUT:]
    a = shard.contribute(grad, 3, 1, [30], 1.0).step
    b = restored.contribute(grad, 3, 1, [30], 1.0).step
    assert a is not None and b is not None and torch.equal(a.delta, b.delta)

    with pytest.raises(ShardError, match="expected"):
        ParameterShard.from_checkpoint(path, config, step_micro_batches=1, expected_range=(0, CUT))
    other = nesterov() if mode == "gradient" else adamw()
    with pytest.raises(ShardError, match="mode"):
        ParameterShard.from_checkpoint(path, other, step_micro_batches=1)


def test_construction_and_config_are_validated() -> None:
    with pytest.raises(ShardError, match="needs a float vector of 10"):
        ParameterShard(0, 10, torch.zeros(9), adamw(), step_micro_batches=1)
    with pytest.raises(ShardError, match="NaN"):
        ParameterShard(0, 2, torch.tensor([0.0, float("nan")]), adamw(), step_micro_batches=1)
    with pytest.raises(ShardError, match="empty"):
        ParameterShard(5, 5, torch.zeros(0), adamw(), step_micro_batches=1)
    for kw in ({"mode": "sgd"}, {"lr": 0.0}, {"betas": (0.9, 1.0)}, {"outer_momentum": 1.0}, {"keep_versions": 0}):
        with pytest.raises(ValueError):
            adamw(**kw)


def test_a_gradient_shard_steps_at_its_schedules_rate_by_version() -> None:
    schedule = LrSchedule(1e-2, warmup_steps=4)
    shards = two_shards(adamw(weight_decay=0.0, schedule=schedule), vector(0))
    param = torch.nn.Parameter(vector(0))
    reference = torch.optim.AdamW([param], lr=1e-2, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.0)
    rates = torch.optim.lr_scheduler.LambdaLR(reference, lambda step: min(1.0, (step + 1) / 4))
    for step in range(6):
        grad = vector(100 + step, scale=0.01)
        contribute_all(shards, grad, share_id=step)
        param.grad = grad.clone()
        reference.step()
        rates.step()
    torch.testing.assert_close(unrounded(shards), param.detach(), atol=1e-6, rtol=0)
    # Adam's first step moves every weight by about its rate: a quarter of the peak here.
    first = two_shards(adamw(weight_decay=0.0, schedule=schedule), vector(0))
    contribute_all(first, vector(100, scale=0.01), share_id=0)
    assert float((unrounded(first) - vector(0)).abs().max()) == pytest.approx(2.5e-3, rel=1e-3)
