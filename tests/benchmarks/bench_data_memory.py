"""Resident memory against dataset size while every window of a prepared dataset is read.

    .venv/bin/python tests/benchmarks/bench_data_memory.py [--base-mib 32] [--multiples 1 2 4 8 12] [--seq-len 1024]

For each multiple, a dataset folder of ``base × multiple`` MiB of random uint16 tokens in shards
of 8 MiB (a manifest as ``swarmd data prepare`` writes it) is read in a fresh process, every
window once, in micro-batches of 8 in data-index order (as a swarm reads it), through
``swarmd.models.data.shard_files`` (``pread``, bounded descriptors). The process's resident
set is taken after a warm-up (imports, the first orders) and at its peak while reading; the
growth is what reading the data costs. The same read through ``np.memmap`` of whole shards
is shown beside it: the reason the product reads with ``pread``. Figures only.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from swarmd.models.data.manifest import MANIFEST_FILE, Manifest, ShardEntry, TokenizerEntry

SHARD_TOKENS = 4 * 1024 * 1024  # 8 MiB of uint16

CHILD = r"""
import json, sys, time
import numpy as np
import psutil
from swarmd.models.data.shard_files import open_prepared
folder, seq_len, reader = sys.argv[1], int(sys.argv[2]), sys.argv[3]
data = open_prepared(folder, seq_len, seed=0)
train = data.train
if reader == "memmap":
    maps = [np.memmap(p, dtype="<u2", mode="r") for p in data.files[0].paths]
    train.read = lambda shard, start, count: maps[shard][start : start + count]
process = psutil.Process()
for m in range(16):
    train.micro_batch(m, 8)
before = peak = process.memory_info().rss
started = time.monotonic()
batches = len(train) // 8
for m in range(batches):
    train.micro_batch(m, 8)
    if m % 128 == 0:
        peak = max(peak, process.memory_info().rss)
seconds = time.monotonic() - started
peak = max(peak, process.memory_info().rss)
print(json.dumps({"before": before, "peak": peak, "windows": batches * 8, "seconds": seconds}))
"""


def write_dataset(folder: Path, mib: int) -> None:
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    entries = []
    for i in range(max(1, mib * 2**20 // (2 * SHARD_TOKENS))):
        data = rng.integers(0, 50_000, size=SHARD_TOKENS, dtype=np.uint16).astype("<u2").tobytes()
        name = f"train-{i:05d}.bin"
        (folder / name).write_bytes(data)
        entries.append(ShardEntry(name, hashlib.sha256(data).hexdigest(), SHARD_TOKENS))
    tokenizer = TokenizerEntry(kind="bpe", file="tokenizer.json", sha256="cd" * 32, vocab=50_000, eos_id=0)
    manifest = Manifest(tokenizer, "uint16", tuple(entries), (), {"train": len(entries), "validation": 0})
    (folder / MANIFEST_FILE).write_bytes(manifest.to_json())


def read_all(folder: Path, seq_len: int, reader: str) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(folder), str(seq_len), reader], capture_output=True, text=True, check=False
    )
    if out.returncode != 0:
        raise SystemExit(out.stderr[-2000:])
    figures: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-mib", type=int, default=32, help="size of the 1x dataset in MiB (default 32)")
    parser.add_argument("--multiples", type=int, nargs="+", default=[1, 2, 4, 8, 12])
    parser.add_argument("--seq-len", type=int, default=1024)
    args = parser.parse_args()
    mib = 2**20
    print(f"{'dataset':>10} {'windows':>9} {'reader':>7} {'RSS before':>11} {'growth':>8} {'windows/s':>10}")
    with tempfile.TemporaryDirectory() as tmp:
        for multiple in args.multiples:
            size = args.base_mib * multiple
            folder = Path(tmp) / f"x{multiple}"
            write_dataset(folder, size)
            for reader in ("pread", "memmap"):
                f = read_all(folder, args.seq_len, reader)
                print(
                    f"{size:>6} MiB {int(f['windows']):>9,} {reader:>7} {f['before'] / mib:>7.0f} MiB "
                    f"{(f['peak'] - f['before']) / mib:>4.1f} MiB {f['windows'] / f['seconds']:>10,.0f}"
                )


if __name__ == "__main__":
    main()
