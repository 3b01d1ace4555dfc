"""models/shard_checkpoint.py: a shard checkpoint is read whole before anything of it is used:
its digest, then every tensor's dtype, length and finiteness; a truncated, tampered, NaN or
first-format file is refused with the reason."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from swarmd.models.checkpoint import CheckpointError, load_safetensors, save_safetensors_atomic, tensors_digest
from swarmd.models.shard_checkpoint import ShardCheckpoint, write_shard_checkpoint
from swarmd.models.shard_config import ShardError

pytestmark = pytest.mark.timeout(60)

SPAN = (100, 164)
LENGTH = SPAN[1] - SPAN[0]


def _write(path: Path, weights: torch.Tensor | None = None, mode: str = "gradient") -> Path:
    g = torch.Generator().manual_seed(0)
    weights = torch.randn(LENGTH, generator=g) if weights is None else weights
    state = (
        {"step": torch.tensor(3.0), "exp_avg": torch.randn(LENGTH, generator=g), "exp_avg_sq": torch.rand(LENGTH)}
        if mode == "gradient"
        else {"momentum_buffer": torch.randn(LENGTH, generator=g)}
    )
    write_shard_checkpoint(
        path,
        span=SPAN,
        mode=mode,
        version=7,
        weights=weights,
        residual=torch.zeros(LENGTH),
        optimizer_state=state,
        done={11: 6, 12: 7},
        caller={"ledger": "{}"},
    )
    return path


def _rewrite(path: Path, change: dict[str, torch.Tensor], *, digest: bool) -> None:
    """Change tensors in a written checkpoint, keeping its header; with ``digest`` the attacker
    also recomputes the checksum (only the other checks can catch it then)."""
    tensors, meta = load_safetensors(path)
    tensors.update(change)
    if digest:
        meta["digest"] = tensors_digest(tensors)
    save_safetensors_atomic(tensors, path, meta)


@pytest.mark.parametrize("mode", ["gradient", "local"])
def test_a_written_checkpoint_reads_back_from_file_and_from_bytes(tmp_path: Path, mode: str) -> None:
    path = _write(tmp_path / "s.safetensors", mode=mode)
    for saved in (ShardCheckpoint.read(path, mode, SPAN), ShardCheckpoint.parse(path.read_bytes(), mode, SPAN)):
        assert saved.span == SPAN and saved.version == 7
        assert saved.done() == [(11, 6), (12, 7)] and saved.caller_metadata() == {"ledger": "{}"}
        assert set(saved.optimizer_state()) == (
            {"step", "exp_avg", "exp_avg_sq"} if mode == "gradient" else {"momentum_buffer"}
        )


def test_nan_weights_with_the_header_kept_are_refused_by_the_checksum(tmp_path: Path) -> None:
    path = _write(tmp_path / "s.safetensors")
    _rewrite(path, {"weights": torch.full((LENGTH,), float("nan"))}, digest=False)
    with pytest.raises(ShardError, match="checksum mismatch"):
        ShardCheckpoint.read(path, "gradient", SPAN)


@pytest.mark.parametrize("tensor", ["weights", "residual", "exp_avg", "exp_avg_sq"])
@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_non_finite_tensors_are_refused_even_with_a_matching_checksum(
    tmp_path: Path, tensor: str, value: float
) -> None:
    path = _write(tmp_path / "s.safetensors")
    bad = torch.zeros(LENGTH)
    bad[5] = value
    _rewrite(path, {tensor: bad}, digest=True)
    with pytest.raises(ShardError, match=f"{tensor} holds NaN or infinite"):
        ShardCheckpoint.parse(path.read_bytes(), "gradient", SPAN)


def test_a_flipped_byte_is_a_checksum_mismatch(tmp_path: Path) -> None:
    path = _write(tmp_path / "s.safetensors")
    data = bytearray(path.read_bytes())
    data[-20] ^= 0x01  # inside the last tensor's bytes: the header still parses
    with pytest.raises(ShardError, match="checksum mismatch"):
        ShardCheckpoint.parse(bytes(data), "gradient", SPAN)


@pytest.mark.parametrize("keep", [0, 8, 50, 0.5, -1])
def test_a_truncated_checkpoint_is_refused(tmp_path: Path, keep: float) -> None:
    data = _write(tmp_path / "s.safetensors").read_bytes()
    cut = data[: int(len(data) * keep)] if isinstance(keep, float) else data[:keep]
    (tmp_path / "cut.safetensors").write_bytes(cut)
    with pytest.raises(CheckpointError, match="truncated|too short"):
        ShardCheckpoint.parse(cut, "gradient", SPAN)
    with pytest.raises(CheckpointError, match="truncated"):
        ShardCheckpoint.read(tmp_path / "cut.safetensors", "gradient", SPAN)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"weights": torch.zeros(LENGTH, dtype=torch.float16)}, "weights is torch.float16"),
        ({"residual": torch.zeros(LENGTH - 1)}, "residual is torch.float32 \\(63,\\)"),
        ({"exp_avg_sq": -torch.ones(LENGTH)}, "negative"),
        ({"momentum": torch.zeros(LENGTH)}, "does not have"),
        ({"share_versions": torch.zeros(1, dtype=torch.int64)}, "2 share IDs but 1 versions"),
    ],
)
def test_wrong_dtypes_shapes_and_tensors_are_refused(
    tmp_path: Path, change: dict[str, torch.Tensor], message: str
) -> None:
    path = _write(tmp_path / "s.safetensors")
    _rewrite(path, change, digest=True)
    with pytest.raises(ShardError, match=message):
        ShardCheckpoint.read(path, "gradient", SPAN)


def test_another_slice_mode_or_garbled_header_is_refused(tmp_path: Path) -> None:
    path = _write(tmp_path / "s.safetensors")
    with pytest.raises(ShardError, match="expected \\[0, 64\\)"):
        ShardCheckpoint.read(path, "gradient", (0, 64))
    with pytest.raises(ShardError, match="gradient-mode shard; this run's shards are local"):
        ShardCheckpoint.read(path, "local", SPAN)
    tensors, meta = load_safetensors(path)
    save_safetensors_atomic(tensors, path, {**meta, "version": "-3"})
    with pytest.raises(ShardError, match="'version' = '-3' is not a count"):
        ShardCheckpoint.read(path, "gradient", SPAN)


def test_a_first_format_checkpoint_without_a_checksum_is_refused(tmp_path: Path) -> None:
    path = _write(tmp_path / "s.safetensors")
    tensors, meta = load_safetensors(path)
    del meta["digest"]
    save_safetensors_atomic(tensors, path, {**meta, "format": "swarmd-parameter-shard-1"})
    with pytest.raises(ShardError, match="before shard checkpoints carried a checksum"):
        ShardCheckpoint.read(path, "gradient", SPAN)
