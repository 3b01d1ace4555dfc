"""Reduction groups in the simulated data path, as the daemons' reducers run them.

The daemon's side: ``swarmd.peers.taskpool.reduction`` and ``swarmd.training.shards.reducer``.

Where the plan groups a stage's pipelines, a cell's contribution to shard ``k`` goes to the
cell that heads ``k`` in its group (a flow on the member's link; nothing crosses for the head's
own), which keeps it in a bucket per shard. A bucket goes to the server once every group member
whose cell is held has sent one, or ``reduce_wait_s`` of the head's round after the first
arrived: one part as it came, several (those ``reduction.summable`` takes; the others alone) as
one contribution at the oldest of their bases, covering their summed micro-batches, whose
shares and settling are all its parts' (``shard_records.Contribution.parts``).

The deltas come back the same way: a member pulls a shard from its head for it once the head's
own pull brought a newer version (within ``HEAD_KEEP_VERSIONS`` of the member's), else from the
server (``pulls.Pulls.pull``).

A head that leaves: once its departure is noticed, every part at it or on its way to or from
it is sent by its own cell straight to the server (the daemon's members see their request to
the head fail, and go direct); a part whose cell left too is lost with it, as a cell's own is.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple, Protocol

from swarmd.peers.sim.shard_records import Contribution
from swarmd.peers.taskpool.reduction import group_of, head_of, reduce_wait_s, summable

if TYPE_CHECKING:
    from swarmd.peers.sim.pipeline_state import Cell, Pipeline
    from swarmd.peers.sim.shards import ShardServers
    from swarmd.peers.sim.workload import RunSizes
    from swarmd.peers.sim.world import World


class PipelineList(Protocol):
    """Whose list of pipelines the groups cut (``pipelines.Pipelines``)."""

    @property
    def pipelines(self) -> list[Pipeline]: ...


@dataclass(eq=False)
class Bucket:
    head: int
    """The head's device."""
    stage: int
    shard: int
    head_pipeline: int
    parts: list[Contribution] = field(default_factory=list)


class HeadDelivery(NamedTuple):
    """A member's part on its way to the ``head`` device of pipeline ``head_pid``."""

    head: int
    head_pid: int
    contribution: Contribution


class BucketDue(NamedTuple):
    """A bucket's wait (``reduce_wait_s``) is over: it goes to the server if still open."""

    key: tuple[int, int, int]
    bucket: Bucket


