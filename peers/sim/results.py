"""What a simulated run measured, and the physical limits it is held against.

- ``SimResult``: trained tokens (the micro-batches of the contributions applied in committed
  updates at shard ``(0, 0)``, times the tokens per micro-batch: "applied updates x batch
  tokens / time", never micro-batches merely touched), the timeline of them, updates and
  updates lost, shares recomputed, contributions lost or dropped as stale, the bytes every
  device sent and received, recovery after departures, the plans and their runtimes, and
  where the time went (``phases``: shares, exchanges, pulls, waits).
- ``compute_bound_tokens_per_s``: the devices' TFLOPS over the model's flops per token,
  time-averaged over who is up under churn.
- ``single_device``: the fastest device of the scenario alone, at its rated TFLOPS, if the
  model with its optimizer state fits its memory.
- ``recovery_times``: how long after a departure the timeline is back to what it was.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from swarmd.peers.planning.plan_cost import activation_memory_bytes
from swarmd.peers.planning.scenario import Scenario
from swarmd.peers.sim.churn import ChurnEvent

ALONE_BYTES_PER_PARAM = 16
"""What training alone holds per parameter: fp32 weights and gradient, and AdamW's two fp32
moments (no parameter server to keep them elsewhere)."""


@dataclass
class PlanEvent:
    at_s: float
    kind: str  # full, repair, replan, or "failed: ..."
    runtime_s: float
    devices: int
    pipelines: int


@dataclass(frozen=True)
class PathFigures:
    """What a data path reports of its own at the end of a run."""

    shards: tuple[int, ...]
    """K per stage (empty: a data path without parameter servers)."""
    local_steps: int
    share_micro_batches: int
    shares_recomputed: int
    micro_batches_recomputed: int
    pipelines: int
    tokens_per_micro_batch: int
    reduce_groups: tuple[int, ...] = ()
    """G per stage at the end (empty: no stage reduces in groups)."""


@dataclass
class SimResult:
    strategy: str
    hours: float
    seed: int
    devices: int
    tokens: int
    """Trained tokens: micro-batches applied in committed updates at shard (0, 0), in tokens."""
    tokens_per_s: float
    timeline: list[int]
    """Trained micro-batches committed in each ``bucket_s`` of simulated time."""
    bucket_s: float
    tokens_per_micro_batch: int
    updates: int
    """Committed updates of shard (0, 0)."""
    updates_lost: int
    """Committed updates that a failover could not restore (no live copy had them), all shards."""
    shares_recomputed: int
    """Shares issued again by the ledger: abandoned by a pipeline that lost a cell, open at a
    failover of the ledger's shard, or whose stage-0 contribution was dropped as stale."""
    micro_batches_recomputed: int
    contributions_lost: int
    """Contributions of a later stage lost with their cell (it left between its backward and
    its contribution's arrival): counted, not recomputed (``docs/data-path.md``)."""
    stale_dropped: int
    staleness: dict[int, int]
    """Applied contributions by their staleness (server version minus their base version)."""
    duplicates: int
    """Contributions for shares a shard had already committed (recomputes), acknowledged and
    not applied again."""
    departures: int
    returns: int
    plan_events: list[PlanEvent]
    recovery_s: list[float]
    wall_s: float
    events: int
    failovers: int
    shape: tuple[int, int]
    """(stages, pipelines) of the first plan."""
    shards: tuple[int, ...]
    """K: shards per stage."""
    local_steps: int
    share_micro_batches: int
    compute_bound_tokens_per_s: float
    reduce_groups: tuple[int, ...] = ()
    """G per stage at the end of the run (empty: no reduction groups)."""
    coordinator_changes: int = 0
    plans_lost: int = 0
    relays: int = 0
    relayed_transfers: int = 0
    spare_claims: int = 0
    """Cells a spare took by the pool's rule (``cells.spare_for``) before any repair."""
    sent_bytes: list[float] = field(default_factory=list)
    received_bytes: list[float] = field(default_factory=list)
    phases: dict[str, dict[str, float]] = field(default_factory=dict)
    """Where the time went, by phase: count and mean milliseconds (``OpTimes``)."""
    final_pipelines: int = 0
    roles: dict[int, list[str]] = field(default_factory=dict)
    """At the end: each device's roles (cell, shard server, standby, relay), by index."""

    def tokens_per_s_series(self) -> list[float]:
        return [n * self.tokens_per_micro_batch / self.bucket_s for n in self.timeline]


def flops_per_token(scenario: Scenario) -> float:
    """Forward and backward flops of the whole model per token trained."""
    m = scenario.model
    return (m.layers * m.layer_flops_per_sequence() + m.head_flops_per_sequence()) / m.seq_len


def compute_bound_tokens_per_s(
    scenario: Scenario, up0: np.ndarray, churn: Sequence[ChurnEvent], horizon_s: float
) -> float:
    """Every device up computing at its rated TFLOPS with nothing else to do, time-averaged
    over the churn schedule: the limit no data path can beat."""
    tflops = scenario.device_arrays.tflops * 1e12
    up = up0.copy()
    rate, last, total = float(tflops[up].sum()), 0.0, 0.0
    for ev in churn:
        if ev.at_s >= horizon_s:
            break
        total += rate * (ev.at_s - last)
        last = ev.at_s
        if ev.up != up[ev.device]:
            up[ev.device] = ev.up
            rate += tflops[ev.device] if ev.up else -tflops[ev.device]
    total += rate * (horizon_s - last)
    return total / horizon_s / flops_per_token(scenario)


@dataclass(frozen=True)
class SingleDevice:
    tokens_per_s: float | None
    """None: no device of the scenario holds the model with its optimizer state."""
    device: str | None
    needed_gib: float


def alone_memory_bytes(scenario: Scenario) -> float:
    """Training the whole model on one device: its parameters' state and one micro-batch's
    stashed activations through every layer."""
    m = scenario.model
    return m.params * ALONE_BYTES_PER_PARAM + activation_memory_bytes(scenario, m.layers)


def single_device(scenario: Scenario) -> SingleDevice:
    """The fastest device that can hold the model alone, at its rated TFLOPS."""
    need = alone_memory_bytes(scenario)
    arrays = scenario.device_arrays
    fits = np.flatnonzero(arrays.memory_gib * (1 << 30) >= need)
    if len(fits) == 0:
        return SingleDevice(None, None, need / (1 << 30))
    best = int(fits[np.argmax(arrays.tflops[fits])])
    return SingleDevice(
        float(arrays.tflops[best]) * 1e12 / flops_per_token(scenario), scenario.devices[best].id, need / (1 << 30)
    )


def recovery_times(
    timeline: Sequence[int], bucket_s: float, departures: Sequence[float], window: int = 10, back: float = 0.9
) -> list[float]:
    """For each departure: how long until a bucket reaches ``back`` of the mean of the
    ``window`` buckets before it (the throughput it had); departures with no full window
    before them, or no recovery before the end, are left out."""
    out = []
    for t in departures:
        b = int(t // bucket_s)
        if b < window:
            continue
        before = sum(timeline[b - window : b]) / window
        if before <= 0:
            continue
        for k in range(b + 1, len(timeline)):
            if timeline[k] >= back * before:
                out.append(max(0.0, (k + 1) * bucket_s - t))
                break
    return out
