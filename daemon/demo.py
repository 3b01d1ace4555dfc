"""``swarmd demo``: a local swarm of daemons on 127.0.0.1, shown as it forms and runs.

It creates the default run (``swarmd.models.presets.DEFAULT_RUN``) with a fresh identity,
starts the creator's daemon, then the others bootstrapped from it, and prints the swarm as
each daemon sees it. Everything stays on loopback: no mDNS, no UPnP.
"""

from __future__ import annotations

import json
import logging
import tempfile
import time
from pathlib import Path

from swarmd.local_swarm import LocalDaemon, create_run, wait_for
from swarmd.models.presets import DEFAULT_RUN

logger = logging.getLogger(__name__)


def run_demo(peers: int, duration_s: float) -> int:
    if not 1 <= peers <= 16:
        from swarmd.errors import ConfigError

        raise ConfigError(f"--peers {peers} is outside [1, 16]; a laptop runs a handful of daemons")
    root = Path(tempfile.mkdtemp(prefix="swarmd-demo-", dir="/tmp"))
    spec_path = root / "run.json"
    spec_path.write_text(json.dumps(DEFAULT_RUN))
    run_id = create_run(root / "d0", spec_path)
    print(f"run {run_id}  (state and logs in {root})")
    fast = ["--heartbeat-interval", "2", "--heartbeat-ttl", "8"]
    daemons = [LocalDaemon(root / f"d{i}", run_id, fast) for i in range(peers)]
    try:
        first = daemons[0].start().wait_running()
        print(f"d0 {first['peer_id']} listening on {first['addrs'][0]}")
        for daemon in daemons[1:]:
            daemon.start(initial_peers=first["addrs"])
        for i, daemon in enumerate(daemons[1:], 1):
            status = daemon.wait_running()
            print(f"d{i} {status['peer_id']} joined")
        wait_for(
            lambda: all(len(d.seen_peers()) == peers - 1 for d in daemons),
            60,
            "every daemon to see the others",
        )
        print(f"every daemon sees the other {peers - 1}. Swarm as d0 sees it (swarmd status --state-dir {root}/d0):")
        from swarmd.cli import main as cli_main

        cli_main(["status", "--state-dir", str(daemons[0].state_dir)])
        print("Ctrl-C to stop." if duration_s <= 0 else f"Stopping in {duration_s:.0f} s.")
        started = time.monotonic()
        while duration_s <= 0 or time.monotonic() - started < duration_s:
            time.sleep(1)  # a display refresh, not synchronisation
            if any(d.proc is not None and d.proc.poll() is not None for d in daemons):
                print("a daemon exited; see its log in", root)
                return 1
    except KeyboardInterrupt:
        print()
    finally:
        codes = [d.stop() for d in daemons]
        print(f"stopped {len(daemons)} daemons, exit codes {codes}")
    return 0
