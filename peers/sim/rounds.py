"""A pipeline's rounds (``pipelines`` module doc, "Rounds").

When the next segment of shares may start, and what a round's end sends.

A round starts once every cell is held and holds its stage's weights, the ledger's holder is
up and has shares to issue, and (gradient mode) the cells' pulls brought the step the last
round went into, or ``SYNC_WAIT_S`` passed. After H shares every cell contributes to each
shard of its stage at once, through its reduction group's head where it has one; a cell whose
previous contribution has not arrived yet holds the pipeline back. The time a pipeline waits,
and for what, is counted per reason.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from swarmd.peers.sim.pipeline_state import PipelineEpoch
from swarmd.peers.sim.segments import Segments
from swarmd.peers.sim.shard_records import Contribution, RoundGroup
from swarmd.peers.taskpool.exchange import SYNC_WAIT_S

if TYPE_CHECKING:
    from swarmd.peers.sim.ledger_client import LedgerClient
    from swarmd.peers.sim.pipeline_state import Cell, Pipeline
    from swarmd.peers.sim.reduction import Reducers
    from swarmd.peers.sim.shards import ShardServers
    from swarmd.peers.sim.workload import RunSizes
    from swarmd.peers.sim.world import World


class Rounds:
    def __init__(
        self, world: World, sizes: RunSizes, ledger: LedgerClient, shards: ShardServers, reducers: Reducers
    ) -> None:
        self.world, self.sizes = world, sizes
        self.ledger = ledger
        self.shards = shards
        self.reducers = reducers
        self.segments = Segments(world, sizes, ledger, self.try_start)

    def try_start(self, now: float, p: Pipeline) -> None:
        """Start the rest of the pipeline's round (or end the round) if nothing holds it back."""
        world, local_steps = self.world, self.sizes.local_steps
        if p.segment:
            return
        if not all(c.ready and c.device is not None for c in p.cells):
            return self._wait(now, p, "cells")
        if p.shares_done >= local_steps:
            return self._end_round(now, p)
        if p.sync_bases is not None:
            behind = any(
                arrived <= base
                for c, bases in zip(p.cells, p.sync_bases, strict=True)
                for arrived, base in zip(c.arrived, bases, strict=True)
            )
            if behind and now < p.sync_until:
                return self._wait(now, p, "sync")
            p.sync_bases = None
        server = self.shards.ledger_shard.holder
        d0 = p.cells[0].device
        assert d0 is not None
        if not world.up[server]:
            return self._wait(now, p, "ledger")
        holder = world.ids[d0]
        shares = self.ledger.issue(now, holder, local_steps - p.shares_done)
        if not shares:
            return self._wait(now, p, "ledger")
        self._waited(now, p)
        self.segments.run(now, p, holder, shares, now + world.engine.rtt(d0, server))

    def interrupt(self, now: float, p: Pipeline) -> None:
        """The pipeline changes: its segment in flight breaks (``Segments.interrupt``), its
        events lapse, and its next round starts afresh."""
        self.segments.interrupt(now, p)
        p.epoch += 1
        p.sync_bases = None
        p.timing = None

    def _wait(self, now: float, p: Pipeline, why: str) -> None:
        if p.waiting != why:
            self._waited(now, p)
            p.waiting, p.wait_since = why, now

    def _waited(self, now: float, p: Pipeline) -> None:
        if p.waiting:
            self.world.phases.add("wait_" + p.waiting, now - p.wait_since)
            p.waiting = ""

    def _end_round(self, now: float, p: Pipeline) -> None:
        """Every cell contributes to each shard of its stage, once its previous contribution
        has arrived (at most one outstanding), and the next round starts."""
        if any(c.in_flight for c in p.cells):
            return self._wait(now, p, "backpressure")
        self._waited(now, p)
        world = self.world
        for cell in p.cells:
            self._contribute(now, cell)
            cell.round_shares = []
        world.phases.add("round", now - p.round_started)
        p.round_started, p.shares_done = now, 0
        if self.sizes.exchange.mode == "gradient":  # synchronous rounds, as the daemons' cells run them
            p.sync_bases = [list(c.base) for c in p.cells]
            p.sync_until = now + SYNC_WAIT_S
            world.engine.at(p.sync_until, self._sync_lapsed, p.stamp())
        self.try_start(now, p)

    def _contribute(self, now: float, cell: Cell) -> None:
        """The cell's round to each shard of its stage: to its group's head, or to the server.
        A stage-0 cell's are one group, whose shares complete at the ledger together."""
        world, shards = self.world, self.shards
        assert cell.device is not None
        ids = tuple(cell.round_shares)
        group = None
        if cell.stage == 0:
            group = RoundGroup(world.ids[cell.device], ids, len(shards.stages[0]))
        for shard in shards.stages[cell.stage]:
            c = Contribution(
                shards.next_cid(),
                cell.device,
                cell,
                cell.serial,
                cell.stage,
                shard.index,
                ids,
                len(ids) * self.sizes.share_micro_batches,
                cell.base[shard.index],
                group,
            )
            if not self.reducers.send(now, c):
                shards.contribute(now, c)

    def _sync_lapsed(self, now: float, at: PipelineEpoch) -> None:
        p = at.pipeline
        if at.current() and p.waiting == "sync":
            self.world.counts["sync_timeouts"] += 1
            self.try_start(now, p)

    # --- what the shards report ---------------------------------------------------------------

    def delivered(self, now: float, cell: Cell) -> None:
        """A contribution of the cell arrived: a round held back by it may end."""
        p = cell.pipeline
        if p.waiting == "backpressure" and not any(c.in_flight for c in p.cells):
            self.try_start(now, p)

    def pulled(self, now: float, cell: Cell) -> None:
        """A pull brought the cell a newer version: the round its pipeline waits on may start."""
        if cell.pipeline.waiting == "sync":
            self.try_start(now, cell.pipeline)