class Reducers:
    def __init__(
        self, world: World, sizes: RunSizes, pipelines: PipelineList, shards: ShardServers, groups: tuple[int, ...]
    ) -> None:
        """``pipelines``: whose list the groups cut (read at each call: a plan replaces it)."""
        self.world, self.sizes = world, sizes
        self.pipelines = pipelines
        self.shards = shards
        self.groups: tuple[int, ...] = tuple(groups)
        self.buckets: dict[tuple[int, int, int], Bucket] = {}
        self.to_head: dict[int, tuple[int, Contribution]] = {}
        """Parts on their way to a head or in its bucket, by contribution ID: (head, part)."""
        self._positions: dict[int, int] = {}
        """id(pipeline) -> its index in the pipelines' list, rebuilt when the list changed."""

    def follow(self, groups: tuple[int, ...]) -> None:
        self.groups = tuple(groups)

    def group_size(self, stage: int) -> int:
        return self.groups[stage] if stage < len(self.groups) else 1

    def head_cell(self, cell: Cell, shard: int) -> Cell | None:
        """The held cell that reduces ``cell``'s slices of ``shard`` (None: none, go direct)."""
        pipes = self.pipelines.pipelines
        index = self._index(cell)
        head = None if index is None else head_of(index, len(pipes), self.group_size(cell.stage), shard)
        if head is None:
            return None
        found = pipes[head].cells[cell.stage]
        return found if found.device is not None and self.world.up[found.device] else None

    def pull_head(self, cell: Cell, shard: int) -> Cell | None:
        """The held, ready cell ``cell`` pulls ``shard`` from (None: from the server)."""
        head = self.head_cell(cell, shard)
        return head if head is not None and head is not cell and head.ready else None

    def members_of(self, head: Cell, shard: int) -> list[Cell]:
        """The cells that pull ``shard`` from ``head`` (none when it heads no group for it)."""
        pipes = self.pipelines.pipelines
        index = self._index(head)
        size = self.group_size(head.stage)
        if index is None or size < 2 or head_of(index, len(pipes), size, shard) != index:
            return []
        return [pipes[p].cells[head.stage] for p in group_of(index, len(pipes), size) if p != index]

    def _index(self, cell: Cell) -> int | None:
        if self.group_size(cell.stage) < 2:
            return None
        pipes = self.pipelines.pipelines
        at = self._positions.get(id(cell.pipeline))
        if at is None or at >= len(pipes) or pipes[at] is not cell.pipeline:
            self._positions = {id(p): i for i, p in enumerate(pipes)}
            at = self._positions.get(id(cell.pipeline))
        return at

    # --- members' slices ----------------------------------------------------------------------

    def send(self, now: float, c: Contribution) -> bool:
        """Send ``c`` to its head; False when it goes to the server itself."""
        head = self.head_cell(c.cell, c.shard)
        if head is None:
            return False
        world = self.world
        assert head.device is not None
        c.cell.in_flight.add(c.cid)
        c.sent_at = now
        self.to_head[c.cid] = (head.device, c)
        delivery = HeadDelivery(head.device, head.pipeline.pid, c)
        if head.device == c.device:
            self._arrived(now, delivery)
        else:
            rate = world.engine.path_rate(c.device, head.device, None)
            nbytes = self.sizes.workload.contribution_bytes(c.stage, c.shard, rate)
            via = world.engine.route(c.device, head.device, nbytes, for_speed=False)
            world.engine.send(now, c.device, head.device, nbytes, self._arrived, delivery, via)
        return True

    def _arrived(self, now: float, d: HeadDelivery) -> None:
        head, c = d.head, d.contribution
        if self.to_head.get(c.cid, (None, None))[1] is not d.contribution:
            return  # sent to the server meanwhile (its head left)
        pipes = self.pipelines.pipelines
        index = next((i for i, p in enumerate(pipes) if p.pid == d.head_pid), None)
        if index is None:
            return self._direct(now, c)  # the head's pipeline is gone from the plan
        key = (head, c.stage, c.shard)
        bucket = self.buckets.get(key)
        if bucket is None:
            bucket = self.buckets[key] = Bucket(head, c.stage, c.shard, index)
            cell = pipes[index].cells[c.stage]
            wait = reduce_wait_s(self._round_s(cell))
            self.world.engine.at(now + wait, self._flush, BucketDue(key, bucket))
        bucket.parts.append(c)
        if len(bucket.parts) >= self._expected(bucket):
            self._flush(now, BucketDue(key, bucket))

    def _round_s(self, cell: Cell) -> float:
        p = cell.pipeline
        return p.per_share_s * self.sizes.local_steps

    def _expected(self, bucket: Bucket) -> int:
        pipes = self.pipelines.pipelines
        members = group_of(bucket.head_pipeline, len(pipes), self.group_size(bucket.stage))
        return max(1, sum(pipes[p].cells[bucket.stage].device is not None for p in members))

    def _flush(self, now: float, due: BucketDue) -> None:
        key, bucket = due
        if self.buckets.get(key) is not bucket:
            return
        del self.buckets[key]
        world, shards = self.world, self.shards
        for part in bucket.parts:
            self.to_head.pop(part.cid, None)
        chosen, base = summable([p.base for p in bucket.parts])
        alone = [p for i, p in enumerate(bucket.parts) if i not in chosen or len(chosen) == 1]
        for part in alone:
            shards.contribute(now, part, sender=bucket.head)
        if len(chosen) < 2:
            return
        parts = [bucket.parts[i] for i in chosen]
        world.counts["reduced_sums"] += 1
        world.counts["reduced_parts"] += len(parts)
        combined = Contribution(
            shards.next_cid(),
            bucket.head,
            parts[0].cell,
            -1,
            bucket.stage,
            bucket.shard,
            tuple(i for p in parts for i in p.share_ids),
            sum(p.micro_batches for p in parts),
            base,
            None,
            parts=parts,
        )
        shards.contribute(now, combined)

    # --- faults -------------------------------------------------------------------------------

    def noticed_departure(self, now: float, device: int) -> None:
        """A head left: its members send what it held or was sent straight to the servers."""
        for key, bucket in list(self.buckets.items()):
            if bucket.head == device:
                del self.buckets[key]
        for cid, (head, part) in list(self.to_head.items()):
            if head == device:
                del self.to_head[cid]
                self._direct(now, part)
        for shard in self.shards.all():
            for cid, c in list(shard.in_flight.items()):
                if c.parts and c.device == device:
                    del shard.in_flight[cid]
                    for part in c.parts:
                        self._direct(now, part)

    def _direct(self, now: float, part: Contribution) -> None:
        part.cell.in_flight.discard(part.cid)
        if self.world.up[part.device]:
            self.shards.contribute(now, part)
        elif part.group is None:
            self.world.counts["contributions_lost"] += 1
