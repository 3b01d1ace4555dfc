"""What this peer offers the swarm's planner: its device, what the probe measured, and the speed it is priced at.

The probe (``swarmd.node.compute_probe``) measures the TFLOPS the device achieves at the run's
block; the planner may count on that times ``[limits] cpu_share``, since compute runs at most
that share of the time. Before a measurement (or with ``[compute] benchmark`` off) the
device's rated figure stands in (``swarmd.node.rated_tflops``), and the heartbeat says it has
measured nothing, so that its readers take the same rated figure by the device's name.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from swarmd.node.compute_probe import ProbeResult, probe_device
from swarmd.node.device import describe_device, resolve_device
from swarmd.node.rated_tflops import rated_tflops
from swarmd.peers.records.heartbeat import DeviceInfo
from swarmd.training.cells.throttle import COMPUTE_LIMITS

if TYPE_CHECKING:
    from swarmd.config import ComputeConfig, LimitsConfig
    from swarmd.peers.records.run_spec import RunSpec


class DeviceOffer:
    """This peer's device and its last measurement; what the heartbeat and the status say of them."""

    def __init__(self, share: Callable[[], float] = lambda: COMPUTE_LIMITS.share) -> None:
        """``share()``: the ``[limits] cpu_share`` in force."""
        self.device = DeviceInfo(kind="cpu", name="unknown", memory_bytes=0, cpus=1)
        self.probe: ProbeResult | None = None
        """The last measurement (None: none yet)."""
        self.achieved_tflops = 0.0
        """The probe's figure (0: not measured): what ``tflops`` scales."""
        self.rated_tflops: float | None = None
        """The device's rated dense bf16 TFLOPS; None: not known (every CPU)."""
        self.share = share

    async def measure(self, compute: ComputeConfig, limits: LimitsConfig | None, run: RunSpec | None) -> None:
        """The device and, with ``[compute] benchmark``, the TFLOPS it achieves at ``run``'s block
        (a generic one before the run's spec is known) in the cells' precision, with ``[limits]
        torch_threads`` (none: torch's default). Torch work, so in a worker thread."""
        device = await asyncio.to_thread(resolve_device, compute.device)
        self.device = await asyncio.to_thread(describe_device, device)
        self.rated_tflops = rated_tflops(self.device.name, self.device.kind)
        if compute.benchmark:
            threads = limits.torch_threads if limits is not None else 0
            self.probe = await asyncio.to_thread(probe_device, device, compute, threads, run)
            self.achieved_tflops = self.probe.achieved_tflops

    def tflops(self) -> float:
        """The speed the planner may count on: the achieved TFLOPS times the CPU share; before a
        measurement, the device's rated figure (0: none known)."""
        if self.achieved_tflops > 0:
            return self.achieved_tflops * self.share()
        return self.rated_tflops or 0.0

    def heartbeat_fields(self) -> dict[str, Any]:
        """The heartbeat's ``throughput_gflops``, ``free_memory_bytes`` and ``precision``: all
        zero or empty before a measurement (readers then take the rated figure themselves)."""
        measured = self.achieved_tflops > 0
        return {
            "throughput_gflops": self.tflops() * 1000 if measured else 0.0,
            "free_memory_bytes": self.probe.free_memory_bytes if self.probe is not None else 0,
            "precision": self.probe.dtype if self.probe is not None else "",
        }

    def status(self) -> dict[str, Any]:
        """The status's ``probe``: what the device achieved (None: not measured), its rated
        figure and their ratio, the share, and what the measurement was (precision, threads,
        shapes, the smallest share of a micro-batch timed, free memory, its time)."""
        measured = self.achieved_tflops if self.achieved_tflops > 0 else None
        rated = self.rated_tflops
        out: dict[str, Any] = {
            "achieved_tflops": None if measured is None else round(measured, 4),
            "rated_tflops": rated,
            "of_rated": None if measured is None or not rated else round(measured / rated, 4),
            "cpu_share": self.share(),
        }
        probe = self.probe
        if probe is not None:
            out |= {
                "precision": probe.dtype,
                "threads": probe.threads,
                "run_shapes": probe.run_shapes,
                "min_fraction": round(probe.min_fraction, 4),
                "free_memory_bytes": probe.free_memory_bytes,
                "seconds": round(probe.seconds, 2),
            }
        return out
