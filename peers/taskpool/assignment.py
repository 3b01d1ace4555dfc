"""The assignment in force: who should hold each cell and each shard.

The assignment in force: who should hold each cell and each shard, from the plan or, before
there is one, by the provisional rule every member computes alike.

The coordinator's signed plan (``swarmd.peers.records.plan_record``) names a peer per cell, the servers
of each stage's shards, H and k. Until a plan exists, or when the planner cannot place the run
(fewer members than stages), ``provisional`` spreads the cells over the members sorted by peer
ID: ``n // S`` pipelines of distinct members, or one pipeline over all of them when they are
fewer than the stages (a daemon alone holds every cell); each stage has one shard, at its
pipeline-0 cell. The task pool's rules (``cells``, ``servers``) read only this type.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from swarmd.peers.records.plan_record import PlanRecord
from swarmd.peers.taskpool.cells import Cell
from swarmd.peers.taskpool.servers import Shard

PROVISIONAL = -1
"""The version of a provisional assignment (plans count from 0)."""


@dataclass(frozen=True)
class Assignment:
    version: int
    cells: tuple[tuple[str, ...], ...]
    """cells[p][s]: the peer named for stage s of pipeline p."""
    servers: tuple[tuple[str, ...], ...]
    """servers[s][k]: the peer named for shard k of stage s."""
    local_steps: int
    share_micro_batches: int
    relays: tuple[str, ...] = ()
    reduce_groups: tuple[int, ...] = ()
    """G per stage (``reduction``); empty: no stage reduces."""
    checkpointing: tuple[bool, ...] = ()
    """Per stage, activation checkpointing as the plan chose it; empty: none."""

    @property
    def stages(self) -> int:
        return len(self.servers)

    @property
    def pipelines(self) -> int:
        return len(self.cells)

    @property
    def provisional(self) -> bool:
        return self.version == PROVISIONAL

    def named_cells(self) -> dict[Cell, str]:
        return {(p, s): peer for p, row in enumerate(self.cells) for s, peer in enumerate(row)}

    def named_shards(self) -> dict[Shard, str]:
        return {(s, k): peer for s, row in enumerate(self.servers) for k, peer in enumerate(row)}

    def shard_counts(self) -> dict[int, int]:
        return {s: len(row) for s, row in enumerate(self.servers)}

    def checkpointed(self, stage: int) -> bool:
        """Whether the plan has stage ``stage``'s cells checkpoint activations (the cell maker's flag)."""
        return stage < len(self.checkpointing) and self.checkpointing[stage]

    def group_size(self, stage: int) -> int:
        return self.reduce_groups[stage] if stage < len(self.reduce_groups) else 1

    def cells_of(self, peer: str) -> list[Cell]:
        return [cell for cell, named in self.named_cells().items() if named == peer]

    def shards_of(self, peer: str) -> list[Shard]:
        return [key for key, named in self.named_shards().items() if named == peer]


def default_share(batch_micro_batches: int, pipelines: int) -> int:
    """k when the plan leaves it open: the run's batch split over the pipelines, so that one
    share of each makes an update."""
    return max(1, math.ceil(batch_micro_batches / max(1, pipelines)))


def from_plan(record: PlanRecord, stages: int, batch_micro_batches: int) -> Assignment | None:
    """The plan's assignment, or None when it cuts the model into another number of stages
    than the run's (a plan for another run shape is not followed)."""
    if len(record.layers_per_stage) != stages:
        return None
    names = record.devices
    servers = record.shard_servers or [[s] for s in record.parameter_servers]
    pipelines = len(record.pipelines)
    share = record.share_micro_batches or default_share(batch_micro_batches, pipelines)
    return Assignment(
        version=record.version,
        cells=tuple(tuple(names[d] for d in row) for row in record.pipelines),
        servers=tuple(tuple(names[d] for d in row) for row in servers),
        local_steps=record.local_steps,
        share_micro_batches=share,
        relays=tuple(names[d] for d in record.relays),
        reduce_groups=tuple(record.reduce_groups),
        checkpointing=tuple(record.checkpointing),
    )


def provisional(members: list[str], stages: int, batch_micro_batches: int, local_steps: int = 1) -> Assignment:
    """The assignment before any plan (module doc). ``members``: the training members, this
    peer included; their order does not matter."""
    if not members:
        raise ValueError("a provisional assignment needs at least one member")
    ordered = sorted(set(members))
    n = len(ordered)
    if n < stages:
        cells: tuple[tuple[str, ...], ...] = (tuple(ordered[s % n] for s in range(stages)),)
    else:
        cells = tuple(tuple(ordered[p * stages + s] for s in range(stages)) for p in range(n // stages))
    return Assignment(
        version=PROVISIONAL,
        cells=cells,
        servers=tuple((cells[0][s],) for s in range(stages)),
        local_steps=local_steps,
        share_micro_batches=default_share(batch_micro_batches, len(cells)),
    )
