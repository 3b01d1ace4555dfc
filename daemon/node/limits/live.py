"""The ``[limits]`` in force, applied to this process at start and again on every reload.

``LiveLimits.apply`` takes a new ``LimitsConfig`` and applies what it can at once: the CPU share
(``swarmd.training.cells.throttle``), torch's threads, the GPU memory cap, the traffic caps
(``swarmd.peers.wire.shaping``); the pause reasons (windows, battery, programs, in use, the GPU's
other users) are read from it at the node's next check. ``reload_changes`` compares two whole
configs: the ``[limits]`` keys that changed are applied live, those of every other section need
a restart and are named so, never half-applied.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from swarmd.errors import SwarmdError
from swarmd.peers.wire.shaping import apply_traffic_limits
from swarmd.training.cells.throttle import COMPUTE_LIMITS, ComputeLimits

if TYPE_CHECKING:
    from swarmd.config import Config, LimitsConfig

logger = logging.getLogger(__name__)

LIVE_SECTION = "limits"


def changed_keys(old: Any, new: Any) -> list[str]:
    """The fields of two dataclasses of one type whose values differ."""
    return [f.name for f in dataclasses.fields(old) if getattr(old, f.name) != getattr(new, f.name)]


def reload_changes(old: Config, new: Config) -> tuple[list[str], list[str]]:
    """(``[limits]`` keys that changed, ``section.key`` of every other change): what a reload
    applies live, and what needs a restart."""
    live, restart = [], []
    for f in dataclasses.fields(old):
        keys = changed_keys(getattr(old, f.name), getattr(new, f.name))
        if f.name == LIVE_SECTION:
            live = keys
        else:
            restart += [f"{f.name}.{key}" for key in keys]
    return live, restart


async def reload_config(config: Config, source: Callable[[], Config], live: LiveLimits) -> dict[str, Any]:
    """Read the config again (``source``: as at start, file, environment and command line) and
    apply its ``[limits]`` to ``config`` and ``live``; other changed keys are logged and answered
    as needing a restart. One that fails to load changes nothing: its error is raised."""
    try:
        new = await asyncio.to_thread(source)
    except SwarmdError as e:
        logger.warning("Reload refused; the limits in force stay: %s", e)
        raise
    _, restart = reload_changes(config, new)
    applied = live.apply(new.limits)
    config.limits = new.limits
    for key in restart:
        logger.warning("Reload: %s changed; it takes effect at the next restart", key)
    if not applied and not restart:
        logger.info("Reload: the config is unchanged")
    return {"applied": applied, "restart_needed": restart}


def gpu_memory_fraction(gib: float, total_bytes: int) -> float:
    """The fraction of a device's memory a cap of ``gib`` is (0: no cap, 1.0; at most the whole)."""
    if gib <= 0 or total_bytes <= 0:
        return 1.0
    return min(1.0, gib * (1 << 30) / total_bytes)


