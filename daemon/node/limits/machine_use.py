"""Whether the owner uses the machine, and who else computes on its GPU (for ``[limits]``).

**In use.** A system service sees no keyboard or mouse, only what the login manager and the
terminals show: each logind session's ``IdleHint``/``IdleSinceHint`` (``loginctl``; logind
derives a terminal session's from its TTY, a desktop sets its own), and the access time of
the terminal devices, which the kernel moves on input (``/dev/pts/*``, ``/dev/tty[0-9]*``, as
``w`` reads them). The least idle source wins. None visible (a container, no logind): unknown,
and unknown never pauses.

**The GPU.** NVML (``pynvml``, from the optional ``nvidia-ml-py``), else ``nvidia-smi``: every
compute or graphics process on this peer's device that is not this daemon or one of its
children is a reason to pause, named by its program. A process NVML names that this process
cannot see (another PID namespace: a container) cannot be told from our own and is left out.

Each reader takes its source as an argument (a command runner, a directory, an NVML module)
so that the tests feed them fake answers.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

COMMAND_TIMEOUT_S = 2.0
SESSION_TYPES = ("tty", "x11", "wayland", "mir")
"""Sessions someone sits at (or logs into over SSH: a tty); a cron job's session is "unspecified"."""
DEV = Path("/dev")

Runner = Callable[[list[str]], str | None]
"""Runs a command; its standard output, or None when it is missing, fails or times out."""


def run_command(argv: list[str]) -> str | None:
    if shutil.which(argv[0]) is None:
        return None
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        logger.debug("%s failed: %s", argv[0], e)
        return None
    return done.stdout if done.returncode == 0 else None


# --- input idle time --------------------------------------------------------------------------


def parse_sessions(show_session: str, now: float) -> list[float]:
    """Seconds since input in each user session that someone sits at, from ``loginctl
    show-session ID ... -p Class -p Type -p State -p IdleHint -p IdleSinceHint`` (blocks of
    ``Key=value`` lines, one block per session, a blank line between)."""
    idle = []
    for block in show_session.strip().split("\n\n"):
        props = dict(line.partition("=")[::2] for line in block.splitlines() if "=" in line)
        if props.get("Class") != "user" or props.get("Type") not in SESSION_TYPES:
            continue
        if props.get("State") not in ("active", "online"):
            continue
        if props.get("IdleHint") == "no":
            idle.append(0.0)
            continue
        since_us = props.get("IdleSinceHint", "")
        if props.get("IdleHint") == "yes" and since_us.isdigit() and int(since_us) > 0:
            idle.append(max(0.0, now - int(since_us) / 1e6))
    return idle


def session_idle_s(run: Runner = run_command, now: float | None = None) -> list[float]:
    """``parse_sessions`` of this machine's logind sessions (none when there is no loginctl)."""
    listing = run(["loginctl", "list-sessions", "--no-legend"])
    ids = [line.split()[0] for line in (listing or "").splitlines() if line.split()]
    if not ids:
        return []
    props = ["-p", "Class", "-p", "Type", "-p", "State", "-p", "IdleHint", "-p", "IdleSinceHint"]
    shown = run(["loginctl", "show-session", *ids, *props])
    return parse_sessions(shown or "", time.time() if now is None else now)


def terminal_idle_s(dev: Path = DEV, now: float | None = None) -> list[float]:
    """Seconds since each terminal device was last read (input), as ``w`` shows it."""
    now = time.time() if now is None else now
    found = []
    for path in [*dev.glob("pts/[0-9]*"), *dev.glob("tty[0-9]*")]:
        try:
            found.append(max(0.0, now - path.stat().st_atime))
        except OSError:
            continue  # a pseudo-terminal closed meanwhile
    return found


def input_idle_s(run: Runner = run_command, dev: Path = DEV, now: float | None = None) -> float | None:
    """The least time since input any source shows; None when no source shows any."""
    seen = [*session_idle_s(run, now), *terminal_idle_s(dev, now)]
    return min(seen) if seen else None


# --- the GPU ----------------------------------------------------------------------------------


def gpu_index(device: str) -> int | None:
    """The NVIDIA device index ``[compute] device`` means (None: the CPU)."""
    if device == "cpu":
        return None
    return int(device[5:]) if device.startswith("cuda:") else 0


