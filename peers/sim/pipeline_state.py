"""The records of the simulated pipelines (``pipelines`` module doc).

A pipeline, its cells, and the stamp its events carry so that they lapse once the pipeline
changed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from swarmd.peers.sim.timing import Timing
    from swarmd.peers.taskpool.shares import Share


@dataclass(eq=False)
class Cell:
    pipeline: Pipeline
    stage: int
    shards: int
    device: int | None = None
    named: int = -1
    """The device the assignment names here (the last holder while the cell is open)."""
    serial: int = 0
    """Bumped when the cell changes hands: events for its previous holder lapse."""
    ready: bool = False
    """Holds its stage's weights."""
    arrived: list[int] = field(default_factory=list)
    """Per shard of its stage: the newest committed version its pulls brought."""
    base: list[int] = field(default_factory=list)
    pulling: list[bool] = field(default_factory=list)
    missing: set[int] = field(default_factory=set)
    loading_since: float = 0.0
    in_flight: set[int] = field(default_factory=set)
    """Contributions sent and not yet arrived at their shard."""
    round_shares: list[int] = field(default_factory=list)
    """Shares this holder trained in the pipeline's current round."""

    def __post_init__(self) -> None:
        self.arrived, self.base, self.pulling = [0] * self.shards, [0] * self.shards, [False] * self.shards


@dataclass(eq=False)
class Pipeline:
    pid: int
    cells: list[Cell] = field(default_factory=list)
    epoch: int = 0
    segment: list[Share] = field(default_factory=list)
    """The shares of the round in flight, one after the other (issued together, run as one event)."""
    holder: str = ""
    """The ledger's holder of the segment (its stage-0 device's ID)."""
    per_share_s: float = 0.0
    """A share's compute schedule, flush to flush (``share_seconds``)."""
    shares_done: int = 0
    """Shares of the current round trained so far."""
    waiting: str = ""
    wait_since: float = 0.0
    round_started: float = 0.0
    started: float = 0.0
    compute_done: bool = False
    flows_left: int = 0
    flow_end: float = 0.0
    timing: Timing | None = None
    sync_bases: list[list[int]] | None = None
    """Gradient mode: per cell, the bases of the round just contributed; the next round waits
    until every cell's pulls brought a version past them, or until ``sync_until``."""
    sync_until: float = 0.0

    def stamp(self) -> PipelineEpoch:
        """What an event for the pipeline as it is now carries."""
        return PipelineEpoch(self, self.epoch)


class PipelineEpoch(NamedTuple):
    """An event's pipeline as of ``epoch``: it lapses once the pipeline broke or changed."""

    pipeline: Pipeline
    epoch: int

    def current(self) -> bool:
        return self.epoch == self.pipeline.epoch
