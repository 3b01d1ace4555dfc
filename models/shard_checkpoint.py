"""A parameter shard's checkpoint: its whole state in one safetensors file, written atomically.

Tensors: ``weights`` and ``residual`` (fp32, the slice's length); the optimizer's state,
``exp_avg`` and ``exp_avg_sq`` for AdamW (its step count in the metadata as ``adam_step``) or
``momentum`` for the outer step; ``share_ids`` and ``share_versions``, the IDs the shard is done
with and the version that settled each. Metadata: the format, mode, range and version, and the
caller's own strings (the share ledger) under ``caller.``, kept apart from the shard's own keys.
Buffered contributions are not in it: a stopping shard flushes them into a step first.

The metadata also carries ``digest``, :func:`swarmd.models.checkpoint.tensors_digest` of every
tensor. A reader believes nothing before it has checked the file whole: the format, the
digest, then every tensor's name, dtype, length and finiteness against the slice the header
names (and the slice and mode the caller expects). A file of the first format, written before
checkpoints carried a digest, cannot be told from a tampered one and is refused like one. Who
wrote a file (run, shard, holder) is the caller's to check: ``swarmd.models.checkpoint_check``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from swarmd.models.checkpoint import load_safetensors, load_safetensors_bytes, save_safetensors_atomic, tensors_digest
from swarmd.models.shard_config import ShardError

CHECKPOINT_FORMAT = "swarmd-parameter-shard-2"
_UNVERIFIABLE_FORMATS = {"swarmd-parameter-shard-1"}
"""Formats without a content digest: their tensors cannot be told from planted ones."""
_META_PREFIX = "caller."  # the caller's metadata keys, kept apart from the shard's own
_SLICE_TENSORS = ("weights", "residual", "exp_avg", "exp_avg_sq", "momentum")
"""fp32 vectors of the slice's length: the weights and the state stepped with them."""
_MODE_TENSORS = {"gradient": {"exp_avg", "exp_avg_sq"}, "local": {"momentum"}}
_REQUIRED = {"weights", "residual", "share_ids", "share_versions"}


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
        "digest": tensors_digest(tensors),
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
    def read(cls, path: str | Path, mode: str | None, expected_range: tuple[int, int] | None) -> ShardCheckpoint:
        """A checkpoint file, checked whole (module doc); refuses one of another format, or (with
        ``mode``) another mode, or (with ``expected_range``) another slice, with ShardError
        (CheckpointError: unreadable)."""
        tensors, meta = load_safetensors(path)
        return cls._checked(tensors, meta, str(path), mode, expected_range)

    @classmethod
    def parse(cls, data: bytes, mode: str | None, expected_range: tuple[int, int] | None) -> ShardCheckpoint:
        """As ``read``, for a checkpoint held in memory (one a peer sent)."""
        tensors, meta = load_safetensors_bytes(data)
        return cls._checked(tensors, meta, f"a {len(data)}-byte checkpoint", mode, expected_range)

    @classmethod
    def _checked(
        cls,
        tensors: dict[str, torch.Tensor],
        meta: dict[str, str],
        where: str,
        mode: str | None,
        expected_range: tuple[int, int] | None,
    ) -> ShardCheckpoint:
        found = meta.get("format")
        if found in _UNVERIFIABLE_FORMATS:
            raise ShardError(
                f"{where} is of format {found!r}, written before shard checkpoints carried a checksum; "
                "it cannot be verified: take the shard from its standby or holder"
            )
        if found != CHECKPOINT_FORMAT:
            raise ShardError(f"{where} is not a parameter-shard checkpoint (format {found!r})")
        digest = tensors_digest(tensors)
        if meta.get("digest") != digest:
            raise ShardError(
                f"{where}: checksum mismatch (the header says {str(meta.get('digest'))[:16]}, the tensors hash "
                f"to {digest[:16]}): it changed after it was written; not used"
            )
        lo, hi, version = _count(meta, "lo", where), _count(meta, "hi", where), _count(meta, "version", where)
        _count(meta, "adam_step", where)
        if lo >= hi:
            raise ShardError(f"{where} names the empty slice [{lo}, {hi})")
        if expected_range is not None and (lo, hi) != tuple(expected_range):
            raise ShardError(f"{where} holds shard [{lo}, {hi}); expected [{expected_range[0]}, {expected_range[1]})")
        if mode is not None and meta.get("mode") != mode:
            raise ShardError(f"{where} holds a {meta.get('mode')}-mode shard; this run's shards are {mode}")
        _check_tensors(tensors, meta.get("mode", ""), hi - lo, where)
        return cls(tensors, meta, (lo, hi), version)

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


def _count(meta: Mapping[str, str], key: str, where: str) -> int:
    value = meta.get(key, "")
    if not value.isdigit() or len(value) > 18:
        raise ShardError(f"{where}: header field {key!r} = {value[:32]!r} is not a count (0 to 10**18)")
    return int(value)


def _check_tensors(tensors: Mapping[str, torch.Tensor], mode: str, length: int, where: str) -> None:
    """Every tensor a restore reads: present, of its dtype and length, finite (a NaN in any of
    them reaches the weights at the next step)."""
    names = set(tensors)
    if mode not in _MODE_TENSORS:
        raise ShardError(f"{where} names mode {mode[:32]!r}; a shard's is one of {sorted(_MODE_TENSORS)}")
    allowed = _REQUIRED | _MODE_TENSORS[mode]
    if missing := sorted(_REQUIRED - names):
        raise ShardError(f"{where} lacks tensor(s) {missing}")
    if unexpected := sorted(names - allowed):
        raise ShardError(f"{where} holds tensor(s) {unexpected} that a {mode}-mode shard does not have")
    if mode == "gradient" and len(names & _MODE_TENSORS["gradient"]) == 1:
        raise ShardError(f"{where} holds one of exp_avg and exp_avg_sq without the other")
    for name in _SLICE_TENSORS:
        t = tensors.get(name)
        if t is None:
            continue
        if t.dtype != torch.float32 or t.dim() != 1 or t.numel() != length:
            raise ShardError(
                f"{where}: {name} is {t.dtype} {tuple(t.shape)}; the slice needs float32 of {length} elements"
            )
        if not bool(torch.isfinite(t).all()):
            raise ShardError(f"{where}: {name} holds NaN or infinite values; not used")
    if "exp_avg_sq" in tensors and bool((tensors["exp_avg_sq"] < 0).any()):
        raise ShardError(f"{where}: exp_avg_sq holds negative values, which AdamW never makes")
    ids, versions = tensors["share_ids"], tensors["share_versions"]
    for name, t in (("share_ids", ids), ("share_versions", versions)):
        if t.dtype != torch.int64 or t.dim() != 1:
            raise ShardError(f"{where}: {name} is {t.dtype} {tuple(t.shape)}; need a 1-D int64 tensor")
    if ids.numel() != versions.numel():
        raise ShardError(f"{where}: {ids.numel()} share IDs but {versions.numel()} versions")
