"""A pipeline's compute and boundary times per micro-batch, for ``exchange.share_seconds``.

What a share lasts on swarmd's data path (``pipelines``) and a step on the baselines'
(``sync_path``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from swarmd.peers.sim.workload import Workload
    from swarmd.peers.sim.world import World


@dataclass
class Timing:
    """A pipeline's compute and boundary times per micro-batch, for ``exchange.share_seconds``."""

    forward_s: list[float]
    backward_s: list[float]
    send_s: list[float]
    nbytes: list[float]
    """A micro-batch's activation bytes across each boundary (as much again back)."""
    via: list[int | None]
    tail_forward: list[float]
    """After a boundary's activations are all in: the last micro-batch's way to the end and back."""
    tail_backward: list[float]
    floor_s: float
    """A device holding several cells computes them one after the other."""


def pipeline_timing(world: World, w: Workload, cells: Sequence[int | None]) -> Timing:
    """The times of a pipeline of these devices, stage by stage: compute from their TFLOPS,
    each boundary's activation in its link's codec, through a relay when the routing rule
    says so. A device holding several cells computes them one after the other."""
    engine = world.engine
    devices = [d for d in cells if d is not None]
    assert len(devices) == len(cells), "every cell needs a device"
    tflops = [float(world.tflops[d]) for d in devices]
    fwd = [f / t for f, t in zip(w.forward_flops, tflops, strict=True)]
    bwd = [b / t for b, t in zip(w.backward_flops, tflops, strict=True)]
    send: list[float] = []
    nbytes: list[float] = []
    vias: list[int | None] = []
    for a, c in zip(devices, devices[1:], strict=False):
        if a == c:
            send.append(0.0)
            nbytes.append(0.0)
            vias.append(None)
            continue
        act = w.activation_bytes(float(world.scenario.bandwidth_Bps[a, c]))
        via = engine.route(a, c, act)
        rate = engine.path_rate(a, c, via)
        act = w.activation_bytes(rate)
        send.append(engine.way(a, c, via) + act / rate)
        nbytes.append(float(act))
        vias.append(via)
    stages = len(devices)
    per_device: dict[int, float] = {}
    for d, f, b in zip(devices, fwd, bwd, strict=True):
        per_device[d] = per_device.get(d, 0.0) + f + b
    return Timing(
        forward_s=fwd,
        backward_s=bwd,
        send_s=send,
        nbytes=nbytes,
        via=vias,
        tail_forward=[sum(fwd[b + 1 :]) + sum(bwd) + sum(send[b + 1 :]) + sum(send) for b in range(stages - 1)],
        tail_backward=[sum(bwd[: b + 1]) + sum(send[:b]) for b in range(stages - 1)],
        floor_s=max(per_device.values()) if len(per_device) < stages else 0.0,
    )
