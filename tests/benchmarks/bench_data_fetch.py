"""What fetching the data costs a swarm of real daemons: training with every peer's own copy
against training with one holder that the others fetch from, and the fetch rate over libp2p.

    .venv/bin/python tests/benchmarks/bench_data_fetch.py [--daemons 3] [--seconds 60]
        [--mib 32] [--shard-kib 256]

A byte-level dataset is prepared from the built-in corpus, repeated to ``--mib`` (byte tokens:
a MiB of text is a MiB of shards, so that fetching is as heavy per token as data can be), in
shards of ``--shard-kib``, small so that the swarm moves to a new shard every few seconds and
fetches all the time. The run is the default model on that data. For each case, start the
daemons on 127.0.0.1, wait until the swarm trains, then measure for ``--seconds``: committed
updates per minute, the bytes each daemon fetched and how long its fetches took, and how long
its cells waited for a shard (what fetching ahead did not hide). Figures only.
"""

from __future__ import annotations

import argparse
import copy
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from swarmd.models.data.corpus import load_corpus  # noqa: E402
from swarmd.models.data.prepare import prepare  # noqa: E402
from swarmd.models.presets import DEFAULT_RUN  # noqa: E402
from swarmd.models.tokenizer import ByteTokenizer  # noqa: E402
from swarmd.system.local_swarm import LocalDaemon, create_run, start_swarm, wait_for  # noqa: E402


def training(daemon: LocalDaemon) -> dict[str, Any]:
    return (daemon.status() or {}).get("training") or {}


def updates(daemons: list[LocalDaemon]) -> int:
    return max((training(d).get("updates") or 0 for d in daemons), default=0)


def run_case(
    root: Path, data: Path, spec: Path, daemons_n: int, seconds: float, everyone_holds: bool
) -> dict[str, Any]:
    case = root / ("local" if everyone_holds else "fetched")
    run_id = create_run(case / "d0", spec)  # d0 created the run: it finds the data where run create did
    threads = max(1, 2 // daemons_n)
    flags = ["--heartbeat-interval", "1", "--heartbeat-ttl", "6", "--no-benchmark", "--threads", str(threads)]
    daemons = [
        LocalDaemon(case / f"d{i}", run_id, flags + (["--data-dir", str(data)] if everyone_holds and i else []))
        for i in range(daemons_n)
    ]
    try:
        start_swarm(daemons)
        wait_for(lambda: updates(daemons) >= 10, 240, "the swarm to train")
        first, started = updates(daemons), time.monotonic()
        time.sleep(seconds)  # the measurement window (sync-ok: a benchmark's window)
        done, elapsed = updates(daemons), time.monotonic() - started
        files = [((d.status() or {}).get("data") or {}) for d in daemons]
    finally:
        for daemon in daemons:
            daemon.stop(timeout=30)
    fetched = sum(sum(f["fetch"]["fetched_bytes"].values()) for f in files)
    fetch_s = sum(f["fetch"]["fetch_seconds"] for f in files)
    waited = sum(((f.get("training") or {}).get("waited_s") or 0.0) for f in files)
    return {
        "case": "every peer holds the data" if everyone_holds else "d0 holds it, the others fetch",
        "updates_per_min": (done - first) * 60 / elapsed,
        "fetched_mib": fetched / 2**20,
        "fetch_mib_s": fetched / 2**20 / fetch_s if fetch_s else None,
        "waited_s": waited,
        "refused": sum(f["fetch"]["refused"] for f in files),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--daemons", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--mib", type=int, default=32)
    parser.add_argument("--shard-kib", type=int, default=256)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="swd-fetch-", dir="/tmp"))
    try:
        text = root / "text.txt"
        corpus = load_corpus("builtin")
        text.write_bytes(corpus * (args.mib * 2**20 // len(corpus) + 1))
        prepared = prepare([text], ByteTokenizer(), root / "data", shard_tokens=args.shard_kib * 1024)
        text.unlink()
        body = copy.deepcopy(DEFAULT_RUN)
        body["data"] = {"manifest": str(prepared.folder / "manifest.json")}
        spec = root / "run.json"
        spec.write_text(json.dumps(body))
        print(f"{args.mib} MiB of byte tokens in {len(prepared.manifest.train)} shards of {args.shard_kib} KiB")
        rows = [run_case(root, prepared.folder, spec, args.daemons, args.seconds, held) for held in (True, False)]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"{'case':<34} {'updates/min':>12} {'fetched MiB':>12} {'fetch MiB/s':>12} {'cells waited s':>15}")
    for r in rows:
        rate = "-" if r["fetch_mib_s"] is None else f"{r['fetch_mib_s']:.1f}"
        print(
            f"{r['case']:<34} {r['updates_per_min']:>12.1f} {r['fetched_mib']:>12.2f} {rate:>12} {r['waited_s']:>15.2f}"
        )


if __name__ == "__main__":
    main()
