"""When this peer pauses by itself, as the owner set it in ``[limits]``.

Outside the time windows it may train in, on battery, while one of the listed programs runs,
while the owner uses the machine, or while another process uses its GPU
(``swarmd.node.limits.machine_use``).

Each round reads the local clock, the power supplies (``/sys/class/power_supply``: a battery
and no mains online) and the process names (psutil), and names the first reason to pause, or
none. ``swarmd.node.limits.pausing`` acts on it: a pause it started ends when no reason is left; a
pause the owner asked for is the owner's to end.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path

from swarmd.config import LimitsConfig, Window
from swarmd.node.limits.machine_use import machine_use_reason
from swarmd.node.limits.traffic import transfer_cap_reason

POWER_SUPPLY = Path("/sys/class/power_supply")


def in_windows(windows: Iterable[Window], minute: int) -> bool:
    """Whether ``minute`` of the day is inside a window (no windows: always)."""
    listed = list(windows)
    return not listed or any(w.holds(minute) for w in listed)


def on_battery(root: Path = POWER_SUPPLY) -> bool:
    """A battery present and no mains (or USB power) online: a laptop unplugged."""
    batteries, powered = False, False
    for supply in root.glob("*") if root.is_dir() else []:
        kind = _read(supply / "type")
        if kind == "Battery":
            batteries = True
        elif kind in ("Mains", "USB", "USB_C", "USB_PD") and _read(supply / "online") == "1":
            powered = True
    return batteries and not powered


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def running(listed: Iterable[str], names: Iterable[str]) -> list[str]:
    """Which ``listed`` programs are among the process ``names`` (case-insensitive, whole names)."""
    wanted = {n.lower(): n for n in listed}
    return sorted({wanted[n.lower()] for n in names if n.lower() in wanted})


def process_names() -> list[str]:
    import psutil

    names = []
    for proc in psutil.process_iter(["name"]):
        name = proc.info.get("name")
        if name:
            names.append(name)
    return names


def pause_reason(
    windows: Iterable[Window],
    minute: int,
    pause_on_battery: bool,
    battery: bool,
    programs: list[str],
) -> str | None:
    """The first reason ``[limits]`` gives to pause now, or None."""
    if not in_windows(windows, minute):
        return "outside the time windows of [limits] windows"
    if pause_on_battery and battery:
        return "on battery ([limits] pause_on_battery)"
    if programs:
        return f"{', '.join(programs)} running ([limits] pause_while)"
    return None


def limits_reason(limits: LimitsConfig, now: float | None = None, device: str = "cpu") -> str | None:
    """``pause_reason`` for this machine now (reads the clock, the power supplies, the processes),
    then the owner at the machine and the GPU's other users (``swarmd.node.limits.machine_use``;
    ``device``: ``[compute] device``)."""
    if (capped := transfer_cap_reason(limits)) is not None:  # today's traffic at [limits] daily_transfer_gib
        return capped
    local = time.localtime(now)
    programs = running(limits.pause_while, process_names()) if limits.pause_while else []
    battery = on_battery() if limits.pause_on_battery else False
    reason = pause_reason(
        limits.time_windows, local.tm_hour * 60 + local.tm_min, limits.pause_on_battery, battery, programs
    )
    if reason is not None:
        return reason
    return machine_use_reason(limits.pause_while_in_use, limits.in_use_idle_s, limits.pause_while_gpu_used, device)
