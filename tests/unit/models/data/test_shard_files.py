"""Shard files read with pread: the right tokens, bounded descriptors, and memory that does not grow with the data."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from swarmd.models.data.manifest import MANIFEST_FILE, Manifest, ManifestError, ShardEntry, TokenizerEntry
from swarmd.models.data.shard_files import ShardFiles, check_shard, open_prepared, read_manifest
from swarmd.models.data.windows import CorpusError

pytestmark = pytest.mark.timeout(120)

BPE = TokenizerEntry(kind="bpe", file="tokenizer.json", sha256="cd" * 32, vocab=50_000, eos_id=0)


def write_dataset(folder: Path, shard_tokens: list[int], val_tokens: list[int], seed: int = 0) -> Manifest:
    """A prepared-dataset folder of random uint16 tokens (no tokenizer needed to read it)."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    entries: dict[str, list[ShardEntry]] = {"train": [], "val": []}
    for prefix, sizes in (("train", shard_tokens), ("val", val_tokens)):
        for i, n in enumerate(sizes):
            data = rng.integers(0, 50_000, size=n, dtype=np.uint16).astype("<u2").tobytes()
            name = f"{prefix}-{i:05d}.bin"
            (folder / name).write_bytes(data)
            entries[prefix].append(ShardEntry(name, hashlib.sha256(data).hexdigest(), n))
    manifest = Manifest(
        tokenizer=BPE,
        dtype="uint16",
        train=tuple(entries["train"]),
        validation=tuple(entries["val"]),
        documents={"train": len(shard_tokens), "validation": len(val_tokens)},
    )
    (folder / MANIFEST_FILE).write_bytes(manifest.to_json())
    return manifest


def test_reads_the_tokens_at_any_place(tmp_path: Path) -> None:
    m = write_dataset(tmp_path / "d", [5000, 3000, 4096], [1000])
    files = ShardFiles.of_entries(tmp_path / "d", m.train, m.dtype)
    whole = np.fromfile(tmp_path / "d" / m.train[1].file, dtype="<u2")
    assert files.read(1, 0, 10).tolist() == whole[:10].tolist()
    assert files.read(1, 2990, 10).tolist() == whole[2990:].tolist()
    assert files.read(1, 5, 0).tolist() == []
    with pytest.raises(IndexError, match="outside shard 1 of 3000"):
        files.read(1, 2995, 10)
    with pytest.raises(IndexError, match="not one of the 3 shards"):
        files.read(3, 0, 1)
    files.close()


def test_descriptors_stay_bounded(tmp_path: Path) -> None:
    m = write_dataset(tmp_path / "d", [256] * 40, [])
    files = ShardFiles([tmp_path / "d" / e.file for e in m.train], m.dtype, max_open=4)
    for shard in [*range(40), *range(40)]:
        files.read(shard, 0, 8)
        assert len(files._open) <= 4
    files.close()
    assert files._open == {}


def test_a_truncated_or_changed_shard_is_found(tmp_path: Path) -> None:
    m = write_dataset(tmp_path / "d", [4096, 4096], [])
    path = tmp_path / "d" / m.train[0].file
    check_shard(path, m.train[0], m.dtype)
    data = path.read_bytes()
    path.write_bytes(data[:1000])
    with pytest.raises(CorpusError, match="is truncated"):
        ShardFiles([path], m.dtype).read(0, 0, 1024)
    with pytest.raises(CorpusError, match="1000 bytes; the manifest says 4096 tokens, 8192 bytes"):
        check_shard(path, m.train[0], m.dtype)
    path.write_bytes(bytes([data[0] ^ 1]) + data[1:])
    with pytest.raises(CorpusError, match="corrupt or from another dataset"):
        check_shard(path, m.train[0], m.dtype)
    with pytest.raises(CorpusError, match="corrupt"):
        open_prepared(tmp_path / "d", 64, 0, verify=True)
    with pytest.raises(ManifestError, match="cannot read .*manifest.json"):
        read_manifest(tmp_path)


def test_open_prepared_gives_both_splits(tmp_path: Path) -> None:
    m = write_dataset(tmp_path / "d", [4096, 2048], [512])
    data = open_prepared(tmp_path / "d", 256, seed=3, verify=True)
    assert len(data.train) == 24 and data.validation is not None and len(data.validation) == 2
    shard, window = data.train.locate(0)
    whole = np.fromfile(tmp_path / "d" / m.train[shard].file, dtype="<u2")
    assert data.train.sequence(0).tolist() == whole[window * 256 : (window + 1) * 256].tolist()
    assert data.manifest_sha256 == hashlib.sha256((tmp_path / "d" / MANIFEST_FILE).read_bytes()).hexdigest()
    data.close()
    too_long = open_prepared(tmp_path / "d", 1024, seed=3)
    assert too_long.validation is None  # the held-out shard is shorter than one sequence
    too_long.close()


# The product must never hold a dataset in memory: reading every window of a dataset twelve
# times the bound moves the resident set by less than the bound.
BOUND_MIB = 8
DATASET_MIB = 12 * BOUND_MIB

READER = r"""
import json, sys
import psutil
from swarmd.models.data.shard_files import open_prepared
data = open_prepared(sys.argv[1], 1024, seed=0)
train = data.train
process = psutil.Process()
for i in range(64):  # warm up: imports, the first orders, allocator pools
    train.micro_batch(i, 8)
before = peak = process.memory_info().rss
for m in range(len(train) // 8):
    train.micro_batch(m, 8)
    if m % 256 == 0:
        peak = max(peak, process.memory_info().rss)
peak = max(peak, process.memory_info().rss)
print(json.dumps({"before": before, "peak": peak, "windows": len(train)}))
"""


def test_reading_every_window_does_not_grow_memory(tmp_path: Path) -> None:
    shard = 4 * 1024 * 1024  # tokens: 8 MiB of uint16
    write_dataset(tmp_path / "d", [shard] * (DATASET_MIB // 8), [])
    out = subprocess.run(
        [sys.executable, "-c", READER, str(tmp_path / "d")],
        capture_output=True,
        text=True,
        timeout=100,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert out.returncode == 0, out.stderr
    figures = json.loads(out.stdout.strip().splitlines()[-1])
    growth_mib = (figures["peak"] - figures["before"]) / 2**20
    assert figures["windows"] * 1024 * 2 >= DATASET_MIB * 2**20
    assert growth_mib < BOUND_MIB, f"reading {DATASET_MIB} MiB grew the resident set by {growth_mib:.1f} MiB"


def test_reads_from_many_threads_get_their_own_file(tmp_path: Path) -> None:
    """With two descriptors for eight shards, threads evict each other's: each read still gets its shard."""
    from concurrent.futures import ThreadPoolExecutor

    m = write_dataset(tmp_path / "d", [2048] * 8, [])
    whole = [np.fromfile(tmp_path / "d" / e.file, dtype="<u2") for e in m.train]
    files = ShardFiles.of_entries(tmp_path / "d", m.train, m.dtype)
    files.max_open = 2

    def check(i: int) -> bool:
        shard, start = i % 8, (i * 37) % 2000
        return files.read(shard, start, 48).tolist() == whole[shard][start : start + 48].tolist()

    with ThreadPoolExecutor(8) as pool:
        assert all(pool.map(check, range(4000)))
    files.close()
