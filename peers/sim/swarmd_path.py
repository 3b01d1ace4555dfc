"""swarmd's own data path in the simulator (``docs/data-path.md``).

The share ledger, the cells of ``swarmd.peers.sim.pipelines`` and the shard servers of
``swarmd.peers.sim.shards``, behind the hooks every simulated data path offers the run
(``simulator.DataPlane``).

The run's shape is its first plan's: the stage cut, each stage's shard count, H and k
(``workload.RunSizes``). A repair changes who holds what, never those (the data path has no
way to move layers between stages, and a shard lease from another sharding is void).

``SwarmdPath`` builds and owns the parts, each given the world and its siblings: the ledger's
client (``ledger_client``, which keeps the ledger), the shard servers, and the pipelines with
their reduction groups. The shard servers report to the cells through the path
(``shard_records.ShardClients``), which also answers for the plan in force.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from swarmd.peers.planning.plan_cost import Plan
from swarmd.peers.sim.ledger_client import LedgerClient
from swarmd.peers.sim.pipelines import Pipelines
from swarmd.peers.sim.results import PathFigures
from swarmd.peers.sim.shards import ShardServers
from swarmd.peers.sim.workload import RunSizes

if TYPE_CHECKING:
    from swarmd.peers.sim.pipeline_state import Cell
    from swarmd.peers.sim.shard_records import RoundGroup
    from swarmd.peers.sim.world import World


class SwarmdPath:
    def __init__(self, world: World, plan: Plan) -> None:
        """Start on the first plan, at time 0: the run's shape from it (module doc), and every
        peer on its cell with the seeded weights."""
        self.world = world
        self.plan = plan
        """The plan in force (the coordinator's last, followed or not)."""
        self.sizes = RunSizes.of(world.scenario, plan, world.settings.max_staleness)
        self.ledger = LedgerClient(world, self.sizes)
        self.shards = ShardServers(world, self.sizes, plan.shard_servers, self)
        self.pipelines = Pipelines(world, self.sizes, self.ledger, self.shards, plan.reduce_groups)
        self.pipelines.apply(0.0, plan.pipelines, seeded=True)

    # --- the hooks (``simulator.DataPlane``) ------------------------------------------------------

    def follow(self, now: float, plan: Plan) -> None:
        """A new plan is published: the cells and shards follow it."""
        self.plan = plan
        if len(plan.layers_per_stage) != self.sizes.workload.stages:
            return  # a plan for another number of stages is not followed
        self.pipelines.apply(now, plan.pipelines)
        self.shards.follow_plan(now, plan.shard_servers)
        self.pipelines.reducers.follow(plan.reduce_groups)

    def assignment(self) -> Plan:
        """What holds what now, as a plan for the coordinator's repair."""
        holders = tuple(tuple(shard.holder for shard in row) for row in self.shards.stages)
        distinct = all(len(set(row)) == len(row) for row in holders)
        return Plan(
            pipelines=self.pipelines.grid(),
            layers_per_stage=self.plan.layers_per_stage,
            parameter_servers=tuple(row[0] for row in holders),
            relays=self.plan.relays,
            shard_servers=holders if distinct else (),
            local_steps=self.sizes.local_steps,
            share_micro_batches=self.sizes.share_micro_batches,
            reduce_groups=self.pipelines.reducers.groups,
        )

    def departed(self, now: float, device: int) -> None:
        self.pipelines.departed(now, device)

    def noticed_departure(self, now: float, device: int) -> None:
        self.shards.noticed_departure(now, device)
        self.pipelines.reducers.noticed_departure(now, device)
        self.pipelines.noticed_departure(now, device)

    def planned(self, device: int) -> bool:
        return any(c.device == device for p in self.pipelines.pipelines for c in p.cells) or any(
            s.holder == device for s in self.shards.all()
        )

    def roles(self) -> dict[int, list[str]]:
        roles: dict[int, list[str]] = {}
        for p in self.pipelines.pipelines:
            for c in p.cells:
                if c.device is not None:
                    roles.setdefault(c.device, []).append(f"cell {p.pid}/{c.stage}")
        for shard in self.shards.all():
            roles.setdefault(shard.holder, []).append(f"shard {shard.stage}/{shard.index}")
            if shard.standby is not None:
                roles.setdefault(shard.standby, []).append(f"standby {shard.stage}/{shard.index}")
        return roles

    def figures(self) -> PathFigures:
        sizes = self.sizes
        recomputed = self.ledger.ledger.counters.reissued - self.world.counts["reissued_unspent"]
        return PathFigures(
            shards=tuple(len(row) for row in self.shards.stages),
            local_steps=sizes.local_steps,
            share_micro_batches=sizes.share_micro_batches,
            shares_recomputed=recomputed,
            micro_batches_recomputed=recomputed * sizes.share_micro_batches,
            pipelines=len(self.pipelines.pipelines),
            tokens_per_micro_batch=sizes.workload.tokens_per_micro_batch,
            reduce_groups=self.pipelines.reducers.groups,
        )

    # --- what the shard servers ask (``shard_records.ShardClients``) -----------------------------

    def cells_of_stage(self, stage: int) -> list[Cell]:
        return self.pipelines.cells_of_stage(stage)

    def delivered(self, now: float, cell: Cell) -> None:
        self.pipelines.delivered(now, cell)

    def cell_ready(self, now: float, cell: Cell) -> None:
        self.pipelines.cell_ready(now, cell)

    def pulled(self, now: float, cell: Cell) -> None:
        self.pipelines.pulled(now, cell)

    def round_settled(self, now: float, group: RoundGroup) -> None:
        self.pipelines.round_settled(now, group)

    def ledger_restarted(self, now: float) -> None:
        self.pipelines.ledger_restarted(now)

    def pull_head(self, cell: Cell, shard: int) -> Cell | None:
        return self.pipelines.reducers.pull_head(cell, shard)

    def members_of(self, head: Cell, shard: int) -> list[Cell]:
        return self.pipelines.reducers.members_of(head, shard)

    def restart_server(self, stage: int) -> int:
        """The plan's server for ``stage`` if it is a member, else the likeliest member to stay."""
        world = self.world
        server = self.plan.parameter_servers[stage]
        if world.member[server]:
            return server
        return max(world.members(), key=lambda d: (world.availability[d], -d))
