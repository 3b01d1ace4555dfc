"""Synthetic scenarios: regions of devices, fast inside, slow between, drawn from a seed.

For the tests (a swarm whose best plan can be reasoned out by hand), the scheduler benchmark
(a thousand devices, which no shipped file holds) and the simulator. The shape follows the
shared examples: one-way latency of a few milliseconds inside a region and tens between,
bandwidth of 10-125 MB/s inside and 1-10 MB/s between, consumer to datacentre GPUs.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from swarmd.peers.scenario import Scenario, parse_scenario

GPUS = ((15.0, 12), (20.0, 16), (35.0, 16), (65.0, 24), (80.0, 32), (120.0, 32), (230.0, 80))
"""(dense TFLOPS, memory GiB) of the device kinds volunteers bring, slow and common first."""
SMALL_MODEL = {"layers": 12, "hidden": 1024, "seq_len": 2048, "vocab": 50257, "params": 2.0e8, "dtype_bytes": 2}


def synthetic_scenario_dict(
    n: int,
    *,
    regions: int = 3,
    seed: int = 0,
    model: dict[str, Any] | None = None,
    batch: dict[str, int] | None = None,
    parallelism: dict[str, int] | None = None,
    churn: bool = False,
    intra_Bps: tuple[float, float] = (1.0e7, 1.25e8),
    inter_Bps: tuple[float, float] = (1.0e6, 1.0e7),
) -> dict[str, Any]:
    """A scenario object in the file format (``scenarios/FORMAT.md``)."""
    rng = np.random.default_rng(seed)
    region = rng.integers(0, regions, size=n) if regions > 1 else np.zeros(n, dtype=int)
    kinds = rng.choice(len(GPUS), size=n, p=_kind_weights())
    same = region[:, None] == region[None, :]
    latency = np.where(same, rng.uniform(0.0003, 0.01, (n, n)), rng.uniform(0.03, 0.1, (n, n)))
    bandwidth = np.where(same, rng.uniform(*intra_Bps, (n, n)), rng.uniform(*inter_Bps, (n, n)))
    np.fill_diagonal(latency, 0.0)
    np.fill_diagonal(bandwidth, 0.0)
    devices = []
    for i in range(n):
        tflops, memory = GPUS[kinds[i]]
        device: dict[str, Any] = {
            "id": f"d{i:04d}",
            "tflops": round(float(tflops * rng.uniform(0.8, 1.2)), 2),
            "memory_gib": memory,
            "region": f"r{region[i]}",
        }
        if churn:
            device["mean_uptime_h"] = round(float(rng.lognormal(2.5, 1.2)), 3)
            device["mean_downtime_h"] = round(float(rng.lognormal(0.5, 1.0)), 3)
        devices.append(device)
    out: dict[str, Any] = {
        "name": f"synthetic-{n}-r{regions}-s{seed}",
        "devices": devices,
        "latency_s": np.round(latency, 6).tolist(),
        "bandwidth_Bps": np.round(bandwidth, 0).tolist(),
        "model": dict(model or SMALL_MODEL),
        "batch": dict(batch or {"sequences": 256, "micro_batch": 1}),
    }
    if parallelism is not None:
        out["parallelism"] = dict(parallelism)
    return out


def synthetic_scenario(n: int, **kwargs: Any) -> Scenario:
    return parse_scenario(synthetic_scenario_dict(n, **kwargs))


def _kind_weights() -> np.ndarray:
    w = np.array([4.0, 4.0, 3.0, 3.0, 2.0, 1.5, 1.0])
    return w / w.sum()
