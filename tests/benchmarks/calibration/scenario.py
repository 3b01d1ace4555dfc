"""The swarm both sides run: the default run's model, the daemons' heartbeat, and the
emulated devices and links written as a scenario for the simulator.

Both the real daemons and the simulation read these, so that the two sides differ only in
what the comparison is about (real processes and sockets against the model of them).
"""

from __future__ import annotations

from swarmd.models.build import build_model
from swarmd.models.presets import DEFAULT_RUN
from swarmd.models.shape import ModelShape
from swarmd.peers.planning.scenario import Scenario, parse_scenario

HEARTBEAT_INTERVAL_S = 1.0
HEARTBEAT_TTL_S = 6.0
HEARTBEAT = ["--heartbeat-interval", f"{HEARTBEAT_INTERVAL_S:g}", "--heartbeat-ttl", f"{HEARTBEAT_TTL_S:g}"]
"""The daemons' heartbeat flags: shorter than the defaults so that a killed daemon is noticed
within a window; the simulation detects a leaver after the same TTL."""


def model_shape() -> ModelShape:
    """The default run's model, which the daemons train and the scenario prices."""
    return ModelShape.from_dict(DEFAULT_RUN["model"])


def tokens_per_micro_batch() -> int:
    """Tokens in one micro-batch of the default run: the unit both timelines count in."""
    return DEFAULT_RUN["batch"]["micro_batch"] * model_shape().seq_len


def per_device(value: str, devices: int, name: str) -> list[float]:
    """A figure for every device: one for all (``40``), or one each (``40,40,20,10``)."""
    try:
        figures = [float(v) for v in str(value).split(",")]
    except ValueError:
        raise ValueError(f"{name} {value!r} is not a number or a comma-separated list of numbers") from None
    if len(figures) == 1:
        figures *= devices
    if len(figures) != devices or min(figures) <= 0:
        raise ValueError(f"{name} {value!r}: give one positive figure, or one for each of the {devices} devices")
    return figures


def calibration_scenario(
    tflops: float, rates_Bps: list[float], access_latency_s: list[float], efficiency: float | list[float]
) -> Scenario:
    """The emulated swarm as a scenario: a link runs at the slower of its ends' shaped rates
    times their ``efficiency`` (the data path's goodput over the shaped rate, measured per
    device or once for all), and takes the sum of its ends' access latencies. Messages are
    priced by the data path's own sizes (``swarmd.peers.wire.sizes``), from the model."""
    e = efficiency if isinstance(efficiency, list) else [efficiency] * len(rates_Bps)
    goodput = [rate * factor for rate, factor in zip(rates_Bps, e, strict=True)]
    shape, run = model_shape(), DEFAULT_RUN
    params = sum(p.numel() for p in build_model(shape, 0).parameters())
    n = len(rates_Bps)
    return parse_scenario(
        {
            "name": "calibration",
            "devices": [{"id": f"d{i}", "tflops": tflops, "memory_gib": 8} for i in range(n)],
            "latency_s": [
                [0.0 if i == j else access_latency_s[i] + access_latency_s[j] for j in range(n)] for i in range(n)
            ],
            "bandwidth_Bps": [[None if i == j else min(goodput[i], goodput[j]) for j in range(n)] for i in range(n)],
            # activations travel in fp16 (gpt2: the wire's half dtype)
            "model": {
                "layers": shape.layers,
                "hidden": shape.hidden,
                "seq_len": shape.seq_len,
                "vocab": shape.vocab,
                "params": float(params),
                "dtype_bytes": 2,
            },
            "batch": {"sequences": run["batch"]["sequences"], "micro_batch": run["batch"]["micro_batch"]},
            "parallelism": {"stages": run["stages"], "data_parallel": max(1, n // run["stages"])},
        }
    )
