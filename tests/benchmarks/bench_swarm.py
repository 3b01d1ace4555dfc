"""Throughput of N real daemons on this machine against the same model trained in one process.

    .venv/bin/python tests/benchmarks/bench_swarm.py [--daemons 1 2 4] [--seconds 40] [--threads 2]
        [--batch-sequences 16] [--heartbeat-interval 1]

For each N: create the default run, start N daemons on 127.0.0.1 (each with threads/N torch
threads, at least one, so the swarm and the reference use the same total where N divides
it), wait until the coordinator's plan is followed and training, then measure for
``--seconds``: trained tokens/s (the micro-batches of the steps shard (0, 0) committed, as its
server counts them), and where the cells' time went, summed over the daemons: compute
(torch), codec (tensor frames), sync (waiting for the step of the round before: gradient mode
is synchronous) and waiting (for a share, for room to contribute); and where the machine's CPU
went over the window (``/proc``), in cores: the daemons' worker threads (torch, codecs), their
event loops (requests, servers' steps, leases), their DHT processes, their p2pd, and idle. The
cores are the budget on one machine: the swarm is at ``ratio`` of the reference when its worker
threads get that share of the cores the reference's threads have, at the reference's pace.
Then the single-process synchronous reference with ``--threads`` threads, on the same batch.
Prints a table and the ratios. Figures only; nothing is asserted.
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

from swarmd.models.data.corpus import load_corpus, train_eval_split
from swarmd.models.presets import DEFAULT_RUN
from swarmd.models.reference import TrainConfig, train_reference
from swarmd.models.shape import ModelShape
from swarmd.system.local_swarm import LocalDaemon, create_run, start_swarm, wait_for

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script: the tests' helpers
from tests.integration.procfs import TICK_S, cpu_times, descendants, processes, thread_cpu_s  # noqa: E402

PARTS = ("compute", "codec", "sync", "waiting")
CPU_KINDS = ("workers", "loops", "dht", "p2pd", "idle")


def cpu_seconds(daemons: set[int]) -> dict[str, float]:
    """CPU seconds so far of the ``daemons`` and their descendants by kind (a daemon's main
    thread runs its event loop, its other threads the workers), and the machine's idle seconds."""
    procs = processes()
    out = dict.fromkeys(CPU_KINDS, 0.0)
    for daemon in daemons:
        for tid, seconds in thread_cpu_s(daemon).items():
            out["loops" if tid == daemon else "workers"] += seconds
        for pid in descendants(daemon, procs):
            kind = "p2pd" if procs[pid][1] == "p2pd" else "dht"
            out[kind] += sum(thread_cpu_s(pid).values())
    busy, every = cpu_times()
    out["idle"] = (every - busy) * TICK_S
    return out


def training(daemon: LocalDaemon) -> dict[str, Any]:
    return ((daemon.status() or {}).get("training")) or {}


def snapshot(daemons: list[LocalDaemon]) -> tuple[float, int, dict[str, float], int, int, dict[str, float]]:
    """(time, trained tokens, cells' seconds by part, updates, daemons working a cell, CPU
    seconds by kind)."""
    now, tokens, seconds, updates, working = time.monotonic(), 0, dict.fromkeys(PARTS, 0.0), 0, 0
    cpu = cpu_seconds({d.pid for d in daemons})
    for daemon in daemons:
        t = training(daemon)
        tokens += t.get("trained_tokens") or 0
        updates = max(updates, t.get("updates") or 0)
        working += bool(t.get("cells"))
        for cell in t.get("cells") or []:
            for part in PARTS:
                seconds[part] += cell["seconds"].get(part, 0.0)
    return now, tokens, seconds, updates, working, cpu


def run_spec(batch_sequences: int) -> dict[str, Any]:
    return {**DEFAULT_RUN, "batch": {**DEFAULT_RUN["batch"], "sequences": batch_sequences}}


