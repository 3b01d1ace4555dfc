"""The GPU check's daemons: their config, and what their status shows while they train.

Each daemon is a real ``swarmd run`` subprocess on 127.0.0.1 with port 0, no mDNS and no UPnP
(``LocalDaemon``, as the integration tests and ``swarmd demo`` start them), with short
heartbeats, no start-up benchmark, and a config file of its own: the compute device, the
precision, and the ``[limits]`` that let two daemons
share one GPU (a GPU memory cap each; ``pause_while_gpu_used`` off, since each would otherwise
see the other on the GPU and pause).

Rates are read off the status: ``training.updates`` (shard (0, 0)'s version, one batch an
update in gradient mode), polled, timed between the update after the warm-up and the last
one; losses off ``training.losses`` (the last stage's ``[micro-batch, loss]``); peak memory off
``limits.applied.gpu_memory_peak_bytes`` on CUDA, and the process's peak resident set
(``VmHWM``) on the CPU.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from swarmd.system.control import call
from swarmd.system.local_swarm import LocalDaemon, stop_all, wait_for

FLAGS = ["--heartbeat-interval", "1", "--heartbeat-ttl", "8", "--no-benchmark"]
POLL_S = 0.1


def config_toml(*, device: str, gpu_memory_gib: float = 0.0, precision: str = "auto") -> str:
    """A daemon's config file."""
    compute = [f'device = "{device}"', f'precision = "{precision}"']
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
    """Every ``[micro-batch, loss]`` the last stage's cells showed while they were watched."""
    moved_at: list[int] = field(default_factory=list)
    """The updates at which a cell or shard changed hands after training began (a plan that
    moved what the provisional assignment placed): each is a share dropped and trained again."""
    peak_bytes: list[int] = field(default_factory=list)
    statuses: list[dict[str, Any]] = field(default_factory=list)
    problem: str = ""
    """Why the row failed (a daemon exited, nothing trained); empty when it did not."""


def placement(statuses: list[dict[str, Any]]) -> tuple[tuple[tuple[tuple[int, int], ...], ...], ...]:
    """Which cells and shards each daemon holds."""
    return tuple(
        (
            tuple((c["pipeline"], c["stage"]) for c in training(s).get("cells") or []),
            tuple((x["stage"], x["shard"]) for x in training(s).get("shards") or []),
        )
        for s in statuses
    )


class TrainingWatch:
    """Polls a row's daemons until they reach ``steps`` updates or the budget runs out, keeping
    the losses and placements it sees on the way (a cell's losses go with it when it moves)."""

    def __init__(self, daemons: list[LocalDaemon], *, tokens_per_update: int, cuda: bool) -> None:
        self.daemons = daemons
        self.tokens_per_update = tokens_per_update
        self.cuda = cuda
        self.found = Measured()
        self._losses: dict[int, float] = {}
        self._placed: tuple[Any, ...] | None = None

    def updates(self) -> int:
        """One poll of every daemon: raises RuntimeError when one exited or cannot train."""
        for d in self.daemons:
            if d.proc is not None and d.proc.poll() is not None:
                raise RuntimeError(f"daemon {d.state_dir.name} exited with {d.proc.returncode}:\n{d.log_tail(30)}")
        statuses = [status(d) for d in self.daemons]
        for d, t in zip(self.daemons, map(training, statuses), strict=True):
            if t.get("error"):
                raise RuntimeError(f"daemon {d.state_dir.name} cannot train: {t['error']}")
            self._losses.update((int(m), float(loss)) for m, loss in t.get("losses") or [])
        updates = max((training(s).get("updates") or 0 for s in statuses), default=0)
        placed = placement(statuses)
        if all(statuses) and all(cells for cells, _ in placed):  # every daemon answered and works
            if self._placed is not None and placed != self._placed and updates > 0:
                self.found.moved_at.append(updates)
            self._placed = placed
            self.found.statuses = statuses
        return updates

    def measure(self, *, warmup: int, steps: int, start_s: float, budget_s: float) -> Measured:
        """Wait (up to ``start_s``) for ``warmup`` updates, then time the updates up to ``steps``
        (at most ``budget_s`` more)."""
        found = self.found
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
        """The losses seen, and each daemon's peak memory as it stands."""
        found.losses = [[m, loss] for m, loss in sorted(self._losses.items())]
        found.peak_bytes = []
        for d in self.daemons:
            s = status(d)
            peak = ((s.get("limits") or {}).get("applied") or {}).get("gpu_memory_peak_bytes") if self.cuda else None
            if peak is None and not self.cuda and d.proc is not None:
                peak = peak_rss_bytes(d.pid)
            if peak is not None:
                found.peak_bytes.append(int(peak))


def layout(statuses: list[dict[str, Any]]) -> str:
    """Which cells and shards each daemon holds, and the assignment's pipelines and H."""
    placed = enumerate(placement(statuses))
    parts = [f"d{i}: cells {list(cells)} shards {list(shards)}" for i, (cells, shards) in placed]
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
