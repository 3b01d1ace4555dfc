"""What the trainer's parts are given instead of the trainer: the run's facts, a view of the pool, what is held.

The parts (``opening``, ``shard_sources``, ``cell_making``, ``reducer``, ``head_relay``,
``handlers``, ``lifecycle``) are built from these and from each other, in that order, so that
none of them reaches into the trainer:

- ``RunFacts``: values fixed for the trainer's life (the signed spec, this peer's identity,
  its checkpoint folder, the stages, the mode, the wire's half precision);
- ``PoolView``: what changes from round to round, read when it is needed (the books of the
  last reading of the pool, the assignment in force, who holds a cell or a shard, whom share
  tickets are believed from, the exchange's settings). The trainer implements it; a part's
  test fakes it with a small dataclass;
- ``Held``: the cells and shard servers this peer holds now, with what they leave behind (a
  closed shard's final state, a stopped cell's contributions still on their way) and the
  ledger the holder of shard (0, 0) keeps. ``lifecycle`` changes it; the others read it;
- ``RunInputs``: what the trainer reads of the run's files (``swarmd.data.run_files.RunFiles``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch

from swarmd.peers.records.identity import Identity
from swarmd.peers.records.run_spec import RunSpec, SignedRunSpec
from swarmd.peers.taskpool.exchange import ExchangeConfig
from swarmd.peers.taskpool.servers import Shard
from swarmd.peers.wire.protocol import Request
from swarmd.training.bookkeeping import Books
from swarmd.training.cell import CellWorker
from swarmd.training.contributors import ContributorPool
from swarmd.training.ledger_host import LedgerHost
from swarmd.training.shard_server import ShardServer

if TYPE_CHECKING:  # the run's data loads where it is opened (``swarmd.data.run_files``)
    from swarmd.data.training_data import TrainingData

Send = Callable[[str, Request[Any], list[bytes], float], Awaitable[tuple[Any, list[bytes]]]]
"""One request to a peer, this peer itself included (``Trainer.send``)."""


@dataclass(frozen=True)
class RunFacts:
    """The run and this peer, as the trainer was started for them."""

    signed: SignedRunSpec
    identity: Identity
    checkpoint_dir: Path
    stages: int
    mode: str
    """"gradient" (one local step) or "local" (several, then an outer step)."""
    half: str
    """The half precision tensors travel in (``ModelShape.wire_half``)."""

    @property
    def run_id(self) -> str:
        return self.signed.run_id

    @property
    def spec(self) -> RunSpec:
        return self.signed.spec

    @property
    def own(self) -> str:
        return self.identity.peer_id


class PoolView(ContributorPool, Protocol):
    """The pool as this peer last read it (the trainer's books), and what follows from it."""

    @property
    def books(self) -> Books: ...

    @property
    def reachable(self) -> frozenset[str]:
        """Every live member, workers or not (a paused one still serves what it handed back)."""
        ...

    def shard_holder(self, key: Shard) -> str | None: ...

    def exchange_settings(self) -> ExchangeConfig: ...


@dataclass
class Held:
    """What this peer holds now, and what its closed holdings left behind."""

    cells: dict[tuple[int, int], CellWorker] = field(default_factory=dict)
    cell_tasks: dict[tuple[int, int], asyncio.Task[None]] = field(default_factory=dict)
    servers: dict[Shard, ShardServer] = field(default_factory=dict)
    handed_over: dict[Shard, tuple[int, Path]] = field(default_factory=dict)
    """Shards this peer served and closed: their final state, for whoever holds them next."""
    rest_deliveries: set[asyncio.Task[bool]] = field(default_factory=set)
    """Stopped cells' contributions still on their way (``Lifecycle.close_cell``)."""
    ledger: LedgerHost | None = None
    """Set while this peer serves shard (0, 0), which keeps the share ledger."""


class RunInputs(Protocol):
    """What the trainer reads of the run's files (``swarmd.data.run_files.RunFiles``)."""

    async def training_data(self) -> TrainingData:
        """The run's training and held-out sequences here (it may wait for files to be fetched)."""

    async def initial_slice(self, stage: int, lo: int, hi: int) -> torch.Tensor | None:
        """A slice of a stage's starting weights for a run that starts from a checkpoint; None
        for a run that starts from its seed; ``DataError`` when it cannot be had yet."""

    def tokenizer_file(self) -> Path | None:
        """The run's tokenizer file here (None: bytes, or not fetched yet)."""
