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

This module holds the records the four parts share (a shard, a contribution, a stage-0 round's
group), what they ask of the rest of the path (``ShardClients``: the cells, their reduction
heads, the plan), and ``ShardServers``, which builds the parts and is what the rest of the path
calls.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from swarmd.peers.sim.commits import Commits
from swarmd.peers.sim.contributions import Intake
from swarmd.peers.sim.pulls import Pulls
from swarmd.peers.sim.shard_holders import ShardHolders

if TYPE_CHECKING:
    from swarmd.peers.sim.pipeline_state import Cell
    from swarmd.peers.sim.workload import RunSizes
    from swarmd.peers.sim.world import World

MAX_DONE_SHARES = 1 << 16
"""Share IDs a shard remembers as committed (a recompute of an older one is rare)."""


@dataclass(eq=False)
class RoundGroup:
    """A stage-0 cell's contributions of one round, one per shard of stage 0: the round's
    shares complete at the ledger once each is committed, acknowledged or dropped as stale
    (the daemon's cell settles a refused slice and completes its round: recomputing a round
    that one of K shards found stale would train 1/K of the model again at the cost of all)."""

    holder: str
    share_ids: tuple[int, ...]
    left: int


@dataclass(eq=False)
class Contribution:
    cid: int
    device: int
    cell: Cell
    serial: int
    """The cell's serial when it was made: a cell that changed hands since no longer waits on it."""
    stage: int
    shard: int
    share_ids: tuple[int, ...]
    micro_batches: int
    base: int
    """The shard version the cell's weights held when its last share of the round began."""
    group: RoundGroup | None
    sent_at: float = 0.0
    parts: list[Contribution] = field(default_factory=list)
    """A reduction head's sum (``swarmd.peers.sim.reduction``): the members' contributions it
    covers, each delivered, settled or sent again as its own; empty for a cell's own."""


@dataclass(eq=False)
class Shard:
    stage: int
    index: int
    holder: int
    standby: int | None = None
    standby_ready: bool = False
    checkpoint_version: int = 0
    """The version of the checkpoint the standby holds (it replays the logged steps above it)."""
    version: int = 0
    committed: int = 0
    logged: set[int] = field(default_factory=set)
    """Versions above ``committed`` whose delta reached the standby."""
    buffer: list[Contribution] = field(default_factory=list)
    buffered: float = 0.0
    steps: deque[tuple[int, list[Contribution], float]] = field(default_factory=deque)
    """Applied, not yet committed: (version, its contributions, when it stepped)."""
    in_flight: dict[int, Contribution] = field(default_factory=dict)
    done: set[int] = field(default_factory=set)
    """Share IDs committed (or settled) here: the recent ``MAX_DONE_SHARES`` or so."""
    done_batches: deque[tuple[int, ...]] = field(default_factory=deque)
    """``done``'s IDs in the batches they came in, oldest first: forgotten a batch at a time
    (a contribution's H shares at once, in C: per ID it was most of a 200M run's time)."""
    done_count: int = 0
    replicas: dict[int, int] = field(default_factory=dict)
    """Device -> the committed version its copy of the shard holds."""
    epoch: int = 0
    """Bumped when the shard changes hands: events for the previous holder lapse."""
    moving_to: int | None = None

    def remember(self, share_ids: tuple[int, ...]) -> None:
        """These shares are through here: a contribution for them again is a duplicate."""
        self.done.update(share_ids)
        self.done_batches.append(share_ids)
        self.done_count += len(share_ids)
        while self.done_count > MAX_DONE_SHARES and len(self.done_batches) > 1:
            oldest = self.done_batches.popleft()
            self.done_count -= len(oldest)
            self.done.difference_update(oldest)

    def hand_over(self, successor: int, restored: int) -> list[Contribution]:
        """``successor`` holds the shard at version ``restored`` from now on (the epoch moves
        on, so events for the previous holder lapse): what was not committed, in flight,
        buffered or stepped, is returned for its cells to send again."""
        resend = list(self.in_flight.values()) + self.buffer + [c for _, cs, _ in self.steps for c in cs]
        self.holder, self.version, self.committed, self.moving_to = successor, restored, restored, None
        self.buffer, self.buffered, self.in_flight = [], 0.0, {}
        self.steps.clear()
        self.replicas.pop(successor, None)
        self.epoch += 1
        return resend


class ShardClients(Protocol):
    """What the shard servers tell the cells and ask of the rest of the path
    (``swarmd_path.SwarmdPath``: its pipelines, their reduction groups, the plan in force)."""

    def cells_of_stage(self, stage: int) -> list[Cell]: ...

    def delivered(self, now: float, cell: Cell) -> None:
        """A contribution of ``cell`` arrived at its shard."""

    def cell_ready(self, now: float, cell: Cell) -> None:
        """``cell`` holds its stage's weights, every slice whole."""

    def pulled(self, now: float, cell: Cell) -> None:
        """A pull brought ``cell`` a newer version."""

    def round_settled(self, now: float, group: RoundGroup) -> None:
        """A stage-0 round is through at every shard of stage 0."""

    def ledger_restarted(self, now: float) -> None:
        """Shard (0, 0), and the ledger with it, failed over."""

    def pull_head(self, cell: Cell, shard: int) -> Cell | None:
        """The cell ``cell`` pulls ``shard`` from (None: the server)."""

    def members_of(self, head: Cell, shard: int) -> list[Cell]:
        """The cells that pull ``shard`` from ``head``."""

    def restart_server(self, stage: int) -> int:
        """Where a shard of ``stage`` that no copy survived of starts again."""


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