def own_pids() -> set[int]:
    """This daemon and its children (the DHT process, p2pd, the LAN child)."""
    import psutil

    me = psutil.Process()
    return {me.pid, *(child.pid for child in me.children(recursive=True))}


def program_name(pid: int) -> str | None:
    """The program ``pid`` runs, or None when this process cannot see it."""
    import psutil

    try:
        return str(psutil.Process(pid).name())
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def nvml_pids(nvml: Any, index: int) -> list[int] | None:
    """The PIDs computing or drawing on GPU ``index`` as NVML sees them; None when NVML fails."""
    try:
        nvml.nvmlInit()
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        procs = [
            *nvml.nvmlDeviceGetComputeRunningProcesses(handle),
            *nvml.nvmlDeviceGetGraphicsRunningProcesses(handle),
        ]
    except Exception as e:  # NVMLError and its many subclasses: no driver, no such device
        logger.debug("NVML cannot list GPU %d's processes: %s", index, e)
        return None
    return [int(p.pid) for p in procs]


def smi_pids(run: Runner, index: int) -> list[int] | None:
    """The PIDs computing on GPU ``index`` as ``nvidia-smi`` lists them; None without it."""
    out = run(["nvidia-smi", "-i", str(index), "--query-compute-apps=pid,process_name", "--format=csv,noheader"])
    if out is None:
        return None
    pids = []
    for line in out.splitlines():
        pid = line.partition(",")[0].strip()
        if pid.isdigit():
            pids.append(int(pid))
    return pids


def load_nvml() -> Any | None:
    try:
        import pynvml  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        return None
    return pynvml


def other_gpu_programs(
    pids: Iterable[int], ours: set[int], name_of: Callable[[int], str | None] | None = None
) -> list[str]:
    """The programs among ``pids`` that are not ours (those this process cannot see left out)."""
    lookup = name_of if name_of is not None else program_name
    names = set()
    for pid in set(pids) - ours:
        name = lookup(pid)
        if name is not None:
            names.add(name)
    return sorted(names)


def gpu_users(
    index: int, nvml: Any | None = None, run: Runner = run_command, ours: set[int] | None = None
) -> list[str] | None:
    """The other programs on GPU ``index``; None when neither NVML nor nvidia-smi can tell."""
    pids = nvml_pids(nvml, index) if nvml is not None else None
    if pids is None:
        pids = smi_pids(run, index)
    if pids is None:
        return None
    return other_gpu_programs(pids, own_pids() if ours is None else ours)


def gpu_reason(programs: list[str]) -> str | None:
    if not programs:
        return None
    return f"{', '.join(programs)} using the GPU ([limits] pause_while_gpu_used)"


def in_use_reason(idle_s: float | None, threshold_s: float) -> str | None:
    if idle_s is None or idle_s >= threshold_s:
        return None
    return f"the machine is in use (input {idle_s:.0f} s ago; [limits] pause_while_in_use)"


class Unseen:
    """Says once in the log that a reason cannot be seen here (and so does not pause)."""

    def __init__(self) -> None:
        self.said: set[str] = set()

    def note(self, key: str, message: str) -> None:
        if key not in self.said:
            self.said.add(key)
            logger.warning(message)


UNSEEN = Unseen()
NO_INPUT_SOURCE = (
    "[limits] pause_while_in_use: no login session (loginctl) or terminal here shows input idle "
    "time, so swarmd cannot tell when the machine is in use and does not pause for it"
)


def machine_use_reason(in_use: bool, idle_threshold_s: float, gpu_used: bool, device: str) -> str | None:
    """The first of ``[limits]``'s in-use and GPU reasons to pause now, or None (reads the
    sessions, the terminals, NVML or nvidia-smi)."""
    if in_use:
        idle = input_idle_s()
        if idle is None:
            UNSEEN.note("in use", NO_INPUT_SOURCE)
        reason = in_use_reason(idle, idle_threshold_s)
        if reason is not None:
            return reason
    index = gpu_index(device)
    if gpu_used and index is not None:
        users = gpu_users(index, load_nvml())
        if users is None:
            logger.debug("neither NVML nor nvidia-smi answers here: not checking the GPU's other users")
        return gpu_reason(users or [])
    return None
