"""``swarmd demo``: a local swarm of daemons on 127.0.0.1 that trains a preset run together.

It makes what the preset needs (``swarmd.models.presets``: for ``tiny-llama-bpe``, a BPE
tokenizer and the built-in corpus in token shards, which only the first daemon holds: the
others fetch the shards they need from it), creates the run with a fresh identity, starts the
creator's daemon, then the others bootstrapped from it, and shows the swarm as it forms, then
training: which cells and shards each daemon holds, and the swarm's updates, loss (from the
last stage's cells), held-out loss, trained tokens/s (as the server of shard (0, 0) applied
them) and the data each daemon fetched, redrawn in place on a terminal; the first daemon also
serves the dashboard on a free loopback port. The cores are split among the daemons. On Ctrl-C
(or after ``--duration``) the first daemon gathers every stage's weights from the shards, so that
the model can be exported from its state directory, and every daemon stops cleanly, all within
``STOP_BUDGET_S`` whatever the swarm's size (a second Ctrl-C stops them at once). The daemons die with the demo however
it ends (a kill, a closed terminal): each is tied to it (``LocalDaemon(tied=True)``).
Everything stays on loopback: no mDNS, no UPnP.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.text import Text

from swarmd.cli.status_view import format_status
from swarmd.errors import ControlError
from swarmd.models.presets import PRESETS, materialize
from swarmd.system.control import call
from swarmd.system.local_swarm import LocalDaemon, create_run, stop_all, wait_for

logger = logging.getLogger(__name__)

REFRESH_S = 3.0
STOP_BUDGET_S = 15.0
"""From Ctrl-C to every daemon gone: the gathering of the weights gets part of it, and each
daemon's own shutdown (its leases released, its shards checkpointed) the rest, all at once."""
GATHER_SHARE = 0.5


