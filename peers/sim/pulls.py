"""What the shard servers send the cells: pulls and whole slices (``shards`` module doc, "Pulls").

Every cell keeps one pull per shard of its stage in flight (the long poll), answered once the
cell lacks a committed version: by its reduction group's head for the shard when that head
holds a version within the deltas it keeps, else by the shard's holder. A new cell first
fetches every slice of its stage whole; after a failover the cells of the stage pull again
from the new holder, whole if they hold updates the shard lost.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from swarmd.peers.taskpool.reduction import HEAD_KEEP_VERSIONS

if TYPE_CHECKING:
    from swarmd.peers.sim.pipeline_state import Cell
    from swarmd.peers.sim.shard_records import Shard, ShardClients
    from swarmd.peers.sim.workload import Workload
    from swarmd.peers.sim.world import World


class PullAnswer(NamedTuple):
    """Version ``version`` of ``shard`` (as of ``epoch``) on its way to ``cell``'s holder of
    ``serial``, pulled at ``asked``."""

    shard: Shard
    epoch: int
    cell: Cell
    serial: int
    version: int
    asked: float


class SliceCopy(NamedTuple):
    """A whole slice of ``shard`` at ``version`` (as of ``epoch``) on its way to a new cell."""

    shard: Shard
    epoch: int
    cell: Cell
    serial: int
    version: int


class Pulls:
    def __init__(self, world: World, workload: Workload, stages: list[list[Shard]], clients: ShardClients) -> None:
        self.world, self.workload = world, workload
        self.stages = stages
        self.clients = clients

    def pull(self, now: float, shard: Shard, cell: Cell) -> None:
        """The cell's long poll of this shard answers when it lacks a committed version: from
        its group's head for the shard where it has one that holds a newer version within the
        deltas it keeps (``reduction.HEAD_KEEP_VERSIONS``), else from the server."""
        world = self.world
        k = shard.index
        if cell.pulling[k] or not cell.ready:
            return
        device = cell.device
        assert device is not None, "a ready cell has a holder"
        source, version = shard.holder, shard.committed
        head = self.clients.pull_head(cell, k)
        if head is not None:
            if head.arrived[k] <= cell.arrived[k]:
                return  # the head's own pull brings it first, then this one goes
            if head.arrived[k] - cell.arrived[k] <= HEAD_KEEP_VERSIONS:
                assert head.device is not None
                source, version = head.device, head.arrived[k]
        if not world.up[source]:
            return
        behind = version - cell.arrived[k]
        if behind <= 0:
            return
        nbytes = self.workload.pull_bytes(shard.stage, k, behind, world.settings.keep_versions)
        cell.pulling[k] = True
        via = world.engine.route(source, device, nbytes, for_speed=False)
        answer = PullAnswer(shard, shard.epoch, cell, cell.serial, version, now)
        world.engine.send(now, source, device, nbytes, self._pulled, answer, via)

    def committed(self, now: float, shard: Shard) -> None:
        """``shard`` committed a new version: every cell of its stage may pull it."""
        for cell in self.clients.cells_of_stage(shard.stage):
            self.pull(now, shard, cell)

    def _pulled(self, now: float, a: PullAnswer) -> None:
        shard, cell = a.shard, a.cell
        if a.serial != cell.serial or a.epoch != shard.epoch:
            return
        cell.pulling[shard.index] = False
        cell.arrived[shard.index] = max(cell.arrived[shard.index], a.version)
        self.world.phases.add("pull", now - a.asked)
        self.pull(now, shard, cell)
        for member in self.clients.members_of(cell, shard.index):  # a head passes it on
            self.pull(now, shard, member)
        self.clients.pulled(now, cell)

    def load(self, now: float, cell: Cell) -> None:
        """A new cell fetches its stage's weights, every slice whole, before it starts."""
        cell.missing = set(range(len(self.stages[cell.stage])))
        cell.loading_since = now
        for shard in self.stages[cell.stage]:
            self._send_slice(now, shard, cell)

    def _send_slice(self, now: float, shard: Shard, cell: Cell) -> None:
        world = self.world
        if not world.up[shard.holder] or cell.device is None:
            return  # its holder left: the failover sends it
        nbytes = self.workload.slice_bytes(shard.stage, shard.index)
        via = world.engine.route(shard.holder, cell.device, nbytes, for_speed=False)
        copy = SliceCopy(shard, shard.epoch, cell, cell.serial, shard.committed)
        world.engine.send(now, shard.holder, cell.device, nbytes, self._slice_in, copy, via)

    def _slice_in(self, now: float, s: SliceCopy) -> None:
        shard, cell = s.shard, s.cell
        if s.serial != cell.serial or s.epoch != shard.epoch:
            return
        k = shard.index
        cell.missing.discard(k)
        cell.arrived[k] = s.version
        if not cell.missing:
            cell.ready = True
            self.world.phases.add("weights", now - cell.loading_since)
            self.clients.cell_ready(now, cell)
            for other in self.stages[cell.stage]:
                self.pull(now, other, cell)

    def rejoin(self, now: float, shard: Shard, restored: int) -> None:
        """``shard`` changed hands at version ``restored``: the cells of its stage pull from the
        new holder, the whole slice if they hold updates it lost or were still fetching it."""
        keep_versions = self.world.settings.keep_versions
        for cell in self.clients.cells_of_stage(shard.stage):
            k = shard.index
            cell.pulling[k] = False
            if cell.arrived[k] > restored:  # it holds updates the shard lost: it takes the slice whole
                cell.arrived[k] = restored - keep_versions - 1
            if k in cell.missing:
                self._send_slice(now, shard, cell)
            else:
                self.pull(now, shard, cell)
