"""What this machine offers the swarm: device model, memory, and measured throughput.

Throughput is measured, not looked up: a short dense matmul loop on the chosen device, the
figure that the scheduler divides layers by. It runs in a worker thread, never on the loop.
"""

from __future__ import annotations

import logging
import os
import platform
import time

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


def measure_throughput_gflops(device: str, size: int = 512, budget_s: float = 0.5) -> float:
    """Dense fp32 matmul throughput on ``device``, in GFLOP/s, measured for about ``budget_s``."""
    import torch

    dev = torch.device(device)
    a = torch.randn(size, size, device=dev)
    b = torch.randn(size, size, device=dev)
    torch.matmul(a, b)  # warm-up: kernels, allocator
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    iterations, started = 0, time.perf_counter()
    while True:
        torch.matmul(a, b)
        iterations += 1
        if dev.type == "cuda" and iterations % 16:
            continue
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        elapsed = time.perf_counter() - started
        if elapsed >= budget_s:
            break
    gflops = 2 * size**3 * iterations / elapsed / 1e9
    logger.info(
        "Measured %.1f GFLOP/s on %s (%d x %dx%d matmuls in %.2f s)",
        gflops,
        device,
        iterations,
        size,
        size,
        elapsed,
    )
    return gflops
