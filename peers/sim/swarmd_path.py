"""swarmd's own data path in the simulator (``docs/data-path.md``): the share ledger, the cells
of ``swarmd.peers.sim.pipelines`` and the shard servers of ``swarmd.peers.sim.shards``, behind
the hooks every simulated data path offers the run (``simulator.DataPlane``).

The run's shape is its first plan's: the stage cut, each stage's shard count, H and k. A
repair changes who holds what, never those (the data path has no way to move layers between
stages, and a shard lease from another sharding is void).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from swarmd.peers.planning.plan_cost import Plan
from swarmd.peers.sim.pipelines import Pipelines
from swarmd.peers.sim.reduction import Reducers
from swarmd.peers.sim.results import PathFigures
from swarmd.peers.sim.shards import ShardServers
from swarmd.peers.sim.workload import Workload
from swarmd.peers.taskpool.exchange import ExchangeConfig
from swarmd.peers.taskpool.shares import ShareLedger

if TYPE_CHECKING:
    from swarmd.peers.sim.simulator import Simulation


class SwarmdPath:
    def __init__(self, sim: Simulation) -> None:
        self.sim = sim

    def begin(self, plan: Plan) -> None:
        """The run's shape from its first plan (module doc), and every peer on its cell. The
        cells and shards read the run's settings from the simulation."""
        sim, sc = self.sim, self.sim.scenario
        sim.local_steps = plan.local_steps
        sim.share_micro_batches = plan.micro_batches_per_share(sc)
        sim.exchange = ExchangeConfig(
            batch_micro_batches=max(1, sc.batch_sequences // sc.micro_batch),
            share_micro_batches=sim.share_micro_batches,
            local_steps=sim.local_steps,
            max_staleness=sim.settings.max_staleness,
            pipelines=max(1, len(plan.pipelines)),
        )
        sim.workload = Workload.of(sc, plan.layers_per_stage, tuple(len(row) for row in plan.shard_servers))
        sim.ledger = ShareLedger(sim.share_micro_batches, sim.settings.lease_s)
        sim.pipelines = Pipelines(sim)
        sim.shards = ShardServers(sim, plan.shard_servers)
        sim.reducers = Reducers(sim)
        sim.reducers.follow(plan.reduce_groups)
        sim.pipelines.apply(0.0, plan.pipelines, seeded=True)

    def follow(self, now: float, plan: Plan) -> None:
        """A new plan is published: the cells and shards follow it."""
        sim = self.sim
        if len(plan.layers_per_stage) != sim.workload.stages:
            return  # a plan for another number of stages is not followed
        sim.pipelines.apply(now, plan.pipelines)
        sim.shards.follow_plan(now, plan.shard_servers)
        sim.reducers.follow(plan.reduce_groups)

    def assignment(self) -> Plan:
        """What holds what now, as a plan for the coordinator's repair."""
        sim = self.sim
        plan = sim.control.plan
        assert plan is not None
        holders = tuple(tuple(shard.holder for shard in row) for row in sim.shards.stages)
        distinct = all(len(set(row)) == len(row) for row in holders)
        return Plan(
            pipelines=sim.pipelines.grid(),
            layers_per_stage=plan.layers_per_stage,
            parameter_servers=tuple(row[0] for row in holders),
            relays=tuple(sim.control.relays),
            shard_servers=holders if distinct else (),
            local_steps=sim.local_steps,
            share_micro_batches=sim.share_micro_batches,
            reduce_groups=sim.reducers.groups,
        )

    def departed(self, now: float, device: int) -> None:
        self.sim.pipelines.departed(now, device)

    def noticed_departure(self, now: float, device: int) -> None:
        self.sim.shards.noticed_departure(now, device)
        self.sim.reducers.noticed_departure(now, device)
        self.sim.pipelines.noticed_departure(now, device)

    def planned(self, device: int) -> bool:
        sim = self.sim
        return any(c.device == device for p in sim.pipelines.pipelines for c in p.cells) or any(
            s.holder == device for s in sim.shards.all()
        )

    def roles(self) -> dict[int, list[str]]:
        sim = self.sim
        roles: dict[int, list[str]] = {}
        for p in sim.pipelines.pipelines:
            for c in p.cells:
                if c.device is not None:
                    roles.setdefault(c.device, []).append(f"cell {p.pid}/{c.stage}")
        for shard in sim.shards.all():
            roles.setdefault(shard.holder, []).append(f"shard {shard.stage}/{shard.index}")
            if shard.standby is not None:
                roles.setdefault(shard.standby, []).append(f"standby {shard.stage}/{shard.index}")
        return roles

    def figures(self) -> PathFigures:
        sim = self.sim
        recomputed = sim.ledger.counters.reissued - sim.counts["reissued_unspent"]
        return PathFigures(
            shards=tuple(len(row) for row in sim.shards.stages),
            local_steps=sim.local_steps,
            share_micro_batches=sim.share_micro_batches,
            shares_recomputed=recomputed,
            micro_batches_recomputed=recomputed * sim.share_micro_batches,
            pipelines=len(sim.pipelines.pipelines),
            tokens_per_micro_batch=sim.workload.tokens_per_micro_batch,
            reduce_groups=sim.reducers.groups,
        )
