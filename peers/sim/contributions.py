"""A shard server's intake of contributions (``shards`` module doc, "Contributions").

A contribution travels as a flow to its shard's holder. There it is acknowledged and not
applied again when every share it covers is through here already (a recompute), dropped as
stale when ``exchange.staleness_weight`` gives it nothing, or buffered at its weight; once the
buffer reaches ``exchange.step_micro_batches`` the shard steps (``commits``). A reduction
head's sum arrives for all its parts at once.

``settle``: a contribution is through at its shard (committed, acknowledged or dropped): the
last of a stage-0 round's settles completes the round's shares at the ledger.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from swarmd.peers.taskpool.exchange import staleness_weight, step_micro_batches

if TYPE_CHECKING:
    from swarmd.peers.sim.commits import Commits
    from swarmd.peers.sim.pipeline_state import Cell
    from swarmd.peers.sim.pipelines import Pipelines
    from swarmd.peers.sim.shards import Contribution, Shard
    from swarmd.peers.sim.simulator import Simulation


class Delivery(NamedTuple):
    """A contribution on its way to the holder of ``shard`` as of ``epoch``."""

    shard: Shard
    epoch: int
    contribution: Contribution


def settle(now: float, c: Contribution, pipelines: Pipelines) -> None:
    """``c`` (each of its parts, for a head's sum) is through at its shard: once every shard
    of stage 0 has its round's, the round's shares complete at the ledger."""
    for part in c.parts:
        settle(now, part, pipelines)
    group = c.group
    if group is None:
        return
    group.left -= 1
    if group.left == 0:
        pipelines.round_settled(now, group)


class Intake:
    def __init__(self, sim: Simulation, stages: list[list[Shard]], commits: Commits) -> None:
        self.sim = sim
        self.stages = stages
        self.commits = commits
        self.step_mb = step_micro_batches(sim.exchange)
        self._cid = 0

    def next_cid(self) -> int:
        self._cid += 1
        return self._cid

    def contribute(self, now: float, c: Contribution, sender: int | None = None) -> None:
        """Cell ``c.device`` (or ``sender``: the head of its reduction group, forwarding it)
        sends ``c`` to its shard's holder (again, after a failover)."""
        sim = self.sim
        shard = self.stages[c.stage][c.shard]
        shard.in_flight[c.cid] = c
        if c.cell.serial == c.serial:
            c.cell.in_flight.add(c.cid)
        c.sent_at = now
        src = c.device if sender is None else sender
        nbytes = sim.workload.contribution_bytes(c.stage, c.shard, sim.engine.path_rate(src, shard.holder, None))
        via = sim.engine.route(src, shard.holder, nbytes, for_speed=False)
        sim.engine.send(now, src, shard.holder, nbytes, self._arrived, Delivery(shard, shard.epoch, c), via)

    def cut(self, cell: Cell) -> int:
        """``cell``'s device left: its contributions in flight to the shards of its stage stop
        with its flows and are not waited on (how many)."""
        cut = 0
        for shard in self.stages[cell.stage]:
            for cid in [cid for cid in cell.in_flight if cid in shard.in_flight]:
                del shard.in_flight[cid]
                cut += 1
        return cut

    def _arrived(self, now: float, d: Delivery) -> None:
        shard, c = d.shard, d.contribution
        if d.epoch != shard.epoch:
            return  # the shard changed hands meanwhile: it was sent again to the new holder
        if shard.in_flight.pop(c.cid, None) is None:
            return  # given up when its cell's holder left (an engine retry after a blip)
        sim = self.sim
        sim.phases.add("contribution", now - c.sent_at)
        if c.parts:
            return self._sum_arrived(now, shard, c)
        if c.cell.serial == c.serial:
            c.cell.in_flight.discard(c.cid)
            sim.pipelines.delivered(now, c.cell)
        self._take(now, shard, c)

    def _sum_arrived(self, now: float, shard: Shard, c: Contribution) -> None:
        """A head's sum: delivered for every part; taken whole, or, when some part's shares are
        in already (a member's own resend), taken part by part, as the daemon's head resends."""
        for part in c.parts:
            if part.cell.serial == part.serial:
                part.cell.in_flight.discard(part.cid)
                self.sim.pipelines.delivered(now, part.cell)
        if any(i in shard.done for i in c.share_ids):
            for part in c.parts:
                self._take(now, shard, part)
            return
        self._take(now, shard, c)

    def _take(self, now: float, shard: Shard, c: Contribution) -> None:
        sim = self.sim
        if all(i in shard.done for i in c.share_ids):
            sim.counts["duplicates"] += 1
            settle(now, c, sim.pipelines)
            return
        staleness = max(0, shard.version - c.base)
        weight = staleness_weight(staleness, sim.exchange)
        if weight == 0.0:
            sim.counts["stale_dropped"] += 1
            shard.remember(c.share_ids)
            settle(now, c, sim.pipelines)
            return
        sim.staleness[staleness] += 1
        shard.buffer.append(c)
        shard.buffered += weight * c.micro_batches
        if shard.buffered >= self.step_mb:
            self.commits.step(now, shard)
