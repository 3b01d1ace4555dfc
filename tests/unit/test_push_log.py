"""daemon/push_log.py with the parameter server: a checkpoint plus the logged pushes since
rebuilds the exact state, whatever was summed but not yet stepped at the checkpoint."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from swarmd.models.param_server import ServerConfig, StageParameterServer, checkpoint_log_seq
from swarmd.push_log import PushLog
from swarmd.stage_host import deserialize_tensors, serialize_tensors

pytestmark = pytest.mark.timeout(60)

SHAPES = {"w": torch.Size([4, 3]), "b": torch.Size([4])}


def grads(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {name: torch.randn(shape, generator=g) for name, shape in SHAPES.items()}


def server(path: Path) -> StageParameterServer:
    config = ServerConfig(lr=0.05, accumulate=3, max_staleness=1, checkpoint_every=1000)
    return StageParameterServer(grads(99), config, path)


def test_checkpoint_plus_log_replays_to_the_same_state(tmp_path: Path) -> None:
    primary = server(tmp_path / "primary.safetensors")
    log = PushLog(tmp_path / "standby", stage=0)
    for i in range(20):
        g, mb = grads(i), 1 + i % 2
        base = max(0, primary.version - i % 3)  # some beyond the staleness bound: dropped, also replayed
        seq = primary.received + 1
        log.append(seq, {"base": base, "micro_batches": mb}, serialize_tensors(g), lineage="host-a")
        primary.push(g, base, mb)
        if i == 9:
            primary.checkpoint()  # mid-batch: the sum pending here is not in the weights
            copy = tmp_path / "copy.safetensors"
            copy.write_bytes((tmp_path / "primary.safetensors").read_bytes())
            log.prune(checkpoint_log_seq(copy))
    assert log.sequence_numbers()[0] == checkpoint_log_seq(copy) + 1  # pruned up to the copy

    successor = server(copy)
    for seq, meta, blob in log.entries_after(successor.received, 1000):
        assert seq == successor.received + 1
        successor.push(deserialize_tensors(blob, SHAPES, "g"), meta["base"], meta["micro_batches"])
    assert successor.version == primary.version and successor.received == primary.received
    assert primary.counters.dropped_stale > 0  # the dropped pushes were replayed, and dropped again
    for name in SHAPES:
        assert torch.equal(successor.params[name], primary.params[name]), name


def test_another_lineage_replaces_the_log(tmp_path: Path) -> None:
    log = PushLog(tmp_path, stage=1)
    log.append(1, {"base": 0, "micro_batches": 1}, b"a", lineage="dead-host")
    log.append(2, {"base": 0, "micro_batches": 1}, b"b", lineage="dead-host")
    log.append(2, {"base": 0, "micro_batches": 1}, b"c", lineage="new-host")  # numbers reused
    assert [(n, blob) for n, _, blob in log.entries_after(0, 10)] == []  # 1 is gone: no contiguous run
    assert [(n, blob) for n, _, blob in log.entries_after(1, 10)] == [(2, b"c")]
