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
    fast = ["--heartbeat-interval", "2", "--heartbeat-ttl", "8", "--no-benchmark"]
    daemons = [LocalDaemon(root / f"d{i}", run_id, fast) for i in range(peers)]
    trainer: int | None = None
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
        print("Training (Ctrl-C to stop)." if duration_s <= 0 else f"Training for {duration_s:.0f} s.")
        started = time.monotonic()
        while duration_s <= 0 or time.monotonic() - started < duration_s:
            time.sleep(2)  # a display refresh, not synchronisation
            if any(d.proc is not None and d.proc.poll() is not None for d in daemons):
                print("a daemon exited; see its log in", root)
                return 1
            shown = _show_progress(daemons, started)
            trainer = shown if shown is not None else trainer
        if trainer is not None:
            print(f"export the model: swarmd export --run-id {run_id} DIR --state-dir {daemons[trainer].state_dir}")
    except KeyboardInterrupt:
        print()
        if trainer is not None:
            print(f"export the model: swarmd export --run-id {run_id} DIR --state-dir {daemons[trainer].state_dir}")
    finally:
        codes = [d.stop() for d in daemons]  # the trainer checkpoints every stage on the way out
        print(f"stopped {len(daemons)} daemons, exit codes {codes}")
    return 0


def _show_progress(daemons: list[LocalDaemon], started: float) -> int | None:
    """Print one line for the daemon that trains; returns its index."""
    for i, daemon in enumerate(daemons):
        status = daemon.status()
        training = status.get("training") if status else None
        if training and training["state"] == "training":
            loss = "-" if training["loss"] is None else f"{training['loss']:.3f}"
            print(
                f"[{time.monotonic() - started:6.0f} s] d{i} trains all {training['stages']} stages: "
                f"update {training['updates']:5d}  loss {loss}  {training['tokens_per_s']:8.0f} tokens/s  "
                f"{len(status['peers'])} other peer(s) standing by",  # type: ignore[index]
                flush=True,
            )
            return i
    print(f"[{time.monotonic() - started:6.0f} s] waiting for a daemon to claim the stages", flush=True)
    return None
