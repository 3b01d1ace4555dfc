"""The GPU check's daemons: their config, and what their status shows while they train.

Each daemon is a real ``swarmd run`` subprocess on 127.0.0.1 with port 0, no mDNS and no UPnP
(``LocalDaemon``, as the integration tests and ``swarmd demo`` start them), with short
heartbeats, no start-up benchmark, and a config file of its own: the compute device, the
precision where the installed swarmd has that key, and the ``[limits]`` that let two daemons
share one GPU (a GPU memory cap each; ``pause_while_gpu_used`` off, since each would otherwise
see the other on the GPU and pause).

Rates are read off the status: ``training.updates`` (shard (0, 0)'s version, one batch an
update in gradient mode), polled, timed between the update after the warm-up and the last
one; losses off ``training.losses`` (the last stage's ``[micro-batch, loss]``); peak memory off
``limits.applied.gpu_memory_peak_bytes`` on CUDA, and the process's peak resident set
(``VmHWM``) on the CPU.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from swarmd.config import ComputeConfig
from swarmd.system.control import call
from swarmd.system.local_swarm import LocalDaemon, stop_all, wait_for

FLAGS = ["--heartbeat-interval", "1", "--heartbeat-ttl", "8", "--no-benchmark"]
POLL_S = 0.1


def config_toml(*, device: str, gpu_memory_gib: float = 0.0, precision: str = "auto") -> str:
    """A daemon's config file; ``[compute] precision`` only where this swarmd's config has it."""
    compute = [f'device = "{device}"']
    if "precision" in {f.name for f in dataclasses.fields(ComputeConfig)}:
        compute.append(f'precision = "{precision}"')
    limits = ["pause_while_gpu_used = false", "pause_on_battery = false"]
    if gpu_memory_gib > 0:
        limits.append(f"gpu_memory_gib = {gpu_memory_gib:.2f}")
    return "[compute]\n" + "\n".join(compute) + "\n\n[limits]\n" + "\n".join(limits) + "\n"


def make_daemon(
    folder: Path, name: str, run_id: str, *, config: str, threads: int, data_dir: Path | None = None
) -> LocalDaemon:
    """A daemon (not started) whose state lives in ``folder / name``, with ``config`` beside it."""
    path = folder / f"{name}.toml"  # config_path's
    path.write_text(config)
    extra = [*FLAGS, "--threads", str(threads), "--config", str(path)]
    if data_dir is not None:
        extra += ["--data-dir", str(data_dir)]
    return LocalDaemon(folder / name, run_id, extra, tied=True)


def config_path(daemon: LocalDaemon) -> Path:
    """The config file ``make_daemon`` wrote for ``daemon``."""
    return daemon.state_dir.parent / f"{daemon.state_dir.name}.toml"


def status(daemon: LocalDaemon) -> dict[str, Any]:
    if daemon.proc is None or daemon.proc.poll() is not None:
        return {}
    try:
        return daemon.status() or {}
    except Exception:  # a daemon between states: nothing to read this time
        return {}


def training(s: dict[str, Any]) -> dict[str, Any]:
    return s.get("training") or {}


def peak_rss_bytes(pid: int) -> int | None:
    """The process's peak resident set (``VmHWM``), or None when it cannot be read."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


@dataclass
class Measured:
    """What a row's daemons did: the rate over the timed updates, their losses and peaks."""

    updates: int = 0
    timed_updates: int = 0
    tokens_per_s: float | None = None
    losses: list[list[float]] = field(default_factory=list)
    peak_bytes: list[int] = field(default_factory=list)
    statuses: list[dict[str, Any]] = field(default_factory=list)
    problem: str = ""
    """Why the row failed (a daemon exited, nothing trained); empty when it did not."""


