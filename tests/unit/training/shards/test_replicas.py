"""daemon/training/shards/replicas.py: a standby keeps a checkpoint or a logged step only from the
shard's holder, and only when it is whole, finite, of the shard's slice, of this run and shard,
made by that holder and at a version the swarm may have reached; anything else is refused with
BadRequest and counted, and the replica held before is kept."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from swarmd.models.checkpoint import load_safetensors, save_safetensors_atomic, tensors_digest
from swarmd.models.checkpoint_check import Provenance, ShardLayout, TracedShard
from swarmd.models.shard_config import ShardConfig
from swarmd.peers.taskpool.servers import Shard
from swarmd.peers.wire.codecs import encode_vector
from swarmd.peers.wire.errors import BadRequest, NotHolder
from swarmd.training.shards.replicas import LogEntry, ReplicaStore

pytestmark = pytest.mark.timeout(60)

KEY = (1, 0)
RUN = "tiny." + "a" * 24
LAYOUT = ShardLayout(RUN, 1, 0, 1, (0, 40), "gradient")
HOLDER = "12D3KooWholder"
CONFIG = ShardConfig(mode="gradient", lr=1e-2, weight_decay=0.0)


class Rules:
    """The stage geometry's answers: the layout of shard KEY, versions up to 100 admitted."""

    def layout(self, key: Shard) -> ShardLayout | None:
        return LAYOUT if key == KEY else None

    def admits(self, key: Shard, version: int) -> bool:
        return 0 <= version <= 100


def checkpoint(tmp_path: Path, version: int = 3, layout: ShardLayout = LAYOUT, holder: str = HOLDER) -> bytes:
    shard = TracedShard(*layout.span, torch.randn(40), CONFIG, step_micro_batches=1, version=version)
    shard.provenance = Provenance.of(layout, holder)
    return shard.checkpoint(tmp_path / f"c{version}-{holder}-{layout.stage}.safetensors").read_bytes()


def tampered(tmp_path: Path, data: bytes, weights: torch.Tensor, *, digest: bool) -> bytes:
    path = tmp_path / "tampered.safetensors"
    path.write_bytes(data)
    tensors, meta = load_safetensors(path)
    tensors["weights"] = weights
    if digest:
        meta["digest"] = tensors_digest(tensors)
    save_safetensors_atomic(tensors, path, meta)
    return path.read_bytes()


def store() -> ReplicaStore:
    return ReplicaStore(lambda key: HOLDER, Rules())


def test_a_good_checkpoint_and_its_log_are_kept(tmp_path: Path) -> None:
    s = store()
    s.store_checkpoint(KEY, HOLDER, "lin", 3, checkpoint(tmp_path))
    s.append(KEY, HOLDER, "lin", LogEntry(4, bytes(encode_vector(torch.ones(40), "fp16")), (1,), ""))
    replica = s.newest(KEY)
    assert replica is not None and replica.version == 4 and replica.length == 40
    assert s.status()["invalid"] == 0


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ("nan, header kept", "checksum mismatch"),
        ("nan, checksum recomputed", "weights holds NaN or infinite"),
        ("truncated", "truncated"),
        ("another run", "is a state of run"),
        ("another shard", "is a state of shard \\(0, 0\\)"),
        ("made by another", "made by 12D3KooWother"),
        ("another version than sent", "holds version 3, not the 4"),
        ("far past the swarm", "far past what the swarm has seen"),
    ],
)
def test_a_bad_checkpoint_is_refused_counted_and_the_held_replica_kept(tmp_path: Path, bad: str, message: str) -> None:
    s = store()
    s.store_checkpoint(KEY, HOLDER, "lin", 2, checkpoint(tmp_path, version=2))
    good = checkpoint(tmp_path)
    nan = torch.full((40,), float("nan"))
    version = {"another version than sent": 4, "far past the swarm": 1_000_000}.get(bad, 3)
    data = {
        "nan, header kept": lambda: tampered(tmp_path, good, nan, digest=False),
        "nan, checksum recomputed": lambda: tampered(tmp_path, good, nan, digest=True),
        "truncated": lambda: good[: len(good) // 2],
        "another run": lambda: checkpoint(
            tmp_path, layout=ShardLayout("tiny." + "b" * 24, 1, 0, 1, (0, 40), "gradient")
        ),
        "another shard": lambda: checkpoint(tmp_path, layout=ShardLayout(RUN, 0, 0, 1, (0, 40), "gradient")),
        "made by another": lambda: checkpoint(tmp_path, holder="12D3KooWother"),
    }.get(bad, lambda: good)()
    with pytest.raises(BadRequest, match=message):
        s.store_checkpoint(KEY, HOLDER, "lin", version, data)
    assert s.status()["invalid"] == 1
    replica = s.newest(KEY)
    assert replica is not None and replica.checkpoint_version == 2  # what it held before


def test_only_the_holder_replicates(tmp_path: Path) -> None:
    s = store()
    with pytest.raises(NotHolder):
        s.store_checkpoint(KEY, "12D3KooWother", "lin", 3, checkpoint(tmp_path, holder="12D3KooWother"))
    assert s.status()["refused"] == 1 and s.newest(KEY) is None


@pytest.mark.parametrize(
    ("delta", "message"),
    [
        (torch.full((40,), float("nan")), "NaN or infinite"),
        (torch.ones(39), "39|40"),
        (torch.ones(41), "41|40"),
    ],
)
def test_a_non_finite_or_wrong_length_log_entry_is_refused(tmp_path: Path, delta: torch.Tensor, message: str) -> None:
    s = store()
    s.store_checkpoint(KEY, HOLDER, "lin", 3, checkpoint(tmp_path))
    # encode_vector refuses NaN itself: a hostile holder builds the frame by hand from a finite one.
    frame = bytearray(encode_vector(torch.ones(delta.numel()), "fp16"))
    if not bool(torch.isfinite(delta).all()):
        frame[-2:] = torch.tensor([float("nan")], dtype=torch.float16).view(torch.uint8).numpy().tobytes()
    with pytest.raises(BadRequest, match=message):
        s.append(KEY, HOLDER, "lin", LogEntry(4, bytes(frame), (1,), ""))
    replica = s.newest(KEY)
    assert replica is not None and replica.version == 3 and s.status()["invalid"] == 1
