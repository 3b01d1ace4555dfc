"""How much CPU a training daemon uses at ``[limits] cpu_share`` 1.0, then 0.5, then 0.25.

    .venv/bin/python tests/benchmarks/bench_cpu_share.py [--seconds 30] [--shares 1.0,0.5,0.25]

One daemon alone (it holds every cell and shard of the default run, one torch thread) trains;
for each share, set live with ``swarmd config set limits.cpu_share`` on the running daemon,
it waits a few seconds, then reads the CPU time of the daemon and every process under it (its
DHT process and each p2pd: ``/proc/PID/stat``, user plus system, every thread) over
``--seconds`` and the steps its shards made. On a CPU the share is of the compute's cores with
all of that counted (``swarmd.training.cells.throttle``), so the first column should read about
the share at one torch thread. Figures only; nothing is asserted: the machine's
other load moves them.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # run as a script: the tests package is not installed

from swarmd.models.presets import DEFAULT_RUN  # noqa: E402
from swarmd.system.local_swarm import LocalDaemon, create_run, wait_for  # noqa: E402
from tests.integration.hostile.harness import tree_cpu_s as cpu_s  # noqa: E402


def versions(daemon: LocalDaemon) -> int:
    shards = ((daemon.status() or {}).get("training") or {}).get("shards") or []
    return sum(s["version"] for s in shards)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--shares", default="1.0,0.5,0.25")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="swd-bench-", dir="/tmp"))
    spec = work / "run.json"
    spec.write_text(json.dumps({**DEFAULT_RUN, "name": "cpu-share"}))
    state = work / "d0"
    run_id = create_run(state, spec)
    config = work / "config.toml"
    config.write_text("[limits]\ncpu_share = 1.0\n")
    flags = ["--heartbeat-interval", "1", "--heartbeat-ttl", "8", "--no-benchmark", "--threads", "1"]
    daemon = LocalDaemon(state, run_id, [*flags, "--config", str(config)])
    try:
        daemon.start().wait_running()
        wait_for(lambda: versions(daemon) >= 4 or None, 180, "the daemon to train")
        print(f"{'share':>6} {'cpu s/s':>8} {'steps/min':>10} {'throttled s':>12}")
        for share in [float(s) for s in args.shares.split(",")]:
            command = [sys.executable, "-m", "swarmd", "config", "set", "limits.cpu_share", str(share)]
            subprocess.run(
                [*command, "--config", str(config), "--state-dir", str(state)], check=True, capture_output=True
            )
            time.sleep(5.0)  # sync-ok: the new share settles before the window (figures only)
            cpu0, v0, t0 = cpu_s(daemon.pid), versions(daemon), time.monotonic()
            time.sleep(args.seconds)  # sync-ok: the measurement window
            cpu1, v1, t1 = cpu_s(daemon.pid), versions(daemon), time.monotonic()
            throttled = ((daemon.status() or {}).get("limits") or {}).get("applied", {}).get("throttled_s")
            print(
                f"{share:>6.2f} {(cpu1 - cpu0) / (t1 - t0):>8.2f} {(v1 - v0) * 60 / (t1 - t0):>10.1f} {throttled:>12}"
            )
    finally:
        daemon.stop(timeout=60)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
