"""The live swarm as a scenario: what the coordinator plans from, in the same format as a file.

Inputs are all measured or checked: the live members (heartbeats), each peer's signed links
record (its RTTs, bandwidths and compute, ``swarmd.peers.records.links``), the reliability others
observed (``swarmd.peers.membership.reliability``) and the run spec (model and batch). The result goes
through the scenario parser like a file would, so the planner meets the same checks either way.

A link nobody measured yet (a peer just joined, or probes are still under way) is filled:
from the reverse direction when that was measured, else with the median of the measured
links; ``Snapshot.filled`` counts these, so an operator sees how much of the matrix is a guess.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from swarmd.peers.planning.scenario import Scenario, parse_scenario
from swarmd.peers.records.links import LinksRecord

DEFAULT_LATENCY_S = 0.01
DEFAULT_BANDWIDTH_BPS = 12.5e6
"""What an unmeasured link is assumed to be when nothing at all is measured (100 Mbit/s)."""
DEFAULT_TFLOPS = 1.0


@dataclass(frozen=True)
class Member:
    peer_id: str
    memory_gib: float
    tflops_claimed: float = 0.0
    """From the heartbeat (the peer's own benchmark): used only when no links record exists."""


@dataclass(frozen=True)
class Snapshot:
    scenario: Scenario
    measured: int
    """Directed links measured by their sender."""
    filled: int
    """Directed links filled in (reverse direction or the median)."""


def build_snapshot(
    name: str,
    members: Sequence[Member],
    links: Mapping[str, LinksRecord],
    uptime: Mapping[str, tuple[float | None, float | None]],
    model: dict[str, Any],
    batch: dict[str, int],
) -> Snapshot:
    """``uptime[peer]``: (mean uptime h, mean downtime h) as observed by others, (None, None)
    when nobody has observed it long enough. The scenario leaves the shape free: the planner
    keeps the run's stage count (``PlannerConfig.stages``) and chooses how many pipelines,
    so that repairs can add and drop pipelines as members come and go."""
    ordered = sorted(members, key=lambda m: m.peer_id)
    ids = [m.peer_id for m in ordered]
    n = len(ids)
    lat: list[list[float | None]] = [[None] * n for _ in range(n)]
    bw: list[list[float | None]] = [[None] * n for _ in range(n)]
    index = {p: i for i, p in enumerate(ids)}
    for i, p in enumerate(ids):
        record = links.get(p)
        if record is None:
            continue
        for q, (latency, bandwidth, _age) in record.links.items():
            j = index.get(q)
            if j is None:
                continue
            lat[i][j] = latency if latency >= 0 else None
            bw[i][j] = bandwidth if bandwidth > 0 else None
    measured = sum(1 for i in range(n) for j in range(n) if i != j and bw[i][j] is not None)
    lat_full, filled_lat = _fill(lat, DEFAULT_LATENCY_S)
    bw_full, filled_bw = _fill(bw, DEFAULT_BANDWIDTH_BPS)
    devices = []
    known_tflops = [links[p].tflops for p in ids if p in links and links[p].tflops > 0]
    fallback_tflops = statistics.median(known_tflops) if known_tflops else DEFAULT_TFLOPS
    for m in ordered:
        record = links.get(m.peer_id)
        tflops = record.tflops if record is not None and record.tflops > 0 else m.tflops_claimed or fallback_tflops
        device: dict[str, Any] = {"id": m.peer_id, "tflops": tflops, "memory_gib": max(m.memory_gib, 1e-3)}
        up, down = uptime.get(m.peer_id, (None, None))
        if up is not None:
            device["mean_uptime_h"] = max(up, 1e-3)
            device["mean_downtime_h"] = max(down or 0.0, 0.0)
        devices.append(device)
    raw = {
        "name": name,
        "devices": devices,
        "latency_s": lat_full,
        "bandwidth_Bps": bw_full,
        "model": model,
        "batch": batch,
    }
    return Snapshot(parse_scenario(raw), measured, max(filled_lat, filled_bw))


def _fill(matrix: list[list[float | None]], default: float) -> tuple[list[list[float]], int]:
    n = len(matrix)
    known = [v for i in range(n) for j in range(n) if i != j and (v := matrix[i][j]) is not None]
    median = statistics.median(known) if known else default
    out = [[0.0] * n for _ in range(n)]
    filled = 0
    for i in range(n):
        for j in range(n):
            if i == j:
                continue
            v = matrix[i][j]
            if v is None:
                v = matrix[j][i]
                filled += 1
            out[i][j] = float(v if v is not None else median)
    return out, filled


def model_for_scenario(layers: int, hidden: int, vocab: int, seq_len: int, dtype_bytes: int = 2) -> dict[str, Any]:
    """The scenario's model object for a run's model shape (GPT-style blocks: 12 hidden^2
    parameters each, plus token and position embeddings)."""
    params = layers * 12 * hidden * hidden + vocab * hidden + seq_len * hidden
    return {
        "layers": layers,
        "hidden": hidden,
        "seq_len": seq_len,
        "vocab": vocab,
        "params": float(params),
        "dtype_bytes": dtype_bytes,
    }