class LiveLimits:
    """The limits this process runs under, and how each is applied."""

    def __init__(self, limits: LimitsConfig, compute: ComputeLimits = COMPUTE_LIMITS) -> None:
        self.limits = limits
        self._compute = compute
        self.device: str | None = None
        """The compute's torch device, once compute starts (torch is imported only then)."""
        self._default_threads = 0
        self.gpu_memory = "does not apply until compute starts"
        self.on_data_cache: Callable[[int], None] | None = None
        """Given the new ``data_cache_gib`` in bytes, once the run's file store exists."""

    def start(self) -> None:
        """At the node's start: what needs no torch."""
        self._compute.set(self.limits.cpu_share)
        apply_traffic_limits(self.limits)

    def start_compute(self, device: str) -> None:
        """When the trainer starts (torch imported): threads and GPU memory too."""
        import torch

        self.device = device
        self._default_threads = torch.get_num_threads()
        self._apply_threads()
        self._apply_gpu_memory()

    def apply(self, new: LimitsConfig) -> list[str]:
        """Apply ``new`` at once; returns one line per changed key (also logged)."""
        old, self.limits = self.limits, new
        keys = changed_keys(old, new)
        if "cpu_share" in keys:
            self._compute.set(new.cpu_share)
        if self.device is not None and "torch_threads" in keys:
            self._apply_threads()
        if self.device is not None and "gpu_memory_gib" in keys:
            self._apply_gpu_memory()
        if {"upload_mbit_s", "download_mbit_s", "daily_transfer_gib"} & set(keys):
            apply_traffic_limits(new)
        if "data_cache_gib" in keys and self.on_data_cache is not None:
            self.on_data_cache(int(new.data_cache_gib * 2**30))  # a smaller cache evicts as it next fetches
        lines = [f"[limits] {key}: {getattr(old, key)!r} -> {getattr(new, key)!r}" for key in keys]
        for line in lines:
            logger.info("Applied %s", line)
        return lines

    def _apply_threads(self) -> None:
        import torch

        count = self.limits.torch_threads or self._default_threads
        torch.set_num_threads(count)  # the count a thread that starts later begins with
        # Each cell's worker thread takes it before its next job (torch keeps it per thread).
        self._compute.threads = count
        # On a CPU the share is of the cores compute runs on, all of swarmd's CPU time counted;
        # on a GPU, of the time compute runs (swarmd.training.cells.throttle).
        self._compute.meter_cpu(count if self.device == "cpu" else 0)

    def _apply_gpu_memory(self) -> None:
        if self.device is None or not self.device.startswith("cuda"):
            self.gpu_memory = "does not apply: compute runs on the CPU"
            return
        import torch

        index = torch.device(self.device).index or 0
        total = int(torch.cuda.get_device_properties(index).total_memory)
        fraction = gpu_memory_fraction(self.limits.gpu_memory_gib, total)
        torch.cuda.set_per_process_memory_fraction(fraction, index)
        cap = f"{fraction * total / (1 << 30):.1f} of {total / (1 << 30):.1f} GiB"
        self.gpu_memory = cap if fraction < 1 else f"no cap ({total / (1 << 30):.1f} GiB)"

    def status(self) -> dict[str, Any]:
        """The ``limits`` entry of the daemon's status: the keys in force, and how each applies."""
        return {
            **dataclasses.asdict(self.limits),
            "applied": {
                "cpu_share": self._compute.share,
                "throttled_s": round(self._compute.throttled_s, 1),
                "torch_threads": self._compute.threads or None,
                "gpu_memory": self.gpu_memory,
                "gpu_memory_peak_bytes": self._gpu_peak_bytes(),
            },
        }

    def _gpu_peak_bytes(self) -> int | None:
        """What this process's compute has held at most on its CUDA device (the allocator's
        peak, ``torch.cuda.max_memory_allocated``), against the cap above; None on the CPU."""
        if self.device is None or not self.device.startswith("cuda"):
            return None
        import torch

        return int(torch.cuda.max_memory_allocated(torch.device(self.device)))


class Reloads:
    """The daemon's reloads (SIGHUP, ``swarmd config reload``): ``reload_config``, then the
    pause reasons checked at once rather than at the next round."""

    def __init__(self, config: Config, live: LiveLimits, check: Callable[[], Awaitable[None]]) -> None:
        self.config = config
        self.live = live
        self._check = check
        self.source: Callable[[], Config] | None = None
        """Reads the config as at start (its file, SWARMD_*, the command line); set by ``swarmd run``."""
        self._task: asyncio.Task[None] | None = None

    async def reload(self) -> dict[str, Any]:
        if self.source is None:
            raise SwarmdError("this daemon was started without a config source to re-read; restart it instead")
        answer = await reload_config(self.config, self.source, self.live)
        if answer["applied"]:
            await self._check()
        return answer

    def request(self) -> None:
        """On SIGHUP: reload in a task of its own; a refusal is logged, and the limits in force stay."""

        async def logged() -> None:
            with contextlib.suppress(SwarmdError):
                await self.reload()

        self._task = asyncio.create_task(logged(), name="reload")
