"""Throughput of N real daemons on this machine against the same model trained in one process.

    .venv/bin/python tests/benchmarks/bench_swarm.py [--daemons 1 2 4] [--seconds 40] [--threads 2]

For each N: create the default run, start N daemons on 127.0.0.1 (each with threads/N torch
threads, at least one, so the swarm and the reference use the same total where N divides
it), wait until the coordinator's plan is followed and training, then measure for
``--seconds``: trained tokens/s (the micro-batches of the steps shard (0, 0) committed, as its
server counts them), and where the cells' time went, summed over the daemons: compute
(torch), codec (tensor frames), sync (waiting for the step of the round before: gradient mode
is synchronous) and waiting (for a share, for room to contribute). Then the single-process
synchronous reference with ``--threads`` threads. Prints a table and the ratios. Figures only;
nothing is asserted.
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

from swarmd.local_swarm import LocalDaemon, create_run, start_swarm, wait_for
from swarmd.models.corpus import load_corpus, train_eval_split
from swarmd.models.presets import DEFAULT_RUN
from swarmd.models.reference import TrainSettings, train_reference
from swarmd.models.shape import ModelShape

PARTS = ("compute", "codec", "sync", "waiting")


def training(daemon: LocalDaemon) -> dict[str, Any]:
    return ((daemon.status() or {}).get("training")) or {}


def snapshot(daemons: list[LocalDaemon]) -> tuple[float, int, dict[str, float], int, int]:
    """(time, trained tokens, cells' seconds by part, updates, daemons working a cell)."""
    now, tokens, seconds, updates, working = time.monotonic(), 0, dict.fromkeys(PARTS, 0.0), 0, 0
    for daemon in daemons:
        t = training(daemon)
        tokens += t.get("trained_tokens") or 0
        updates = max(updates, t.get("updates") or 0)
        working += bool(t.get("cells"))
        for cell in t.get("cells") or []:
            for part in PARTS:
                seconds[part] += cell["seconds"].get(part, 0.0)
    return now, tokens, seconds, updates, working


def bench_swarm(n: int, threads: int, seconds: float, warmup: float) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="swarmd-bench-", dir="/tmp"))
    spec = root / "run.json"
    spec.write_text(json.dumps(DEFAULT_RUN))
    run_id = create_run(root / "d0", spec)
    flags = ["--heartbeat-interval", "1", "--heartbeat-ttl", "6", "--threads", str(max(1, threads // n))]
    daemons = [LocalDaemon(root / f"d{i}", run_id, flags) for i in range(n)]
    try:
        start_swarm(daemons)

        def settled() -> bool:  # a plan (not the provisional rule) followed, and trained on
            statuses = [training(d) for d in daemons]
            a = statuses[0].get("assignment") or {}
            return (n == 1 or a.get("provisional") is False) and any(s.get("trained_tokens") for s in statuses)

        wait_for(settled, 180, "the swarm to follow a plan and train")
        time.sleep(warmup)  # sync-ok: the coordinator re-plans on the links measured meanwhile (60 s)
        t0, tok0, sec0, up0, _ = snapshot(daemons)
        time.sleep(seconds)  # sync-ok: the measurement window itself
        t1, tok1, sec1, up1, working = snapshot(daemons)
        busy = {p: sec1[p] - sec0[p] for p in PARTS}
        plan = training(daemons[0]).get("assignment") or {}
        return {
            "tokens_per_s": (tok1 - tok0) / (t1 - t0),
            "updates": up1 - up0,
            "seconds": busy,
            "window": t1 - t0,
            "working": working,
            "pipelines": plan.get("pipelines"),
        }
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
    parser.add_argument("--warmup", type=float, default=70.0, help="seconds of training before the window")
    args = parser.parse_args()
    print(f"default run {DEFAULT_RUN['model']}, batch {DEFAULT_RUN['batch']}, {DEFAULT_RUN['stages']} stages; "
          f"{args.threads} torch threads in all", flush=True)  # fmt: skip
    # The reference is measured before and after the swarms: this machine's speed drifts by
    # tens of percent between minutes, and a ratio is only as good as its denominator.
    reference = bench_reference(args.threads, 40)
    print(f"reference (one process, {args.threads} threads): {reference:8.0f} tokens/s", flush=True)
    print(
        f"{'daemons':>7} {'working':>7} {'tokens/s':>9} {'ratio':>6} {'updates/s':>9}   cells' time: "
        + "  ".join(f"{p:>9}" for p in PARTS)
    )
    for n in args.daemons:
        r = bench_swarm(n, args.threads, args.seconds, args.warmup)
        total = sum(r["seconds"].values()) or 1.0
        parts = "  ".join(f"{100 * r['seconds'][p] / total:8.1f}%" for p in PARTS)
        print(f"{n:>7} {r['working']:>7} {r['tokens_per_s']:9.0f} {r['tokens_per_s'] / reference:6.2f} "
              f"{r['updates'] / r['window']:9.2f}                " + parts, flush=True)  # fmt: skip
    after = bench_reference(args.threads, 40)
    print(
        f"reference again, after the swarms: {after:8.0f} tokens/s (ratios above are to the first; "
        f"to the mean of both they are x{2 * reference / (reference + after):.2f})"
    )


if __name__ == "__main__":
    sys.exit(main())
