"""What the tests and benchmarks read of this machine's processes and cores, from ``/proc``."""

from __future__ import annotations

import os
from pathlib import Path

TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def _stat_fields(path: str) -> tuple[str, list[str]] | None:
    """A ``stat`` file's command name and the fields after it (None: gone meanwhile)."""
    try:
        with open(path) as f:
            stat = f.read()
    except OSError:
        return None
    return stat[stat.find("(") + 1 : stat.rfind(")")], stat[stat.rfind(")") + 2 :].split()


def processes() -> dict[int, tuple[int, str]]:
    """Every live process's parent and command name (zombies have already exited)."""
    out = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (found := _stat_fields(f"/proc/{entry}/stat")) is not None:
            name, fields = found
            if fields[0] != "Z":
                out[int(entry)] = (int(fields[1]), name)
    return out


def descendants(pid: int, procs: dict[int, tuple[int, str]] | None = None) -> set[int]:
    """All live descendants of ``pid`` (children of children included)."""
    procs = processes() if procs is None else procs
    found, frontier = set(), {pid}
    while frontier:
        frontier = {p for p, (parent, _) in procs.items() if parent in frontier} - found
        found |= frontier
    return found


def thread_cpu_s(pid: int) -> dict[int, float]:
    """CPU seconds (user and system) so far of each of ``pid``'s threads, by thread ID."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task") if os.path.isdir(f"/proc/{pid}/task") else ():
        if (found := _stat_fields(f"/proc/{pid}/task/{tid}/stat")) is not None:
            out[int(tid)] = (int(found[1][11]) + int(found[1][12])) * TICK_S
    return out


def cpu_times() -> tuple[int, int]:
    """This machine's CPU time so far, in clock ticks: (busy, all) over every core."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle and iowait
    return sum(fields) - idle, sum(fields)
