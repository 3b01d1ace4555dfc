"""The shard servers of the simulated data path (``docs/data-path.md``, "A shard server").

Each shard ``(s, k)`` of a stage's parameters has a holder and a standby:

- **Contributions** (``contributions``) arrive as flows from the cells of stage ``s`` (one per
  cell per round per shard). One for shares this shard already committed (a recompute) is
  acknowledged and not applied again; the others are weighed by ``exchange.staleness_weight``
  (weight 0: dropped as stale, counted, and its share IDs settled here as done, as the daemon's
  ``ParameterShard`` settles them: its work is not applied at this shard, and its shares are
  not trained again) and buffered.
- **Steps** (``commits``): once the weighted micro-batches buffered reach
  ``exchange.step_micro_batches`` the shard steps; the step's delta (fp16) is logged at the
  standby, a flow on the holder's uplink, and the step is **committed** when it is there (and
  the standby holds a checkpoint to replay it on). Every ``checkpoint_every`` steps a
  checkpoint crosses the same uplink. With nobody to be a standby, a step is committed at
  once, and a failover may lose it.
- **Pulls** (``pulls``): every cell keeps one pull per shard in flight (the long poll); it
  brings a delta per committed version the cell lacks, or the whole fp32 slice when the cell
  is further behind than ``keep_versions``. A new cell first fetches every slice of its stage
  whole.
- **Failover** (``shard_holders``): when the holder's departure is noticed, its standby takes
  the shard over at the last committed version (committed updates lost: those no live copy
  holds, counted); every contribution not yet committed (buffered, stepped but not logged, or
  in flight) is sent again by its cell if that cell is still up (a later stage's is lost with
  its cell). A shard also moves, with a checkpoint and nothing lost, to the server a new plan
  names.

The ledger of shares (``swarmd.peers.taskpool.shares.ShareLedger``) lives with shard ``(0, 0)``:
its failover rebuilds the ledger from its checkpoint's metadata, so every share open then is
issued again, as the daemon's standby does. Trained tokens are counted at that shard's commits.

The records the four parts share (a shard, a contribution, a stage-0 round's group) and what
they ask of the rest of the path (``ShardClients``: the cells, their reduction heads, the plan)
are in ``shard_records``; this module holds ``ShardServers``, which builds the parts and is
what the rest of the path calls.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from swarmd.peers.sim.commits import Commits
from swarmd.peers.sim.contributions import Intake
from swarmd.peers.sim.pulls import Pulls
from swarmd.peers.sim.shard_holders import ShardHolders
from swarmd.peers.sim.shard_records import Contribution, Shard, ShardClients

if TYPE_CHECKING:
    from swarmd.peers.sim.pipeline_state import Cell
    from swarmd.peers.sim.workload import RunSizes
    from swarmd.peers.sim.world import World


class ShardServers:
    """Every shard of the run, and the parts that serve them: ``Intake`` takes contributions
    in, ``Commits`` steps and commits at the standby, ``Pulls`` serves the cells' pulls and
    slices, ``ShardHolders`` elects standbys and moves shards between devices."""

    def __init__(
        self, world: World, sizes: RunSizes, servers: tuple[tuple[int, ...], ...], clients: ShardClients
    ) -> None:
        self.stages: list[list[Shard]] = [[Shard(s, k, d) for k, d in enumerate(row)] for s, row in enumerate(servers)]
        self.pulls = Pulls(world, sizes.workload, self.stages, clients)
        self.commits = Commits(world, sizes, self.ledger_shard, self.pulls, clients)
        self.intake = Intake(world, sizes, self.stages, self.commits, clients)
        self.holders = ShardHolders(world, sizes.workload, self.stages, self.intake, self.commits, self.pulls, clients)
        for shard in self.all():
            # Every peer builds the initial weights from the run's seed: a standby needs no copy.
            self.holders.elect_standby(0.0, shard, seeded=True)

    def all(self) -> Iterable[Shard]:
        for row in self.stages:
            yield from row

    @property
    def ledger_shard(self) -> Shard:
        return self.stages[0][0]

    def next_cid(self) -> int:
        return self.intake.next_cid()

    def contribute(self, now: float, c: Contribution, sender: int | None = None) -> None:
        """Cell ``c.device`` (or ``sender``: the head of its reduction group, forwarding it)
        sends ``c`` to its shard's holder."""
        self.intake.contribute(now, c, sender)

    def cut(self, cell: Cell) -> int:
        """``cell``'s device left: its contributions in flight stop with its flows (how many)."""
        return self.intake.cut(cell)

    def load(self, now: float, cell: Cell) -> None:
        """A new cell fetches its stage's weights, every slice whole, before it starts."""
        self.pulls.load(now, cell)

    def noticed_departure(self, now: float, device: int) -> None:
        self.holders.noticed_departure(now, device)

    def follow_plan(self, now: float, servers: tuple[tuple[int, ...], ...]) -> None:
        self.holders.follow_plan(now, servers)
