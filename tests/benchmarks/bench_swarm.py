"""Throughput of N real daemons on this machine against the same model trained in one process.

    .venv/bin/python tests/benchmarks/bench_swarm.py [--daemons 1 2 4] [--seconds 40] [--threads 2]

For each N: create the default run, start N daemons on 127.0.0.1 (each with threads/N torch
threads, so the swarm and the reference use the same total), wait until every stage is
hosted and training, then measure for ``--seconds``: tokens/s (micro-batches finished at the
last stage's host), and where the workers' time went, summed over the daemons: compute
(torch), serialise (tensor frames and safetensors), requests (to the stage hosts: the wire,
p2pd, and the hosts' handling), waiting (nothing to claim). Then the single-process
synchronous reference with ``--threads`` threads. Prints a table and the ratios. Figures
only; nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from swarmd.local_swarm import LocalDaemon, create_run, wait_for
from swarmd.models.corpus import load_corpus, train_eval_split
from swarmd.models.presets import DEFAULT_RUN
from swarmd.models.reference import TrainSettings, train_reference
from swarmd.models.shape import ModelShape

PARTS = ("compute", "serialise", "requests", "waiting")


def training(daemon: LocalDaemon) -> dict[str, Any]:
    return ((daemon.status() or {}).get("training")) or {}


def snapshot(daemons: list[LocalDaemon]) -> tuple[float, int, dict[str, float], int]:
    """(time, tokens finished at the last stage, worker seconds by part, updates)."""
    now, tokens, seconds, updates = time.monotonic(), 0, dict.fromkeys(PARTS, 0.0), 0
    for daemon in daemons:
        t = training(daemon)
        tokens += t.get("tokens") or 0
        updates = max(updates, t.get("updates") or 0)
        for part, value in ((t.get("worker") or {}).get("seconds") or {}).items():
            seconds[part] += value
    return now, tokens, seconds, updates


def bench_swarm(n: int, threads: int, seconds: float) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="swarmd-bench-", dir="/tmp"))
    spec = root / "run.json"
    spec.write_text(json.dumps(DEFAULT_RUN))
    run_id = create_run(root / "d0", spec)
    flags = [
        "--heartbeat-interval",
        "1",
        "--heartbeat-ttl",
        "6",
        "--no-benchmark",
        "--threads",
        str(max(1, threads // n)),
    ]
    daemons = [LocalDaemon(root / f"d{i}", run_id, flags) for i in range(n)]
    try:
        addrs = daemons[0].start().wait_running()["addrs"]
        for d in daemons[1:]:
            d.start(addrs)
        for d in daemons:
            d.wait_running()
        stages = DEFAULT_RUN["stages"]
        hosts_wanted = min(n, stages)

        def settled() -> bool:
            hosting = [training(d).get("hosting") or [] for d in daemons]
            return sum(1 for h in hosting if h) == hosts_wanted and all(
                training(d).get("state") == "training" for d in daemons
            )

        wait_for(settled, 120, "the stages to settle over the daemons")
        time.sleep(5)  # sync-ok: warm-up before the measurement window (weights pulled, queues full)
        t0, tok0, sec0, up0 = snapshot(daemons)
        time.sleep(seconds)  # sync-ok: the measurement window itself
        t1, tok1, sec1, up1 = snapshot(daemons)
        busy = {p: sec1[p] - sec0[p] for p in PARTS}
        return {"tokens_per_s": (tok1 - tok0) / (t1 - t0), "updates": up1 - up0, "seconds": busy, "window": t1 - t0}
    finally:
        for d in daemons:
            d.stop()
        shutil.rmtree(root, ignore_errors=True)


def bench_reference(threads: int, steps: int) -> float:
    shape = ModelShape.from_dict(DEFAULT_RUN["model"])
    train, _ = train_eval_split(load_corpus("builtin"), shape.seq_len, seed=0)
    b = DEFAULT_RUN["batch"]
    settings = TrainSettings(seed=0, steps=steps, batch_sequences=b["sequences"], micro_batch=b["micro_batch"],
                             lr=DEFAULT_RUN["optimizer"]["lr"], threads=threads)  # fmt: skip
    results, _ = train_reference(shape, train, settings)
    timed = results[2:]  # the first steps warm the allocator up
    return sum(r.tokens - p.tokens for p, r in zip(results[1:], timed, strict=False)) / sum(r.seconds for r in timed)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--daemons", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--seconds", type=float, default=40.0)
    parser.add_argument("--threads", type=int, default=2, help="torch threads in all (split among the daemons)")
    args = parser.parse_args()
    print(f"default run {DEFAULT_RUN['model']}, batch {DEFAULT_RUN['batch']}, {DEFAULT_RUN['stages']} stages; "
          f"{args.threads} torch threads in all", flush=True)  # fmt: skip
    # The reference is measured before and after the swarms: this machine's speed drifts by
    # tens of percent between minutes, and a ratio is only as good as its denominator.
    reference = bench_reference(args.threads, 40)
    print(f"reference (one process, {args.threads} threads): {reference:8.0f} tokens/s", flush=True)
    print(
        f"{'daemons':>7} {'tokens/s':>9} {'ratio':>6} {'updates/s':>9}   worker time: "
        + "  ".join(f"{p:>9}" for p in PARTS)
    )
    for n in args.daemons:
        r = bench_swarm(n, args.threads, args.seconds)
        total = sum(r["seconds"].values()) or 1.0
        parts = "  ".join(f"{100 * r['seconds'][p] / total:8.1f}%" for p in PARTS)
        print(f"{n:>7} {r['tokens_per_s']:9.0f} {r['tokens_per_s'] / reference:6.2f} "
              f"{r['updates'] / r['window']:9.2f}                " + parts, flush=True)  # fmt: skip
    after = bench_reference(args.threads, 40)
    print(
        f"reference again, after the swarms: {after:8.0f} tokens/s (ratios above are to the first; "
        f"to the mean of both they are x{2 * reference / (reference + after):.2f})"
    )


if __name__ == "__main__":
    sys.exit(main())
