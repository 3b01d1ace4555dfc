"""Small worlds for the simulator's unit tests: a few identical devices on fast links, a tiny
model, the world (``swarmd.peers.sim.world.World``) on them, the sizes of a hand-made plan,
and a recording stand-in for what the shard servers ask of the path (``shard_records.ShardClients``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from swarmd.peers.planning.plan_cost import Plan
from swarmd.peers.planning.scenario import Scenario, parse_scenario
from swarmd.peers.sim.pipeline_state import Cell, Pipeline
from swarmd.peers.sim.shard_records import Contribution, RoundGroup
from swarmd.peers.sim.shards import ShardServers
from swarmd.peers.sim.workload import RunSizes
from swarmd.peers.sim.world import SimConfig, World

TFLOPS = 0.002
"""Slow devices: a micro-batch of the tiny model takes a fraction of a second."""


def scenario(n: int, availability: list[float] | None = None, batch: int = 8, bandwidth_Bps: float = 1e9) -> Scenario:
    lat = np.full((n, n), 0.001)
    np.fill_diagonal(lat, 0.0)
    devices: list[dict[str, Any]] = []
    for i in range(n):
        device: dict[str, Any] = {"id": f"d{i}", "tflops": TFLOPS, "memory_gib": 16}
        if availability is not None:  # the elections' reliability; churn is given by hand
            device["mean_uptime_h"] = availability[i]
            device["mean_downtime_h"] = 1.0 - availability[i]
        devices.append(device)
    return parse_scenario(
        {
            "name": "small",
            "devices": devices,
            "latency_s": lat.tolist(),
            "bandwidth_Bps": [[None if i == j else bandwidth_Bps for j in range(n)] for i in range(n)],
            "model": {"layers": 4, "hidden": 128, "seq_len": 128, "vocab": 256, "params": 1_000_000, "dtype_bytes": 2},
            "batch": {"sequences": batch, "micro_batch": 1},
        }
    )


def world(n: int, availability: list[float] | None = None, **settings: Any) -> World:
    """Every device up and a member at time 0."""
    return World(scenario(n, availability), SimConfig(**settings), np.ones(n, dtype=bool))


def sizes(
    w: World,
    layers: tuple[int, ...] = (4,),
    shards: tuple[int, ...] = (1,),
    k: int = 2,
    local_steps: int = 1,
    pipelines: int = 1,
) -> RunSizes:
    plan = Plan(
        pipelines=tuple((0,) * len(layers) for _ in range(pipelines)),
        layers_per_stage=layers,
        parameter_servers=(0,) * len(layers),
        shard_servers=tuple(tuple(range(n)) for n in shards),  # the sizes read only their counts
        local_steps=local_steps,
        share_micro_batches=k,
    )
    return RunSizes.of(w.scenario, plan, w.settings.max_staleness)


def pipeline(pid: int, devices: list[int], shards: int = 1) -> Pipeline:
    """A pipeline whose cells are held by ``devices`` (stage by stage), ready to train."""
    p = Pipeline(pid)
    p.cells = [Cell(p, s, shards, device=d, named=d, ready=True) for s, d in enumerate(devices)]
    return p


def contribution(
    cid: int, cell: Cell, share_ids: tuple[int, ...], k: int = 2, base: int = 0, group: RoundGroup | None = None
) -> Contribution:
    assert cell.device is not None
    return Contribution(cid, cell.device, cell, cell.serial, cell.stage, 0, share_ids, k * len(share_ids), base, group)


class Clients:
    """What the shard servers ask of the path, recorded (``shard_records.ShardClients``): the cells
    of each stage are the ones given; nobody heads a reduction group."""

    def __init__(self, cells: list[Cell] | None = None, server: int = 0) -> None:
        self.cells = cells or []
        self.server = server
        self.calls: list[tuple[str, Any]] = []

    def cells_of_stage(self, stage: int) -> list[Cell]:
        return [c for c in self.cells if c.stage == stage]

    def delivered(self, now: float, cell: Cell) -> None:
        self.calls.append(("delivered", cell))

    def cell_ready(self, now: float, cell: Cell) -> None:
        self.calls.append(("cell_ready", cell))

    def pulled(self, now: float, cell: Cell) -> None:
        self.calls.append(("pulled", cell))

    def round_settled(self, now: float, group: RoundGroup) -> None:
        self.calls.append(("round_settled", group))

    def ledger_restarted(self, now: float) -> None:
        self.calls.append(("ledger_restarted", now))

    def pull_head(self, cell: Cell, shard: int) -> Cell | None:
        return None

    def members_of(self, head: Cell, shard: int) -> list[Cell]:
        return []

    def restart_server(self, stage: int) -> int:
        return self.server

    def named(self, what: str) -> list[Any]:
        return [x for name, x in self.calls if name == what]


def shard_servers(
    w: World, clients: Clients, holders: tuple[tuple[int, ...], ...] = ((0,),), k: int = 2, local_steps: int = 1
) -> ShardServers:
    """The shard servers of a one-pipeline run cut as ``holders`` (a device per shard)."""
    layers = tuple(4 // len(holders) for _ in holders)
    run = sizes(w, layers, tuple(len(row) for row in holders), k, local_steps)
    return ShardServers(w, run, holders, clients)
