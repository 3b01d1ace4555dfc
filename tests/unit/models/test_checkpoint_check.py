"""models/checkpoint_check.py: a TracedShard writes its provenance into every checkpoint, and a
checkpoint is believed only when its provenance names the run, the shard and a holder the
reader expects."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from swarmd.models.checkpoint_check import Provenance, ShardLayout, TracedShard, check_checkpoint, open_traced
from swarmd.models.parameter_shard import ParameterShard
from swarmd.models.shard_config import ShardConfig, ShardError

pytestmark = pytest.mark.timeout(60)

CONFIG = ShardConfig(mode="gradient", lr=1e-2, weight_decay=0.0)
LAYOUT = ShardLayout("tiny." + "a" * 24, 1, 0, 2, (0, 50), "gradient")
HOLDER = "12D3KooWholder"


def _traced(tmp_path: Path, layout: ShardLayout = LAYOUT, holder: str = HOLDER) -> Path:
    shard = TracedShard(*layout.span, torch.randn(layout.span[1] - layout.span[0]), CONFIG, step_micro_batches=1)
    shard.provenance = Provenance.of(layout, holder)
    # The shard server passes its own metadata (the ledger): the provenance is written all the same.
    return shard.checkpoint(tmp_path / "s.safetensors", {"ledger": "{}"})


def _check(path: Path, layout: ShardLayout = LAYOUT, holders: tuple[str, ...] = (HOLDER,)) -> Provenance:
    shard = open_traced(path, CONFIG, 1, layout.span)
    return check_checkpoint(shard.metadata, (shard.lo, shard.hi), shard.version, layout, holders, str(path))


def test_a_traced_checkpoint_names_its_run_shard_and_holder(tmp_path: Path) -> None:
    path = _traced(tmp_path)
    assert _check(path) == Provenance.of(LAYOUT, HOLDER)
    shard = open_traced(path, CONFIG, 1, LAYOUT.span)
    assert isinstance(shard, TracedShard) and shard.metadata["ledger"] == "{}"


@pytest.mark.parametrize(
    ("layout", "message"),
    [
        (ShardLayout("tiny." + "b" * 24, 1, 0, 2, (0, 50), "gradient"), "is a state of run"),
        (ShardLayout(LAYOUT.run_id, 0, 0, 2, (0, 50), "gradient"), "is a state of shard \\(1, 0\\) of 2"),
        (ShardLayout(LAYOUT.run_id, 1, 1, 2, (0, 50), "gradient"), "is a state of shard \\(1, 0\\) of 2"),
        (ShardLayout(LAYOUT.run_id, 1, 0, 3, (0, 50), "gradient"), "is a state of shard \\(1, 0\\) of 2"),
    ],
)
def test_a_checkpoint_of_another_run_or_shard_is_refused(tmp_path: Path, layout: ShardLayout, message: str) -> None:
    path = _traced(tmp_path)
    with pytest.raises(ShardError, match=message):
        _check(path, layout)


def test_a_checkpoint_made_by_someone_else_is_refused(tmp_path: Path) -> None:
    path = _traced(tmp_path, holder="12D3KooWstranger")
    with pytest.raises(ShardError, match="made by 12D3KooWstranger, who is not a holder"):
        _check(path)


def test_a_checkpoint_at_another_version_than_sent_is_refused(tmp_path: Path) -> None:
    shard = open_traced(_traced(tmp_path), CONFIG, 1, LAYOUT.span)
    with pytest.raises(ShardError, match="holds version 0, not the 1000000 it was sent as"):
        check_checkpoint(shard.metadata, (0, 50), shard.version, LAYOUT, {HOLDER}, "it", sent_as=1_000_000)


def test_an_untraced_checkpoint_is_refused_and_an_untraced_shard_does_not_write_one(tmp_path: Path) -> None:
    plain = ParameterShard(0, 50, torch.zeros(50), CONFIG, step_micro_batches=1)
    path = plain.checkpoint(tmp_path / "plain.safetensors", {"ledger": "{}"})
    with pytest.raises(ShardError, match="does not name its run, stage, shard, shards, holder"):
        _check(path)
    untraced = TracedShard(0, 50, torch.zeros(50), CONFIG, step_micro_batches=1)
    with pytest.raises(ShardError, match="has no provenance"):
        untraced.checkpoint(tmp_path / "untraced.safetensors")
    assert not (tmp_path / "untraced.safetensors").exists()
