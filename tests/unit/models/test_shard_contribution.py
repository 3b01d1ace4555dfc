"""models/shard_contribution.py: the norm bound adapts to honest contributions, refuses the
absurd even during its warm-up, and cannot be dragged up by the senders it bounds."""

from __future__ import annotations

import pytest
import torch

from swarmd.models.parameter_shard import Outcome, ParameterShard
from swarmd.models.shard_config import ContributionError, ShardConfig

pytestmark = pytest.mark.timeout(60)

SIZE = 256


def vector(seed: int, scale: float = 1.0) -> torch.Tensor:
    g = torch.randn(SIZE, generator=torch.Generator().manual_seed(seed))
    return g / g.norm() * scale  # norm exactly ``scale``


def shard(**kw: object) -> ParameterShard:
    base: dict[str, object] = dict(mode="gradient", lr=1e-3, norm_warmup=3, max_norm_factor=10.0)
    base.update(kw)
    return ParameterShard(0, SIZE, torch.zeros(SIZE), ShardConfig(**base), step_micro_batches=10**6)  # type: ignore[arg-type]


def test_senders_flooding_clipped_contributions_cannot_raise_the_bound() -> None:
    s = shard()
    share = 0
    for cell in range(3):
        share += 1
        s.contribute(vector(share, 1.0), 0, 1, [share], 1.0, sender=f"honest-{cell}")
    assert s.norm_bound() == pytest.approx(10.0)
    for _ in range(200):  # each clipped to the bound, and recorded at it: one vote however many
        share += 1
        assert s.contribute(vector(share, 9e2), 0, 1, [share], 1.0, sender="liar").outcome is Outcome.BUFFERED
    assert s.counters.clipped == 200
    assert s.norm_bound() == pytest.approx(10.0)  # the honest median still: 10 x 1.0
    # A second liar's vote does not tip it either: the median of five votes is an honest one.
    share += 1
    s.contribute(vector(share, 9e2), 0, 1, [share], 1.0, sender="liar-2")
    assert s.norm_bound() == pytest.approx(10.0)


def test_the_absurd_is_refused_during_the_warm_up_with_the_norm_and_the_bound_in_the_message() -> None:
    s = shard(norm_warmup=8, refuse_norm_factor=1000.0)
    assert s.contribute(vector(1, 2.0), 0, 1, [1], 1.0, sender="a").outcome is Outcome.BUFFERED
    assert s.norm_bound() is None  # clipping waits for the warm-up
    assert s.contribute(vector(2, 1500.0), 0, 1, [2], 1.0, sender="b").outcome is Outcome.BUFFERED  # 750 x: kept
    with pytest.raises(ContributionError) as info:
        s.contribute(vector(3, 1e7), 0, 1, [3], 1.0, sender="c")
    message = str(info.value)
    assert info.value.reason == "norm" and "1e+07" in message and "bound" in message
    assert s.counters.refused_by == {"norm": 1} and s.counters.clipped == 0


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_contributions_are_refused_and_counted_by_reason(bad: float) -> None:
    s = shard()
    poisoned = vector(1)
    poisoned[7] = bad
    with pytest.raises(ContributionError) as info:
        s.contribute(poisoned, 0, 1, [1], 1.0, sender="a")
    assert info.value.reason == "finite"
    assert s.counters.refused == 1 and s.counters.refused_by == {"finite": 1} and s.buffered_micro_batches == 0
    assert s.contribute(vector(2), 0, 1, [1], 1.0, sender="a").outcome is Outcome.BUFFERED  # the share is not spent
