"""A parameter shard's checkpoint: its whole state in one safetensors file, written atomically.

Tensors: ``weights`` and ``residual`` (fp32, the slice's length); the optimizer's state,
``exp_avg`` and ``exp_avg_sq`` for AdamW (its step count in the metadata as ``adam_step``) or
``momentum`` for the outer step; ``share_ids`` and ``share_versions``, the IDs the shard is done
with and the version that settled each. Metadata: the format, mode, range and version, and the
caller's own strings (the share ledger) under ``caller.``, kept apart from the shard's own keys.
Buffered contributions are not in it: a stopping shard flushes them into a step first.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from swarmd.models.checkpoint import load_safetensors, save_safetensors_atomic
from swarmd.models.shard_config import ShardError

CHECKPOINT_FORMAT = "swarmd-parameter-shard-1"
_META_PREFIX = "caller."  # the caller's metadata keys, kept apart from the shard's own


def write_shard_checkpoint(
    path: Path,
    *,
    span: tuple[int, int],
    mode: str,
    version: int,
    weights: torch.Tensor,
    residual: torch.Tensor,
    optimizer_state: Mapping[str, Any],
    done: Mapping[int, int],
    caller: Mapping[str, str],
) -> None:
    """Write slice ``span``'s state at ``version``; ``optimizer_state`` is torch's state of the
    slice's parameter ({} before its first step), ``done`` the share IDs with their versions."""
    lo, hi = span
    tensors = {"weights": weights, "residual": residual}
    step = 0
    if mode == "gradient" and optimizer_state:
        tensors["exp_avg"], tensors["exp_avg_sq"] = optimizer_state["exp_avg"], optimizer_state["exp_avg_sq"]
        step = int(float(optimizer_state["step"]))
    elif optimizer_state.get("momentum_buffer") is not None:
        tensors["momentum"] = optimizer_state["momentum_buffer"]
    tensors["share_ids"] = torch.tensor(list(done), dtype=torch.int64)
    tensors["share_versions"] = torch.tensor(list(done.values()), dtype=torch.int64)
    own = {
        "format": CHECKPOINT_FORMAT,
        "mode": mode,
        "lo": str(lo),
        "hi": str(hi),
        "version": str(version),
        "adam_step": str(step),
    }
    save_safetensors_atomic(tensors, path, {**own, **{_META_PREFIX + k: v for k, v in caller.items()}})


@dataclass(frozen=True)
class ShardCheckpoint:
    """A shard checkpoint whose header was checked; the rest is parsed when asked for, in the
    order a restore needs it."""

    tensors: dict[str, torch.Tensor]
    meta: dict[str, str]
    span: tuple[int, int]
    version: int

    @classmethod
    def read(cls, path: str | Path, mode: str, expected_range: tuple[int, int] | None) -> ShardCheckpoint:
        """Refuses a file of another format or mode, or (with ``expected_range``) another slice."""
        tensors, meta = load_safetensors(path)
        if meta.get("format") != CHECKPOINT_FORMAT:
            raise ShardError(f"{path} is not a parameter-shard checkpoint (format {meta.get('format')!r})")
        lo, hi = int(meta["lo"]), int(meta["hi"])
        if expected_range is not None and (lo, hi) != tuple(expected_range):
            raise ShardError(f"{path} holds shard [{lo}, {hi}); expected [{expected_range[0]}, {expected_range[1]})")
        if meta.get("mode") != mode:
            raise ShardError(f"{path} holds a {meta.get('mode')}-mode shard; this run's shards are {mode}")
        return cls(tensors, meta, (lo, hi), int(meta["version"]))

    @property
    def weights(self) -> torch.Tensor:
        return self.tensors["weights"]

    def optimizer_state(self) -> dict[str, torch.Tensor]:
        """torch's state for the slice's parameter ({} when the optimizer had not stepped)."""
        tensors = self.tensors
        adam_step = int(self.meta.get("adam_step", "0"))
        if "exp_avg" in tensors and adam_step > 0:
            return {
                "step": torch.tensor(float(adam_step)),
                "exp_avg": tensors["exp_avg"].clone(),
                "exp_avg_sq": tensors["exp_avg_sq"].clone(),
            }
        if "momentum" in tensors:
            return {"momentum_buffer": tensors["momentum"].clone()}
        return {}

    def done(self) -> list[tuple[int, int]]:
        """The share IDs the shard was done with and each one's version, least recently settled first."""
        ids, versions = self.tensors["share_ids"].tolist(), self.tensors["share_versions"].tolist()
        return [(int(i), int(v)) for i, v in zip(ids, versions, strict=True)]

    def caller_metadata(self) -> dict[str, str]:
        """The caller's strings, as it passed them to the write."""
        return {k[len(_META_PREFIX) :]: v for k, v in self.meta.items() if k.startswith(_META_PREFIX)}