def bench_swarm(
    n: int, threads: int, seconds: float, warmup: float, batch_sequences: int, heartbeat_s: float
) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="swarmd-bench-", dir="/tmp"))
    spec = root / "run.json"
    spec.write_text(json.dumps(run_spec(batch_sequences)))
    run_id = create_run(root / "d0", spec)
    flags = [
        "--heartbeat-interval",
        f"{heartbeat_s:g}",
        "--heartbeat-ttl",
        f"{6 * heartbeat_s:g}",
        "--threads",
        str(max(1, threads // n)),
    ]
    daemons = [LocalDaemon(root / f"d{i}", run_id, flags) for i in range(n)]
    try:
        start_swarm(daemons)

        def settled() -> bool:  # a plan (not the provisional rule) followed, and trained on
            statuses = [training(d) for d in daemons]
            a = statuses[0].get("assignment") or {}
            return (n == 1 or a.get("provisional") is False) and any(s.get("trained_tokens") for s in statuses)

        wait_for(settled, 180, "the swarm to follow a plan and train")
        time.sleep(warmup)  # sync-ok: the coordinator re-plans on the links measured meanwhile (60 s)
        t0, tok0, sec0, up0, _, cpu0 = snapshot(daemons)
        time.sleep(seconds)  # sync-ok: the measurement window itself
        t1, tok1, sec1, up1, working, cpu1 = snapshot(daemons)
        busy = {p: sec1[p] - sec0[p] for p in PARTS}
        cores = {k: (cpu1[k] - cpu0[k]) / (t1 - t0) for k in CPU_KINDS}
        plan = training(daemons[0]).get("assignment") or {}
        return {
            "tokens_per_s": (tok1 - tok0) / (t1 - t0),
            "updates": up1 - up0,
            "seconds": busy,
            "cores": cores,
            "window": t1 - t0,
            "working": working,
            "pipelines": plan.get("pipelines"),
        }
    finally:
        for d in daemons:
            d.stop()
        shutil.rmtree(root, ignore_errors=True)


def bench_reference(threads: int, steps: int, batch_sequences: int) -> float:
    shape = ModelShape.from_dict(DEFAULT_RUN["model"])
    train, _ = train_eval_split(load_corpus("builtin"), shape.seq_len, seed=0)
    b = run_spec(batch_sequences)["batch"]
    settings = TrainConfig(
        seed=0,
        steps=steps,
        batch_sequences=b["sequences"],
        micro_batch=b["micro_batch"],
        lr=DEFAULT_RUN["optimizer"]["lr"],
        threads=threads,
    )
    results, _ = train_reference(shape, train, settings)
    timed = results[2:]  # the first steps warm the allocator up
    return sum(r.tokens - p.tokens for p, r in zip(results[1:], timed, strict=False)) / sum(r.seconds for r in timed)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--daemons", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--seconds", type=float, default=40.0)
    parser.add_argument("--threads", type=int, default=2, help="torch threads in all (split among the daemons)")
    parser.add_argument("--warmup", type=float, default=70.0, help="seconds of training before the window")
    parser.add_argument(
        "--batch-sequences",
        type=int,
        default=DEFAULT_RUN["batch"]["sequences"],
        help="sequences per update, the swarm's and the reference's (the default run's if not given)",
    )
    parser.add_argument(
        "--heartbeat-interval",
        type=float,
        default=1.0,
        help="the daemons' heartbeat (s): short to settle fast; the service's default is 15",
    )
    args = parser.parse_args()
    spec = run_spec(args.batch_sequences)
    print(
        f"default run {spec['model']}, batch {spec['batch']}, {spec['stages']} stages; "
        f"{args.threads} torch threads in all; heartbeat {args.heartbeat_interval:g} s",
        flush=True,
    )
    # The reference is measured before and after the swarms: this machine's speed drifts by
    # tens of percent between minutes, and a ratio is only as good as its denominator.
    steps = max(10, 40 * DEFAULT_RUN["batch"]["sequences"] // args.batch_sequences)  # as many tokens
    reference = bench_reference(args.threads, steps, args.batch_sequences)
    print(f"reference (one process, {args.threads} threads): {reference:8.0f} tokens/s", flush=True)
    print(
        f"{'daemons':>7} {'working':>7} {'tokens/s':>9} {'ratio':>6} {'updates/s':>9}   cells' time: "
        + "  ".join(f"{p:>9}" for p in PARTS)
        + "   cores: "
        + " ".join(f"{k:>7}" for k in CPU_KINDS)
    )
    for n in args.daemons:
        r = bench_swarm(n, args.threads, args.seconds, args.warmup, args.batch_sequences, args.heartbeat_interval)
        total = sum(r["seconds"].values()) or 1.0
        parts = "  ".join(f"{100 * r['seconds'][p] / total:8.1f}%" for p in PARTS)
        cores = " ".join(f"{r['cores'][k]:7.2f}" for k in CPU_KINDS)
        print(
            f"{n:>7} {r['working']:>7} {r['tokens_per_s']:9.0f} {r['tokens_per_s'] / reference:6.2f} "
            f"{r['updates'] / r['window']:9.2f}                {parts}          {cores}",
            flush=True,
        )
    after = bench_reference(args.threads, steps, args.batch_sequences)
    print(
        f"reference again, after the swarms: {after:8.0f} tokens/s (ratios above are to the first; "
        f"to the mean of both they are x{2 * reference / (reference + after):.2f})"
    )


if __name__ == "__main__":
    sys.exit(main())
