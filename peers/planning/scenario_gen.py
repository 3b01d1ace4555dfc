"""Synthetic scenarios: regions of devices, fast inside, slow between, drawn from a seed.

For the tests (a swarm whose best plan can be reasoned out by hand), the scheduler benchmark
(a thousand devices, which no shipped file holds) and the simulator. The shape follows the
shared examples: one-way latency of a few milliseconds inside a region and tens between,
bandwidth of 10-125 MB/s inside and 1-10 MB/s between, consumer to datacentre GPUs.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from swarmd.peers.planning.scenario import Scenario, parse_scenario

GPUS = ((15.0, 12), (20.0, 16), (35.0, 16), (65.0, 24), (80.0, 32), (120.0, 32), (230.0, 80))
"""(dense TFLOPS, memory GiB) of the device kinds volunteers bring, slow and common first."""
SMALL_MODEL = {"layers": 12, "hidden": 1024, "seq_len": 2048, "vocab": 50257, "params": 2.0e8, "dtype_bytes": 2}


def synthetic_scenario_dict(n: int, **kwargs: Any) -> dict[str, Any]:
    """A scenario object in the file format (``scenarios/FORMAT.md``); the keywords are
    ``_synthetic``'s."""
    out = _synthetic(n, **kwargs)
    out["latency_s"] = out["latency_s"].tolist()
    out["bandwidth_Bps"] = out["bandwidth_Bps"].tolist()
    return out


def synthetic_scenario(n: int, **kwargs: Any) -> Scenario:
    """The scenario of ``synthetic_scenario_dict``, its matrices kept as arrays: the same
    values, without 2 n^2 Python floats (gigabytes and minutes at 10,000 devices)."""
    return parse_scenario(_synthetic(n, **kwargs))


def _synthetic(
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
    """The scenario object with its matrices as float64 arrays."""
    rng = np.random.default_rng(seed)
    region = rng.integers(0, regions, size=n) if regions > 1 else np.zeros(n, dtype=int)
    kinds = rng.choice(len(GPUS), size=n, p=_kind_weights())
    same = region[:, None] == region[None, :]
    latency = _mix(rng, same, (0.0003, 0.01), (0.03, 0.1))
    bandwidth = _mix(rng, same, intra_Bps, inter_Bps)
    np.fill_diagonal(latency, 0.0)
    np.fill_diagonal(bandwidth, 0.0)
    np.round(latency, 6, out=latency)
    np.round(bandwidth, 0, out=bandwidth)
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
        "latency_s": latency,
        "bandwidth_Bps": bandwidth,
        "model": dict(model or SMALL_MODEL),
        "batch": dict(batch or {"sequences": 256, "micro_batch": 1}),
    }
    if parallelism is not None:
        out["parallelism"] = dict(parallelism)
    return out


ROWS_PER_DRAW = 256
"""Rows of the second matrix drawn at a time (the generator's stream is the same as one draw
of the whole matrix), so that a 10,000-device scenario never holds more than one full
matrix of draws beside the result."""


def _mix(
    rng: np.random.Generator, same: np.ndarray, inside: tuple[float, float], between: tuple[float, float]
) -> np.ndarray:
    """``np.where(same, uniform(*inside), uniform(*between))`` over an n x n matrix, drawn in
    the same order as those two whole draws (so the values are the same), in place."""
    n = len(same)
    out = rng.uniform(*inside, (n, n))
    for lo in range(0, n, ROWS_PER_DRAW):
        rows = slice(lo, min(n, lo + ROWS_PER_DRAW))
        other = rng.uniform(*between, (rows.stop - lo, n))
        np.copyto(out[rows], other, where=~same[rows])
    return out


def _kind_weights() -> np.ndarray:
    w = np.array([4.0, 4.0, 3.0, 3.0, 2.0, 1.5, 1.0])
    return w / w.sum()
