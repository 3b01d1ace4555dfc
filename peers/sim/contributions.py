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

from typing import TYPE_CHECKING, NamedTuple, Protocol

from swarmd.peers.taskpool.exchange import staleness_weight, step_micro_batches

if TYPE_CHECKING:
    from swarmd.peers.sim.pipeline_state import Cell
    from swarmd.peers.sim.shard_records import Contribution, Shard, ShardClients
    from swarmd.peers.sim.workload import RunSizes
    from swarmd.peers.sim.world import World


class Delivery(NamedTuple):
    """A contribution on its way to the holder of ``shard`` as of ``epoch``."""

    shard: Shard
    epoch: int
    contribution: Contribution


class Steps(Protocol):
    """What the intake asks of a shard's steps (``commits.Commits``)."""

    def step(self, now: float, shard: Shard) -> None:
        """The buffer is applied as the shard's new version."""


def settle(now: float, c: Contribution, cells: ShardClients) -> None:
    """``c`` (each of its parts, for a head's sum) is through at its shard: once every shard
    of stage 0 has its round's, the round's shares complete at the ledger."""
    for part in c.parts:
        settle(now, part, cells)
    group = c.group
    if group is None:
        return
    group.left -= 1
    if group.left == 0:
        cells.round_settled(now, group)


class Intake:
    def __init__(
        self, world: World, sizes: RunSizes, stages: list[list[Shard]], commits: Steps, clients: ShardClients
    ) -> None:
        self.world, self.workload = world, sizes.workload
        self.exchange = sizes.exchange
        self.stages = stages
        self.commits = commits
        self.clients = clients
        self.step_mb = step_micro_batches(sizes.exchange)
        self._cid = 0

    def next_cid(self) -> int:
        self._cid += 1
        return self._cid

    def contribute(self, now: float, c: Contribution, sender: int | None = None) -> None:
        """Cell ``c.device`` (or ``sender``: the head of its reduction group, forwarding it)
        sends ``c`` to its shard's holder (again, after a failover)."""
        engine = self.world.engine
        shard = self.stages[c.stage][c.shard]
        shard.in_flight[c.cid] = c
        if c.cell.serial == c.serial:
            c.cell.in_flight.add(c.cid)
        c.sent_at = now
        src = c.device if sender is None else sender
        nbytes = self.workload.contribution_bytes(c.stage, c.shard, engine.path_rate(src, shard.holder, None))
        via = engine.route(src, shard.holder, nbytes, for_speed=False)
        engine.send(now, src, shard.holder, nbytes, self._arrived, Delivery(shard, shard.epoch, c), via)

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
        self.world.phases.add("contribution", now - c.sent_at)
        if c.parts:
            return self._sum_arrived(now, shard, c)
        if c.cell.serial == c.serial:
            c.cell.in_flight.discard(c.cid)
            self.clients.delivered(now, c.cell)
        self._take(now, shard, c)

    def _sum_arrived(self, now: float, shard: Shard, c: Contribution) -> None:
        """A head's sum: delivered for every part; taken whole, or, when some part's shares are
        in already (a member's own resend), taken part by part, as the daemon's head resends."""
        for part in c.parts:
            if part.cell.serial == part.serial:
                part.cell.in_flight.discard(part.cid)
                self.clients.delivered(now, part.cell)
        if any(i in shard.done for i in c.share_ids):
            for part in c.parts:
                self._take(now, shard, part)
            return
        self._take(now, shard, c)

    def _take(self, now: float, shard: Shard, c: Contribution) -> None:
        world = self.world
        if all(i in shard.done for i in c.share_ids):
            world.counts["duplicates"] += 1
            settle(now, c, self.clients)
            return
        staleness = max(0, shard.version - c.base)
        weight = staleness_weight(staleness, self.exchange)
        if weight == 0.0:
            world.counts["stale_dropped"] += 1
            shard.remember(c.share_ids)
            settle(now, c, self.clients)
            return
        world.staleness[staleness] += 1
        shard.buffer.append(c)
        shard.buffered += weight * c.micro_batches
        if shard.buffered >= self.step_mb:
            self.commits.step(now, shard)
