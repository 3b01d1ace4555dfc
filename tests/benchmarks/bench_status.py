"""How fast ``swarmd status`` answers, while a local swarm forms and while it runs.

    .venv/bin/python tests/benchmarks/bench_status.py [--peers 3] [--samples 200]

Prints latency percentiles of the control socket's ``status`` call, measured from a client
process, for the first daemon of a local swarm: during start-up (DHT start, join, matmul
benchmark in a worker thread) and in steady state. Figures only; nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from swarmd.errors import ControlError
from swarmd.models.presets import DEFAULT_RUN
from swarmd.system.control import call
from swarmd.system.local_swarm import LocalDaemon, create_run, wait_for


def sample(daemon: LocalDaemon, n: int) -> list[float]:
    latencies = []
    for _ in range(n):
        started = time.perf_counter()
        try:
            call(daemon.socket, "status", timeout=5)
        except ControlError:
            continue  # not listening yet
        latencies.append(time.perf_counter() - started)
    return latencies


def report(label: str, latencies: list[float]) -> None:
    if not latencies:
        print(f"{label:<22} no answers")
        return
    ms = sorted(x * 1000 for x in latencies)
    p = lambda q: ms[min(len(ms) - 1, int(q * len(ms)))]  # noqa: E731
    print(
        f"{label:<22} n={len(ms):4d}  p50={p(0.5):6.2f} ms  p95={p(0.95):6.2f} ms  "
        f"max={ms[-1]:6.2f} ms  mean={statistics.fmean(ms):6.2f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--peers", type=int, default=3)
    parser.add_argument("--samples", type=int, default=200)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="swd-bench-", dir="/tmp"))
    spec = root / "run.json"
    spec.write_text(json.dumps(DEFAULT_RUN))
    run_id = create_run(root / "d0", spec)
    daemons = [
        LocalDaemon(root / f"d{i}", run_id, ["--heartbeat-interval", "1", "--heartbeat-ttl", "4"])
        for i in range(args.peers)
    ]
    try:
        first = daemons[0].start()
        wait_for(lambda: first.socket.exists(), 60, "the control socket")
        report("during start-up", sample(first, args.samples))
        addrs = first.wait_running()["addrs"]
        for d in daemons[1:]:
            d.start(addrs)
        report("while others join", sample(first, args.samples))
        wait_for(lambda: len(first.seen_peers()) == args.peers - 1, 60, "the swarm to form")
        report("steady state", sample(first, args.samples))
    finally:
        for d in daemons:
            d.stop()


if __name__ == "__main__":
    main()
