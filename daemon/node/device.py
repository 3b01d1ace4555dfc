"""What this machine offers the swarm: its compute device, the device's memory, and its precision.

The device's speed is measured, not looked up: ``swarmd.node.compute_probe`` times the run's
matmuls on it; ``swarmd.node.rated_tflops`` holds the vendors' figures it is compared with.
"""

from __future__ import annotations

import logging
import os
import platform

from swarmd.errors import ConfigError
from swarmd.peers.records.heartbeat import DeviceInfo

logger = logging.getLogger(__name__)


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _system_memory_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 0


def resolve_device(requested: str) -> str:
    """Turn the config's ``auto``/``cuda``/``cuda:N``/``cpu`` into a torch device string."""
    import torch

    if requested == "auto":
        return "cuda:0" if torch.cuda.is_available() else "cpu"
    if requested.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ConfigError(f"[compute] device = {requested!r} but torch sees no CUDA device; use 'auto' or 'cpu'")
        index = int(requested[5:]) if ":" in requested else 0
        if index >= torch.cuda.device_count():
            raise ConfigError(
                f"[compute] device = {requested!r} but only {torch.cuda.device_count()} CUDA device(s) exist"
            )
        return f"cuda:{index}"
    return "cpu"


def describe_device(device: str) -> DeviceInfo:
    cpus = len(os.sched_getaffinity(0))
    if device.startswith("cuda"):
        import torch

        props = torch.cuda.get_device_properties(torch.device(device))
        return DeviceInfo(kind="cuda", name=props.name, memory_bytes=int(props.total_memory), cpus=cpus)
    return DeviceInfo(kind="cpu", name=_cpu_name(), memory_bytes=_system_memory_bytes(), cpus=cpus)


def free_memory_bytes(device: str) -> int:
    """The device's free memory now: what CUDA says is free on a GPU (``torch.cuda.mem_get_info``,
    other processes' use included), the kernel's ``MemAvailable`` on a CPU; 0 when unreadable."""
    if device.startswith("cuda"):
        import torch

        free, _total = torch.cuda.mem_get_info(torch.device(device))
        return int(free)
    try:
        with open("/proc/meminfo") as f:
            return meminfo_available_bytes(f.read())
    except OSError:
        return 0


def meminfo_available_bytes(meminfo: str) -> int:
    """``MemAvailable`` of a ``/proc/meminfo`` text, in bytes (0 when absent: kernels before 3.14)."""
    for line in meminfo.splitlines():
        if line.startswith("MemAvailable:"):
            value, _, unit = line.split(":", 1)[1].strip().partition(" ")
            return int(value) * (1024 if unit.strip() == "kB" else 1)
    return 0
