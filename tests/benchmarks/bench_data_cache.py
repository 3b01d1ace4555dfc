"""A peer without the data reads through a dataset ten times its cache: memory and disk stay flat.

Two peers' ``RunFiles`` in one process (``swarmd.data``, the daemon's own code; the network is a
function call, so the figures are the store's and the fetcher's, not a link's): the creator
holds a prepared dataset in a data folder, the reader has none and a cache of a tenth of it.
The reader reads every micro-batch in order, as a swarm does (``ready`` then ``micro_batch``,
with the next shards fetched ahead), and the benchmark prints its RSS growth, the most the
cache held on disk, the shards fetched and evicted, and the rate.

    .venv/bin/python tests/benchmarks/bench_data_cache.py [--mib 256] [--shard-mib 8]
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import hashlib
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from swarmd.data.run_files import RunFiles  # noqa: E402
from swarmd.data.training_data import ShardedData  # noqa: E402
from swarmd.models.data.corpus import load_corpus  # noqa: E402
from swarmd.models.data.prepare import prepare  # noqa: E402
from swarmd.models.presets import DEFAULT_RUN  # noqa: E402
from swarmd.models.tokenizer import ByteTokenizer  # noqa: E402
from swarmd.peers.records.identity import Identity  # noqa: E402
from swarmd.peers.records.run_spec import parse_spec_body, sign_run_spec  # noqa: E402
from swarmd.peers.wire.protocol import Request  # noqa: E402

MICRO_BATCH = 4


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20


def make_dataset(folder: Path, mib: int, shard_mib: int) -> Path:
    """Byte tokens (one per byte: a MiB of text is a MiB of shards), the built-in corpus repeated."""
    text = folder / "text.txt"
    corpus = load_corpus("builtin")
    with text.open("wb") as f:
        for _ in range(mib * 2**20 // len(corpus) + 1):
            f.write(corpus)
    result = prepare(
        [text], ByteTokenizer(), folder / "data", shard_tokens=shard_mib * 2**20, validation_fraction=0.001
    )
    text.unlink()
    return result.folder


async def read_through(creator: RunFiles, reader: RunFiles) -> dict[str, Any]:
    await creator.open()
    await reader.open()
    data = await reader.training_data()
    assert isinstance(data, ShardedData)
    cache = reader.store
    micro_batches = len(data.train) // MICRO_BATCH
    before, peak_rss, peak_cache = rss_mib(), 0.0, 0
    started = time.monotonic()
    for m in range(micro_batches):
        await data.ready(m, 1, MICRO_BATCH, deadline_s=60)
        data.micro_batch(m, MICRO_BATCH)
        if m % 64 == 0:
            peak_rss = max(peak_rss, rss_mib())
            peak_cache = max(peak_cache, cache.cached_bytes())
    seconds = time.monotonic() - started
    await asyncio.gather(*data._ahead.values())
    status = reader.status()
    await creator.stop()
    await reader.stop()
    return {
        "micro_batches": micro_batches,
        "seconds": seconds,
        "rss_growth_mib": max(peak_rss, rss_mib()) - before,
        "peak_cache_mib": peak_cache / 2**20,
        "fetched_mib": sum(status["fetch"]["fetched_bytes"].values()) / 2**20,
        "fetched": sum(status["fetch"]["fetched_files"].values()),
        "fetch_seconds": status["fetch"]["fetch_seconds"],
        "evicted": status["store"]["evicted"],
        "waited_s": data.waited_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mib", type=int, default=256, help="the dataset's size (default 256 MiB)")
    parser.add_argument("--shard-mib", type=int, default=4, help="each shard's size (default 4 MiB)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        started = time.monotonic()
        data = make_dataset(root, args.mib, args.shard_mib)
        print(f"prepared {args.mib} MiB of byte tokens in {time.monotonic() - started:.1f} s")
        body = copy.deepcopy(DEFAULT_RUN)
        manifest = (data / "manifest.json").read_bytes()
        body["data"] = {"manifest": hashlib.sha256(manifest).hexdigest()}
        spec = sign_run_spec(Identity.generate(), parse_spec_body(body))
        cache_bytes = args.mib * 2**20 // 10
        peers: dict[str, RunFiles] = {}

        def files(name: str, dirs: list[Path], cache: int) -> RunFiles:
            other = "reader" if name == "creator" else "creator"
            (root / name).mkdir()

            async def send(peer: str, request: Request[Any], blobs: list[bytes], timeout_s: float) -> Any:
                return await peers[peer].server.handle(name, request, blobs)

            def holders() -> list[tuple[str, list[str]]]:
                return [(other, peers[other].holds())]

            return RunFiles(spec, root / name, dirs, cache, send, holders, lambda peer: True)

        peers["creator"] = files("creator", [data], 1 << 30)
        peers["reader"] = files("reader", [], cache_bytes)
        found = asyncio.run(read_through(peers["creator"], peers["reader"]))
    print(
        f"dataset {args.mib} MiB in {args.shard_mib} MiB shards, reader's cache {cache_bytes / 2**20:.1f} MiB "
        f"(a tenth): read {found['micro_batches']} micro-batches in {found['seconds']:.1f} s; fetched "
        f"{found['fetched']} files, {found['fetched_mib']:.1f} MiB in {found['fetch_seconds']:.1f} s of fetching "
        f"({found['fetched_mib'] / max(found['fetch_seconds'], 1e-9):.0f} MiB/s), evicted {found['evicted']}; "
        f"the cache held at most {found['peak_cache_mib']:.1f} MiB; RSS grew "
        f"{found['rss_growth_mib']:.1f} MiB; reading waited {found['waited_s']:.2f} s for fetches"
    )


if __name__ == "__main__":
    main()
