"""Who holds each shard and who stands by for it (``shards`` module doc, "Failover").

The holder's standby is elected by the daemon's rule (``elect_standby``) and gets a checkpoint
copy. When the holder's departure is noticed the standby takes the shard over at the last
committed version, or else the live device whose copy is newest, or else the plan's server
from the seeded weights; a new plan moves a shard with a checkpoint and loses nothing. Either
way the cells send again what was not committed, and the ledger is rebuilt with shard (0, 0).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from swarmd.peers.membership.election import elect_standby

if TYPE_CHECKING:
    from swarmd.peers.sim.commits import Commits
    from swarmd.peers.sim.contributions import Intake
    from swarmd.peers.sim.pulls import Pulls
    from swarmd.peers.sim.shard_records import Shard, ShardClients
    from swarmd.peers.sim.workload import Workload
    from swarmd.peers.sim.world import World


class CheckpointCopy(NamedTuple):
    """A checkpoint of ``shard`` at ``version`` (as of ``epoch``) on its way to its ``standby``."""

    shard: Shard
    epoch: int
    standby: int
    version: int


class ShardMove(NamedTuple):
    """A checkpoint of ``shard`` (as of ``epoch``) on its way to the ``server`` a plan names: it
    holds the shard at the version committed when the checkpoint and the log since are in."""

    shard: Shard
    epoch: int
    server: int


class ShardHolders:
    def __init__(
        self,
        world: World,
        workload: Workload,
        stages: list[list[Shard]],
        intake: Intake,
        commits: Commits,
        pulls: Pulls,
        clients: ShardClients,
    ) -> None:
        self.world, self.workload = world, workload
        self.stages = stages
        self.intake = intake
        self.commits = commits
        self.pulls = pulls
        self.clients = clients

    def elect_standby(self, now: float, shard: Shard, seeded: bool = False) -> None:
        """The holder's standby (``elect_standby``, the daemon's rule), which gets a checkpoint
        copy; at the start every peer has the seeded weights and needs none."""
        world = self.world
        holder = shard.holder
        chosen = elect_standby(
            (
                (
                    world.ids[d],
                    round(float(world.availability[d]), 1),
                    now - float(world.member_since[d]),
                    float(world.scenario.bandwidth_Bps[holder, d]),
                )
                for d in world.members()
                if d != holder
            ),
            world.settings.thresholds.min_reliability,
        )
        if chosen is None:
            shard.standby, shard.standby_ready = None, False
            if shard.steps:
                self.commits.commit(now, shard, shard.version)
            return
        standby = world.index[chosen]
        shard.standby, shard.standby_ready, shard.logged = standby, seeded, set()
        if seeded:
            return
        copy = CheckpointCopy(shard, shard.epoch, standby, shard.version)
        nbytes = self.workload.checkpoint_bytes(shard.stage, shard.index)
        world.engine.send(now, holder, standby, nbytes, self._standby_ready, copy)

    def _standby_ready(self, now: float, copy: CheckpointCopy) -> None:
        shard = copy.shard
        if copy.epoch != shard.epoch or copy.standby != shard.standby:
            return
        shard.standby_ready, shard.checkpoint_version = True, copy.version
        shard.replicas[copy.standby] = max(shard.committed, copy.version)
        self.commits.advance(now, shard)

    def noticed_departure(self, now: float, device: int) -> None:
        for row in self.stages:
            for shard in row:
                if shard.holder == device:
                    self._fail_over(now, shard)
                elif shard.standby == device:
                    self.elect_standby(now, shard)
                if shard.moving_to == device:
                    shard.moving_to = None

    def _fail_over(self, now: float, shard: Shard) -> None:
        world = self.world
        world.counts["failovers"] += 1
        shard.replicas.pop(shard.holder, None)
        if shard.standby is not None and world.member[shard.standby] and shard.standby_ready:
            successor, restored = shard.standby, shard.committed
        else:
            copies = {d: v for d, v in shard.replicas.items() if world.member[d]}
            if copies:
                successor = max(copies, key=lambda d: (copies[d], world.availability[d], -d))
                restored = copies[successor]
            else:  # no copy survives: the shard starts again from the seeded weights
                successor, restored = self.clients.restart_server(shard.stage), 0
        self.commits.lose(shard, restored)
        self._take_over(now, shard, successor, restored)

    def follow_plan(self, now: float, servers: tuple[tuple[int, ...], ...]) -> None:
        """A shard the plan names another live server for moves there (the server the
        assignment names holds the shard once it has a lease: ``servers.resolve_shards``),
        with a checkpoint from its holder and the log since: nothing is lost. A plan cut
        into other shard counts is not followed (its leases would be void)."""
        world = self.world
        if [len(row) for row in servers] != [len(row) for row in self.stages]:
            return
        for row, named in zip(self.stages, servers, strict=True):
            for shard, server in zip(row, named, strict=True):
                if server == shard.holder or server == shard.moving_to or not world.member[server]:
                    continue
                shard.moving_to = server
                nbytes = self.workload.checkpoint_bytes(shard.stage, shard.index)
                world.engine.send(now, shard.holder, server, nbytes, self._moved, ShardMove(shard, shard.epoch, server))

    def _moved(self, now: float, move: ShardMove) -> None:
        shard = move.shard
        if move.epoch != shard.epoch or shard.moving_to != move.server:
            return
        self.world.counts["shard_moves"] += 1
        self._take_over(now, shard, move.server, shard.committed)

    def _take_over(self, now: float, shard: Shard, successor: int, restored: int) -> None:
        """``successor`` holds the shard at version ``restored``; what was not committed is
        sent again by the cells that hold it."""
        world = self.world
        resend = shard.hand_over(successor, restored)
        self.elect_standby(now, shard)
        for c in [part for sent in resend for part in (sent.parts or [sent])]:  # a head's sum: its members resend
            if world.up[c.device]:
                self.intake.contribute(now, c)
            elif c.group is None:
                world.counts["contributions_lost"] += 1
        if shard is self.stages[0][0]:  # the ledger lives with shard (0, 0): it is rebuilt there
            self.clients.ledger_restarted(now)
        self.pulls.rejoin(now, shard, restored)
