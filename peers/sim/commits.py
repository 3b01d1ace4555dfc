"""A shard server's steps and their commits at its standby (``shards`` module doc, "Steps").

A step's delta is logged at the standby, a flow on the holder's uplink; the standby replays
the logged steps in order on its checkpoint, and a step is committed once it can be replayed.
With no standby a step is committed at once. A commit settles its contributions, tells the
cells of the stage there is a new version to pull, and at shard ``(0, 0)`` counts what is
trained: the micro-batches of shares not committed before.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING, NamedTuple

from swarmd.peers.sim.contributions import settle

if TYPE_CHECKING:
    from swarmd.peers.sim.pulls import Pulls
    from swarmd.peers.sim.shard_records import Shard, ShardClients
    from swarmd.peers.sim.workload import RunSizes
    from swarmd.peers.sim.world import World

MAX_VERSION_TOKENS = 4096
"""Committed versions of shard (0, 0) whose micro-batches are kept, to take off a lost one's."""


class LoggedStep(NamedTuple):
    """Step ``version``'s delta on its way to ``standby``, the shard's as of ``epoch``."""

    shard: Shard
    epoch: int
    standby: int
    version: int


class Commits:
    def __init__(self, world: World, sizes: RunSizes, ledger_shard: Shard, pulls: Pulls, clients: ShardClients) -> None:
        self.world, self.sizes = world, sizes
        self.clients = clients
        self.ledger_shard = ledger_shard
        """Shard (0, 0): only its commits count what is trained."""
        self.pulls = pulls
        self.version_mb: OrderedDict[int, int] = OrderedDict()
        """Shard (0, 0)'s recent committed versions -> the micro-batches each trained."""

    def step(self, now: float, shard: Shard) -> None:
        """The buffer is applied as a new version, logged at the standby (committed at once
        without one)."""
        world, workload = self.world, self.sizes.workload
        shard.version += 1
        shard.steps.append((shard.version, shard.buffer, now))
        shard.buffer, shard.buffered = [], 0.0
        if shard.standby is None:
            self.commit(now, shard, shard.version)  # nobody to replicate to
            return
        world.engine.send(
            now,
            shard.holder,
            shard.standby,
            workload.delta_bytes(shard.stage, shard.index),
            self._logged,
            LoggedStep(shard, shard.epoch, shard.standby, shard.version),
        )
        if shard.version % world.settings.checkpoint_every == 0:
            world.engine.send(now, shard.holder, shard.standby, workload.checkpoint_bytes(shard.stage, shard.index))

    def _logged(self, now: float, step: LoggedStep) -> None:
        shard = step.shard
        if step.epoch != shard.epoch or step.standby != shard.standby:
            return
        shard.logged.add(step.version)
        self.advance(now, shard)

    def advance(self, now: float, shard: Shard) -> None:
        """Commit what the standby can replay: its checkpoint, then the logged steps in order."""
        if not shard.standby_ready:
            return
        upto = max(shard.committed, shard.checkpoint_version)
        while upto + 1 in shard.logged:
            upto += 1
        shard.logged = {v for v in shard.logged if v > upto}
        if upto > shard.committed:
            self.commit(now, shard, upto)

    def commit(self, now: float, shard: Shard, upto: int) -> None:
        """Every step up to version ``upto`` is committed: its contributions settle."""
        world, k = self.world, self.sizes.share_micro_batches
        trained = steps = 0
        first = shard is self.ledger_shard
        while shard.steps and shard.steps[0][0] <= upto:
            version, contributions, stepped = shard.steps.popleft()
            steps += 1
            world.phases.add("commit_lag", now - stepped)
            mb = 0
            for c in contributions:
                if first:  # only shard (0, 0) counts what is trained
                    mb += sum(i not in shard.done for i in c.share_ids) * k
                shard.remember(c.share_ids)
                settle(now, c, self.clients)
            if first:
                trained += mb
                self.version_mb[version] = mb
                if len(self.version_mb) > MAX_VERSION_TOKENS:
                    self.version_mb.popitem(last=False)
        shard.committed = upto
        if shard.standby is not None and shard.standby_ready:
            shard.replicas[shard.standby] = upto
        if first:
            world.trained(now, trained, steps)
        self.pulls.committed(now, shard)

    def lose(self, shard: Shard, restored: int) -> None:
        """A failover restores ``shard`` at ``restored``: the versions committed above it are
        lost (counted), and at shard (0, 0) what they trained is not trained after all."""
        lost = max(0, shard.committed - restored)
        self.world.counts["updates_lost"] += lost
        if shard is self.ledger_shard and lost:
            self.world.untrained(sum(self.version_mb.pop(v, 0) for v in range(restored + 1, shard.committed + 1)))