class TrainingWatch:
    """Polls a row's daemons until they reach ``steps`` updates or the budget runs out."""

    def __init__(self, daemons: list[LocalDaemon], *, tokens_per_update: int, cuda: bool) -> None:
        self.daemons = daemons
        self.tokens_per_update = tokens_per_update
        self.cuda = cuda

    def updates(self) -> int:
        for d in self.daemons:
            if d.proc is not None and d.proc.poll() is not None:
                raise RuntimeError(f"daemon {d.state_dir.name} exited with {d.proc.returncode}:\n{d.log_tail(30)}")
        found = [training(status(d)) for d in self.daemons]
        for d, t in zip(self.daemons, found, strict=True):
            if t.get("error"):
                raise RuntimeError(f"daemon {d.state_dir.name} cannot train: {t['error']}")
        return max((t.get("updates") or 0 for t in found), default=0)

    def measure(self, *, warmup: int, steps: int, start_s: float, budget_s: float) -> Measured:
        """Wait (up to ``start_s``) for ``warmup`` updates, then time the updates up to ``steps``
        (at most ``budget_s`` more)."""
        found = Measured()
        try:
            u0, t0 = self._wait(warmup, time.monotonic() + start_s)
            if u0 < warmup:
                found.updates = u0
                found.problem = f"{u0} updates in {start_s:.0f} s (needed {warmup} before timing)"
                return found
            u1, t1 = self._wait(steps, time.monotonic() + budget_s)
        except RuntimeError as e:
            found.problem = str(e)
            return found
        found.updates, found.timed_updates = u1, u1 - u0
        if u1 > u0 and t1 > t0:
            found.tokens_per_s = (u1 - u0) * self.tokens_per_update / (t1 - t0)
        else:
            found.problem = f"no update after the warm-up within {budget_s:.0f} s (stuck at {u0})"
        self.collect(found)
        return found

    def _wait(self, target: int, deadline: float) -> tuple[int, float]:
        """Poll until ``target`` updates or the deadline: (updates, when first seen)."""
        seen, at = self.updates(), time.monotonic()
        while seen < target and time.monotonic() < deadline:
            time.sleep(POLL_S)
            now = self.updates()
            if now != seen:
                seen, at = now, time.monotonic()
        return seen, at

    def collect(self, found: Measured) -> None:
        """Each daemon's status, losses and peak memory, as they stand."""
        found.statuses = [status(d) for d in self.daemons]
        found.losses = [pair for s in found.statuses for pair in training(s).get("losses") or []]
        found.peak_bytes = []
        for d, s in zip(self.daemons, found.statuses, strict=True):
            peak = ((s.get("limits") or {}).get("applied") or {}).get("gpu_memory_peak_bytes") if self.cuda else None
            if peak is None and not self.cuda and d.proc is not None:
                peak = peak_rss_bytes(d.pid)
            if peak is not None:
                found.peak_bytes.append(int(peak))


def layout(statuses: list[dict[str, Any]]) -> str:
    """Which cells and shards each daemon holds, and the assignment's pipelines and H."""
    parts = []
    for i, s in enumerate(statuses):
        t = training(s)
        cells = [(c["pipeline"], c["stage"]) for c in t.get("cells") or []]
        shards = [(x["stage"], x["shard"]) for x in t.get("shards") or []]
        parts.append(f"d{i}: cells {cells} shards {shards}")
    a = next((training(s).get("assignment") for s in statuses if training(s).get("assignment")), None) or {}
    return "; ".join(parts) + f"; pipelines {a.get('pipelines')}, H {a.get('local_steps')}"


def start_all(daemons: list[LocalDaemon], timeout_s: float = 120) -> None:
    """The first daemon, then the others joined through its addresses; all running. Several
    are held paused by their owner until every one sees the others, then resumed together:
    otherwise the first trains alone for a few steps and the second's join hands cells and
    shards over mid-run (a share dropped, trained again a step on), which moves the loss by
    tenths of a nat where the reference has no such event."""
    hold = len(daemons) > 1
    addrs = daemons[0].start().wait_running(timeout=timeout_s)["addrs"]
    if hold:
        call(daemons[0].socket, "pause")
    for d in daemons[1:]:
        d.start(addrs)
    for d in daemons[1:]:
        d.wait_running(timeout=timeout_s)
        call(d.socket, "pause")
    if hold:
        peers = {status(d).get("peer_id") for d in daemons}
        wait_for(
            lambda: all(peers - {status(d).get("peer_id")} <= d.seen_peers() for d in daemons),
            timeout_s,
            "every daemon to see the others",
        )
        for d in daemons:
            call(d.socket, "resume")


def stop(daemons: list[LocalDaemon]) -> list[int | None]:
    return stop_all(daemons, timeout=40)
