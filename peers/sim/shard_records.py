"""The records the shard servers' parts share, and what they ask of the rest of the path.

A shard (``Shard``), a contribution (``Contribution``), a stage-0 round's group of
contributions (``RoundGroup``), and ``ShardClients``: the cells, their reduction heads and the
plan, as the shard servers (``shards``) and their parts (``contributions``, ``commits``,
``pulls``, ``shard_holders``) see them.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from swarmd.peers.sim.pipeline_state import Cell

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
