"""The values the trainer's parts are built from: the run's facts, a request's shape, the run's inputs.

The parts (``shards.opening``, ``shards.shard_sources``, ``cell_making``, ``shards.reducer``,
``shards.head_relay``, ``handlers``, ``lifecycle``) are built from these, from the pool's view
(``shards.pool_view``), from what is held (``held``) and from each other, in that order, so that
none of them reaches into the trainer:

- ``RunFacts``: values fixed for the trainer's life (the signed spec, this peer's identity,
  its checkpoint folder, the stages, the mode, the wire's half precision, how its cells compute);
- ``compute_settings``: the daemon's resolved device and its ``[compute]`` precision and compile
  as the ``ComputeSettings`` cells are built with;
- ``stage_module``: a stage's module as every peer builds it alike from the run's seed: the
  seed weights a shard starts from and the module a cell computes with are the same;
- ``Send``: one request to a peer;
- ``RunInputs``: what the trainer reads of the run's files (``swarmd.data.run_files.RunFiles``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch

from swarmd.models.precision import ComputeSettings, resolve_precision
from swarmd.models.stages import StageModule, split_layers
from swarmd.peers.records.identity import Identity
from swarmd.peers.records.run_spec import RunSpec, SignedRunSpec, run_seed
from swarmd.peers.wire.protocol import Request

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
    compute: ComputeSettings = field(default_factory=ComputeSettings)
    """Where and how this peer's cells compute (``compute_settings``); checkpointing is the
    plan's choice per stage, set by the cell maker."""

    @property
    def run_id(self) -> str:
        return self.signed.run_id

    @property
    def spec(self) -> RunSpec:
        return self.signed.spec

    @property
    def own(self) -> str:
        return self.identity.peer_id


def compute_settings(device: str, precision: str = "auto", compile: bool = False) -> ComputeSettings:
    """The settings this peer's cells compute with: ``device`` as the daemon resolved it
    (``node.device.resolve_device``), ``precision`` and ``compile`` as ``[compute]`` says."""
    return ComputeSettings(device=device, dtype=resolve_precision(precision, device), compile=compile)


def stage_module(facts: RunFacts, stage: int) -> StageModule:
    """Stage ``stage``'s module with the run's seed weights (module doc)."""
    s = facts.spec
    return StageModule.from_shape(s.model, run_seed(facts.run_id), split_layers(s.model.layers, facts.stages), stage)


class RunInputs(Protocol):
    """What the trainer reads of the run's files (``swarmd.data.run_files.RunFiles``)."""

    async def training_data(self) -> TrainingData:
        """The run's training and held-out sequences here (it may wait for files to be fetched)."""

    async def initial_slice(self, stage: int, lo: int, hi: int) -> torch.Tensor | None:
        """A slice of a stage's starting weights for a run that starts from a checkpoint; None
        for a run that starts from its seed; ``DataError`` when it cannot be had yet."""

    def tokenizer_file(self) -> Path | None:
        """The run's tokenizer file here (None: bytes, or not fetched yet)."""
