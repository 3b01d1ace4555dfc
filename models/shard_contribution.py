"""The checks a contribution passes before a shard buffers it.

First its form: a float vector of the slice's length, finite, computed on a version the shard
has made, over a sane number of micro-batches, for distinct share IDs, with a weight in
[0, 1]. Then its size, against the running median of accepted norms (a
``robust_aggregation.VoteMedian``: one vote per sender, so a few senders cannot drag it up and
then hide behind it): refused outright past ``refuse_norm_factor`` times it, and once
``norm_warmup`` norms are in, clipped to ``max_norm_factor`` times it. Honest gradients spike
early in training, and a bound that refused them dropped real work, so only the absurd is
refused, and during the warm-up only that. A clipped contribution's norm is recorded as the
bound, not as sent, so that what an attacker sends moves the median no more than an honest
contribution at the bound would.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from swarmd.models.robust_aggregation import VoteMedian
from swarmd.models.shard_config import ContributionError, ShardConfig

MAX_SHARE_IDS_PER_CONTRIBUTION = 100_000
MAX_MICRO_BATCHES = 10_000_000
"""The most micro-batches one contribution may claim to cover."""


def check_contribution(
    vector: torch.Tensor,
    base_version: int,
    micro_batches: int,
    share_ids: Sequence[int],
    weight: float,
    *,
    lo: int,
    hi: int,
    version: int,
) -> list[int]:
    """The share IDs of a well-formed contribution to shard ``[lo, hi)`` at ``version``;
    ContributionError, with its ``reason``, for a malformed one."""
    size = hi - lo
    if not isinstance(vector, torch.Tensor) or not vector.is_floating_point():
        kind = vector.dtype if isinstance(vector, torch.Tensor) else type(vector).__name__
        raise ContributionError("dtype", f"contribution is {kind}; send a float tensor")
    if vector.dim() != 1 or vector.numel() != size:
        raise ContributionError(
            "length",
            f"contribution has shape {tuple(vector.shape)}; shard [{lo}, {hi}) takes {size}",
        )
    if not bool(torch.isfinite(vector).all()):
        raise ContributionError("finite", f"contribution to shard [{lo}, {hi}) holds NaN or Inf; refused")
    if isinstance(base_version, bool) or not isinstance(base_version, int) or not 0 <= base_version <= version:
        raise ContributionError(
            "version", f"contribution claims base version {base_version!r}; this shard is at {version}"
        )
    if (
        isinstance(micro_batches, bool)
        or not isinstance(micro_batches, int)
        or not 1 <= micro_batches <= MAX_MICRO_BATCHES
    ):
        raise ContributionError(
            "micro_batches",
            f"contribution covers {micro_batches!r} micro-batches; the limit is 1 to {MAX_MICRO_BATCHES}",
        )
    ids = list(share_ids)
    if not 1 <= len(ids) <= MAX_SHARE_IDS_PER_CONTRIBUTION or len(set(ids)) != len(ids):
        raise ContributionError(
            "share_ids",
            f"contribution names {len(ids)} share IDs ({len(set(ids))} distinct); "
            f"name 1 to {MAX_SHARE_IDS_PER_CONTRIBUTION} distinct ones",
        )
    if any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in ids):
        raise ContributionError("share_ids", f"share IDs must be integers >= 0, got {ids[:5]}")
    if isinstance(weight, bool) or not isinstance(weight, int | float) or not 0 <= weight <= 1:  # and NaN
        raise ContributionError("weight", f"contribution weight {weight} must be in [0, 1]")
    return ids


class NormBound:
    """The running median of accepted contributions' norms (a vote per sender), and the bounds it sets."""

    def __init__(self, config: ShardConfig) -> None:
        self._config = config
        # The refusal bound needs one norm to stand on; clipping waits for the warm-up.
        self._norms = VoteMedian(config.norm_window, 1)

    def median(self) -> float | None:
        """The median of recent accepted norms (None: none seen yet)."""
        return self._norms.median()

    def bound(self) -> float | None:
        """The norm a contribution is clipped to now (None: too few seen to judge yet)."""
        median = self.median()
        if median is None or len(self._norms) < self._config.norm_warmup:
            return None
        return self._config.max_norm_factor * median

    def screen(self, vector: torch.Tensor, ids: Sequence[int]) -> tuple[torch.Tensor, float, bool]:
        """``vector`` clipped to the bound, its norm after that, and whether it was clipped;
        ContributionError (``norm``) past the refusal bound. ``ids`` name it in that message."""
        config = self._config
        norm = float(torch.linalg.vector_norm(vector))
        median = self.median()
        if median is not None and norm > config.refuse_norm_factor * median:
            raise ContributionError(
                "norm",
                f"contribution norm {norm:.4g} exceeds the bound {config.refuse_norm_factor * median:.4g} "
                f"({config.refuse_norm_factor:g} x the median of recent accepted norms, {median:.4g}); "
                f"refused (shares {list(ids[:3])}); a cell that sends this has diverged: check its loss",
            )
        bound = self.bound()
        if bound is not None and norm > bound:
            return vector * (bound / norm), bound, True
        return vector, norm, False

    def accept(self, sender: str, norm: float) -> None:
        """Count an accepted contribution's norm (as clipped) toward ``sender``'s vote."""
        self._norms.add(sender, norm)