def run_demo(peers: int, duration_s: float, preset: str = "tiny-bytes") -> int:
    from swarmd.errors import ConfigError

    if not 1 <= peers <= 16:
        raise ConfigError(f"--peers {peers} is outside [1, 16]; a laptop runs a handful of daemons")
    if preset not in PRESETS:
        raise ConfigError(f"--run {preset!r} is no preset; choose one of {', '.join(PRESETS)}")
    root = Path(tempfile.mkdtemp(prefix="swarmd-demo-", dir="/tmp"))
    spec_path = materialize(PRESETS[preset], root / "files", lambda line: print(line, flush=True))
    run_id = create_run(root / "d0", spec_path)
    print(f"run {run_id}  (state and logs in {root})")
    threads = max(1, (os.cpu_count() or 1) // peers)
    fast = ["--heartbeat-interval", "2", "--heartbeat-ttl", "8", "--no-benchmark", "--threads", str(threads)]
    # d0 serves the dashboard on a free loopback port (its URL is printed once it runs).
    daemons = [
        LocalDaemon(root / f"d{i}", run_id, fast + (["--dashboard", "127.0.0.1:0"] if i == 0 else []), tied=True)
        for i in range(peers)
    ]
    trained = False
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
        print(format_status(call(daemons[0].socket, "status")))  # with the dashboard's address
        print(
            f"Training with {threads} torch thread(s) per daemon"
            + (" (Ctrl-C to stop)." if duration_s <= 0 else f" for {duration_s:.0f} s.")
        )
        view = ProgressView(Console())
        with view:
            started = time.monotonic()
            while duration_s <= 0 or time.monotonic() - started < duration_s:
                time.sleep(REFRESH_S)  # a display refresh, not synchronisation
                if any(d.proc is not None and d.proc.poll() is not None for d in daemons):
                    view.close()
                    print("a daemon exited; see its log in", root)
                    return 1
                lines, progressing = _progress(daemons, started)
                view.show(lines)
                trained = progressing or trained
    except KeyboardInterrupt:
        print()
    finally:
        trained = _stop(daemons, trained)
    if trained:
        print(f"export the model: swarmd export --run-id {run_id} DIR --state-dir {daemons[0].state_dir}")
    return 0


def _stop(daemons: list[LocalDaemon], trained: bool) -> bool:
    """Gather the weights on d0 (if it trained) and stop every daemon, within ``STOP_BUDGET_S``;
    a second Ctrl-C kills them at once. Returns whether the weights can be exported."""
    deadline = time.monotonic() + STOP_BUDGET_S
    try:
        if trained:
            print("stopping: d0 gathers every stage's weights from the shards (Ctrl-C again to stop at once)")
            trained = _gather(daemons[0], GATHER_SHARE * STOP_BUDGET_S)
        print(f"stopping {len(daemons)} daemon(s): each releases its work and checkpoints its shards")
        codes = stop_all(daemons, max(1.0, deadline - time.monotonic()))
    except KeyboardInterrupt:
        print("\nstopping at once (SIGKILL): the shards keep their last checkpoints")
        for daemon in daemons:
            daemon.kill()
        codes = [d.proc.returncode if d.proc is not None else None for d in daemons]
    print(f"stopped {len(daemons)} daemons, exit codes {codes}")
    return trained


def _gather(daemon: LocalDaemon, timeout: float) -> bool:
    try:
        result = call(daemon.socket, "gather_weights", timeout=timeout)
    except ControlError as e:
        print(f"could not gather the stages on d0 ({e}); each shard keeps its own checkpoint")
        return False
    loss = result.get("held_out_loss")
    scored = f", held-out loss {loss:.4f}" if loss is not None else ""
    print(f"d0 gathered every stage's weights from the shards (versions {result['versions']}{scored})")
    return True


class ProgressView:
    """The swarm's lines, redrawn in place on a terminal (rich's Live, as ``swarmd status
    --watch``); elsewhere (a log, a pipe) printed one block after another."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self._live: Live | None = None

    def __enter__(self) -> ProgressView:
        if self.console.is_terminal:
            self._live = Live(Text("waiting for the first figures"), console=self.console, auto_refresh=False)
            self._live.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def show(self, lines: list[str]) -> None:
        if self._live is not None:
            self._live.update(Text("\n".join(lines)), refresh=True)
        else:
            print("\n".join(lines), flush=True)

    def close(self) -> None:
        """Leave the last view on screen and go back to plain lines (the stop's messages follow)."""
        if self._live is not None:
            self._live.stop()
            self._live = None


def _progress(daemons: list[LocalDaemon], started: float) -> tuple[list[str], bool]:
    """One line for the swarm and one per daemon; and whether training has started."""
    full = [d.status() or {} for d in daemons]
    statuses = [s.get("training") or {} for s in full]
    elapsed = f"[{time.monotonic() - started:6.0f} s]"
    last = next((t for t in statuses if t.get("loss") is not None), None)
    counted = next((t for t in statuses if t.get("trained_tokens") is not None), {})
    if last is None:
        return [f"{elapsed} waiting for the pipelines to form"], False
    updates = max(t.get("updates") or 0 for t in statuses)
    held_out = max((t["held_out"] for t in statuses if t.get("held_out")), key=lambda h: h["version"], default=None)
    scored = f"  held-out {held_out['loss']:.3f} (update {held_out['version']})" if held_out else ""
    lines = [
        f"{elapsed} update {updates:5d}  loss {last['loss']:.3f}{scored}  {counted.get('tokens_per_s') or 0:8.0f} "
        f"tokens/s  {counted.get('trained_tokens') or 0:9d} trained tokens"
    ]
    plan = _plan_line(full)
    if plan:
        lines.append(f"         {plan}")
    rows = zip(statuses, full, strict=True)
    lines += [f"         d{i}: {_describe(t)}{_data(s.get('data'))}" for i, (t, s) in enumerate(rows)]
    return lines, True


def _plan_line(statuses: list[dict[str, Any]]) -> str:
    """The coordinator's plan as the daemons follow it (the newest any of them reports)."""
    plans = [(s.get("swarm") or {}).get("plan") for s in statuses]
    found = [p for p in plans if p]
    if not found:
        return ""
    p = max(found, key=lambda p: p["version"])
    ids = [s.get("peer_id") for s in statuses]
    coordinator = f"d{ids.index(p['by'])}" if p["by"] in ids else p["by"][:12]
    predicted = p.get("predicted_iteration_s")
    figure = f", predicted iteration {predicted:.3f} s" if predicted is not None else ""
    return (
        f"plan v{p['version']} ({p['kind']}) by {coordinator}: {p['pipelines']} pipeline(s) x {p['stages']} "
        f"stages, layers {p['layers_per_stage']}{figure}"
    )


def _data(data: dict[str, Any] | None) -> str:
    """What a daemon fetched and served of the run's files (nothing for a corpus run)."""
    if not data or not data.get("manifest"):
        return ""
    fetched = sum((data["fetch"]["fetched_bytes"] or {}).values()) / 2**20
    served = data["serve"]["served_bytes"] / 2**20
    holds = ", ".join(data["holds"]) or "fetches what it reads"
    return f"; data: {holds}, fetched {fetched:.1f} MiB, served {served:.1f} MiB"


def _describe(training: dict[str, Any]) -> str:
    if not training:
        return "no answer"
    cells = training.get("cells") or []
    shards = ", ".join(f"({s['stage']}, {s['shard']}) v{s['version']}" for s in training.get("shards") or [])
    work = "; ".join(f"cell ({c['pipeline']}, {c['stage']}) {c['shares']} shares" for c in cells) or "no cell"
    return f"{work}; serves {shards or 'no shard'}"
