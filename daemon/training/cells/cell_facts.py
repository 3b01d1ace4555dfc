"""What a cell's parts are built from: its facts, its view of the pool, and a small handle on the cell.

``CellWorker`` (``cell``) owns the work loop and wires its parts (``Feeder``, ``Neighbours``,
``CellRounds``, ``Puller``, ``Contributions``). A part is never handed the worker itself: it
gets ``CellFacts`` (what does not change while the cell lives), its siblings explicitly, and
one of the protocols below for what the cell does for it, no wider than it needs. Each part
can then be built alone, in a unit test, from a few small fakes.

- ``Sends``  the cell's way to its peers: a request with an answer, or one told in the background
- ``Views``  the cell's view of the pool (renewed every round of the pool) and whether it stopped
- ``Works``  the cell's one worker thread, and its waits (counted as waiting in its stats)
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from swarmd.models.build import ModelShape
from swarmd.peers.taskpool.cells import Cell
from swarmd.peers.taskpool.exchange import ExchangeConfig
from swarmd.peers.wire.codecs import FrameSpec
from swarmd.peers.wire.protocol import Request

T = TypeVar("T")


@dataclass(frozen=True)
class CellFacts:
    """What a cell is, fixed while it lives: which cell of which run, and how it exchanges."""

    cell: Cell
    stages: int
    settings: ExchangeConfig
    micro_batch: int
    run_id: str
    shards: int
    """The number of shards of this cell's stage."""
    half: str = "fp16"
    """The 16-bit codec the links that call for one use."""
    in_spec: FrameSpec | None = None
    """The activations this cell receives (None at stage 0, which reads tokens)."""
    out_spec: FrameSpec | None = None
    """The activations this cell sends, and the gradients it gets back (None at the last stage)."""

    @classmethod
    def of(
        cls,
        cell: Cell,
        stages: int,
        settings: ExchangeConfig,
        micro_batch: int,
        run_id: str,
        *,
        shape: ModelShape,
        shards: int,
        half: str = "fp16",
    ) -> CellFacts:
        """The facts of ``cell``, with the frames of its activations as ``shape`` makes them."""
        stage = cell[1]
        return cls(
            cell,
            stages,
            settings,
            micro_batch,
            run_id,
            shards,
            half,
            FrameSpec.activation(shape, stage, micro_batch) if stage > 0 else None,
            FrameSpec.activation(shape, stage + 1, micro_batch) if stage < stages - 1 else None,
        )

    @property
    def pipeline(self) -> int:
        return self.cell[0]

    @property
    def stage(self) -> int:
        return self.cell[1]

    @property
    def is_first(self) -> bool:
        return self.stage == 0

    @property
    def is_last(self) -> bool:
        return self.stage == self.stages - 1


@dataclass
class CellView:
    """What the trainer knows of the cell's surroundings, renewed every round of the pool."""

    epoch: str | None = None
    prev: str | None = None
    next: str | None = None
    servers: list[str | None] = field(default_factory=list)
    """The holders of this stage's shards, by shard index."""
    ledger: str | None = None
    """The holder of shard (0, 0), who keeps the share ledger."""
    heads: list[str | None] = field(default_factory=list)
    """By shard index, who reduces this cell's slice of it with its group's (this peer
    included: its own slices go through its reducer too); None: straight to the server."""
    head_pipelines: list[int | None] = field(default_factory=list)
    """By shard index, the pipeline whose cell heads it for this cell's group (None: no group)."""
    pipelines: int = 0
    """The pipelines of the assignment in force (0: not told)."""


class Sends(Protocol):
    async def send(self, peer: str, request: Request, blobs: list[bytes], timeout_s: float) -> tuple[Any, list[bytes]]:
        """Send ``request`` to ``peer`` (direct or through a relay); its answer and blobs."""
        ...

    def tell(self, peer: str, request: Request) -> None:
        """Send ``request`` in the background; its answer does not matter."""
        ...


class Views(Protocol):
    @property
    def view(self) -> CellView:
        """The pool's newest view (a new object each time it changes: read it anew each time)."""
        ...

    @property
    def stopped(self) -> bool: ...


class Works(Protocol):
    async def in_thread(self, fn: Callable[..., T], *args: Any, what: str = "compute") -> T:
        """Run ``fn`` on the cell's one worker thread (the compute is not thread-safe)."""
        ...

    async def timed(self, wait: Awaitable[Any]) -> None:
        """Await ``wait``, counted as waiting."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Wait ``seconds``, or less if the cell stops meanwhile."""
        ...


class CellHandle(Sends, Views, Works, Protocol):
    """All the cell does for its parts; a part that needs less takes one of the narrower ones."""
