"""The fp16 deltas a shard sends to cells: error feedback, and the recent ones kept for pulls.

fp16 halves what a pull carries, but it rounds, and rounding that were simply dropped would
drift a cell's weights away from the shard's. So the residual (what fp16 rounded off, or
clipped to its range) is kept here and added to the next step's change: the authoritative
weights become ``old + fp16(change + residual).float()`` exactly. A cell that adds the deltas
in order holds these weights bit for bit; a standby that replays them on a checkpoint does too.

The last ``keep_versions`` deltas are kept, so that a cell a few versions behind pulls only
those; one further behind gets the whole slice in fp32.
"""

from __future__ import annotations

from collections import deque

import torch

from swarmd.models.shard_config import ShardError

FP16_MAX = float(torch.finfo(torch.float16).max)


class DeltaLog:
    """A shard's residual of what fp16 has not yet carried, and its recent deltas by version."""

    def __init__(self, like: torch.Tensor, keep_versions: int) -> None:
        self._residual = torch.zeros_like(like)
        self._history: deque[tuple[int, torch.Tensor]] = deque(maxlen=keep_versions)

    def encode(self, change: torch.Tensor) -> torch.Tensor:
        """The fp16 delta that carries ``change`` (fp32) and what earlier deltas left over; the
        residual keeps the rest for the next step."""
        with torch.no_grad():
            self._residual.add_(change)
            delta = self._residual.clamp(-FP16_MAX, FP16_MAX).to(torch.float16)
            self._residual.sub_(delta.to(torch.float32))
        return delta

    def record(self, version: int, delta: torch.Tensor) -> None:
        """Keep ``delta``, the one that made ``version``, for pulls."""
        self._history.append((version, delta))

    def since(self, have: int, committed_version: int) -> list[tuple[int, torch.Tensor]] | None:
        """The deltas after version ``have`` up to ``committed_version``, oldest first ([] when up
        to date), or None when they are not all kept: ``have`` older than the kept history, or
        newer than ``committed_version`` (a lineage this shard does not know)."""
        if have < 0:
            raise ShardError(f"a cell claims version {have}; versions start at 0")
        if have == committed_version:
            return []
        if have > committed_version or not self._history or self._history[0][0] > have + 1:
            return None
        return [(v, d) for v, d in self._history if have < v <= committed_version]

    @property
    def residual(self) -> torch.Tensor:
        """A copy of what fp16 has not yet carried to the cells."""
        return self._residual.clone()

    def restore_residual(self, residual: torch.Tensor) -> None:
        """Take a checkpoint's residual, refusing one of another length or with NaN or Inf."""
        if residual.shape != self._residual.shape or not bool(torch.isfinite(residual).all()):
            raise ShardError(
                f"checkpointed residual {tuple(residual.shape)} does not fit shard of {self._residual.numel()}"
            )
        self._residual.copy_(residual)
