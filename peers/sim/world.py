"""The simulated swarm's world: the devices' state, the event engine, the counts and the settings.

Every part of a simulated data path (``swarmd_path``, ``sync_path`` and their parts) and the
control plane read the one ``World`` the run builds (``swarmd.peers.sim.simulator``), and take
their siblings explicitly; nothing else is shared.

- **Devices**: who is up (``up``: the truth) and who the membership knows (``member``, from
  when: ``member_since``); ``epoch`` moves on at each departure, so its pending events lapse.
- **The engine** (``swarmd.peers.sim.engine``): the event queue and the shared links, reading
  ``up`` as the world changes it.
- **Counts**: named counters, the time per phase (``op_times``), the staleness of what the
  shards took, and what is trained (micro-batches, updates, a timeline of ``bucket_s``).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

import numpy as np

from swarmd.peers.membership.election import ElectionConfig
from swarmd.peers.planning.scenario import Scenario
from swarmd.peers.planning.transfers import KEEP_VERSIONS
from swarmd.peers.sim.engine import Engine, Overheads
from swarmd.peers.sim.op_times import OpTimes


@dataclass(frozen=True)
class SimConfig:
    hours: float = 1.0
    seed: int = 0
    churn: bool = True
    max_staleness: int = 4
    """Server versions a contribution may lag and still count (the run spec's)."""
    detect_s: float = 60.0
    """A departure is noticed this long after it happens (the heartbeat TTL, and a lease's)."""
    join_s: float = 30.0
    """A returning device is in the membership this long after it comes back."""
    lease_s: float = 900.0
    """A share's lease at the ledger."""
    bucket_s: float = 60.0
    checkpoint_every: int = 10
    """Steps between the checkpoints a shard's holder sends its standby."""
    keep_versions: int = KEEP_VERSIONS
    """Deltas a shard keeps for pulls; a cell further behind gets the whole slice."""
    standing_queue_s: float = 0.0
    """The delay a busy interface's buffer adds to every packet through it (bufferbloat)."""
    request_overhead_s: float = 0.0
    """A request's cost beyond its latency and bytes (the calibration measures it)."""
    connection_queue_bytes: float = 0.0
    """The bytes of another transfer between the same two peers a message waits behind."""
    coalesce_flows: int = 2000
    """Past this many flows in flight the links re-divide rates at most every ``coalesce_s``:
    an exchange of a thousand cells with a hundred shards each is a hundred thousand flows."""
    coalesce_s: float = 0.5
    coordinate_s: float = 10.0
    """The coordinator's round: it plans at its first round after a change is noticed (the
    daemon's coordination loop runs every two heartbeats, within 4-10 s: 10 s at the default
    heartbeat). Each device's rounds have their own phase, drawn from the seed."""
    thresholds: ElectionConfig = ElectionConfig()
    """Who may coordinate and relay (the daemon's ``[roles]``, whose defaults these are)."""
    data_via_relay: str = "auto"
    """The daemon's ``[swarm] data_via_relay``: auto, always or never."""
    max_events: int = 200_000_000


class World:
    """The devices of ``scenario`` (those of ``up0`` up at time 0, every one a member), the
    engine their messages run on, and the run's counts (module doc)."""

    def __init__(self, scenario: Scenario, settings: SimConfig, up0: np.ndarray) -> None:
        self.scenario, self.settings = scenario, settings
        self.horizon = settings.hours * 3600.0
        self.n = scenario.n
        self.up = up0.copy()
        self.member = up0.copy()  # what the membership knows (noticed departures and returns)
        self.member_since = np.zeros(self.n)
        self.epoch = np.zeros(self.n, dtype=np.int64)  # bumped at a departure: its events lapse
        self.ids = scenario.ids
        self.index = {p: i for i, p in enumerate(self.ids)}
        self.tflops = scenario.device_arrays.tflops * 1e12
        self.availability = scenario.device_arrays.availability
        overheads = Overheads(
            settings.request_overhead_s,
            settings.standing_queue_s,
            settings.connection_queue_bytes,
            settings.coalesce_flows,
            settings.coalesce_s,
        )
        # The engine reads ``up`` itself (the same array): it sends nothing from or to a device down.
        self.engine = Engine(
            scenario.latency_s, scenario.bandwidth_Bps, self.ids, self.up, overheads, settings.data_via_relay
        )
        self.counts: Counter[str] = Counter()
        self.phases = OpTimes()
        self.staleness: Counter[int] = Counter()
        self.timeline = [0] * (int(math.ceil(self.horizon / settings.bucket_s)) + 1)
        self.trained_mb = 0
        self.updates = 0

    def members(self) -> list[int]:
        return [int(i) for i in np.flatnonzero(self.member)]

    def changed(self, device: int, up: bool) -> int:
        """``device`` came (``up``) or went; a departure moves its epoch on, so that events for
        it as it was lapse. Returns the epoch its notice carries."""
        self.up[device] = up
        if not up:
            self.epoch[device] += 1
        return int(self.epoch[device])

    def noticed(self, now: float, device: int, up: bool) -> None:
        """The membership learns at ``now`` that ``device`` came (``up``) or went."""
        self.member[device] = up
        self.member_since[device] = now

    def trained(self, now: float, micro_batches: int, updates: int) -> None:
        """Shard (0, 0) committed ``updates`` steps applying ``micro_batches`` new ones."""
        self.updates += updates
        self.trained_mb += micro_batches
        bucket = int(now // self.settings.bucket_s)
        if bucket < len(self.timeline):
            self.timeline[bucket] += micro_batches

    def untrained(self, micro_batches: int) -> None:
        """Committed micro-batches a failover could not restore are not trained after all."""
        self.trained_mb -= micro_batches
