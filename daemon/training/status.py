"""The training section of the daemon's status.

What this peer holds, how far the swarm has trained, and at what rate.

Progress is read off shard (0, 0)'s version, the count of updates its server applied: it
survives hand-overs (a new holder goes on from the version it took over), so the figures stay
right while that shard moves. Only the peer that serves it reports tokens and a rate.

The state is the trainer's, except that "training" becomes "stalled" (with the reasons in
``stalled``) while no step can be made: a served shard's weights hold NaN or Inf (every
contribution computed on them is refused), or the last stage's recent losses are all NaN or
Inf. ``checkpoints`` counts the states refused for what they held: fetched ones, this peer's
own files set aside, and replicas refused at this standby.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

import torch

from swarmd.peers.taskpool.servers import Shard
from swarmd.training.evaluation import Evaluation, newest_score

if TYPE_CHECKING:
    from swarmd.peers.taskpool.assignment import Assignment
    from swarmd.peers.taskpool.cells import Cell
    from swarmd.training.bookkeeping import Books
    from swarmd.training.cells.cell import CellWorker
    from swarmd.training.held import Held
    from swarmd.training.shards.reducer import Reducer
    from swarmd.training.shards.replicas import ReplicaStore
    from swarmd.training.shards.shard_server import ShardServer
    from swarmd.training.shards.shard_sources import ShardSources

SAMPLES = 30
"""Rounds over which the rate is measured (a round is the trainer's tick)."""
RECENT_LOSSES = 8
"""The last stage's losses that, all non-finite, say that training is stalled."""


class Reported(Protocol):
    """What the status reads of a trainer: what it holds and what it counted."""

    own: str
    state: str
    error: str | None
    stages: int
    mode: str
    books: Books
    held: Held

    @property
    def cells(self) -> Mapping[Cell, CellWorker]: ...

    @property
    def servers(self) -> Mapping[Shard, ShardServer]: ...

    progress: Progress
    evaluation: Evaluation
    reducer: Reducer
    replicas: ReplicaStore
    sources: ShardSources

    @property
    def assignment(self) -> Assignment | None: ...

    def members(self) -> list[dict[str, Any]]: ...

    def trained_tokens(self, version: int) -> int: ...


class Progress:
    """Shard (0, 0)'s version over the last rounds, sampled while this peer serves it."""

    def __init__(self) -> None:
        self._samples: deque[tuple[float, int]] = deque(maxlen=SAMPLES)  # (monotonic time, version)
        self._finite: dict[Shard, tuple[int, bool]] = {}
        """Per served shard, whether its weights were finite at the version last checked."""

    def note(self, version: int) -> None:
        self._samples.append((time.monotonic(), version))

    def tokens_per_s(self, per_update: int) -> float | None:
        """The rate over the samples kept; None until two of them are apart in time."""
        if len(self._samples) < 2 or self._samples[-1][0] <= self._samples[0][0]:
            return None
        (t0, n0), (t1, n1) = self._samples[0], self._samples[-1]
        return round((n1 - n0) * per_update / (t1 - t0), 1)

    def stalled(self, servers: Mapping[Shard, ShardServer], cells: Mapping[Cell, CellWorker], stages: int) -> list[str]:
        """Why no step can be made here now (module doc); [] when nothing says so."""
        why = []
        for key, server in sorted(servers.items()):
            known = self._finite.get(key)
            if known is None or known[0] != server.version:  # checked once a version: a pass over the slice
                found = server.weights()
                if found is None:  # a step is being taken: judged at the next call
                    continue
                known = self._finite[key] = (found[0], bool(torch.isfinite(found[1]).all()))
            if not known[1]:
                why.append(
                    f"shard {key}'s weights hold NaN or Inf at version {known[0]}: no contribution can be applied"
                )
        for key in set(self._finite) - set(servers):
            del self._finite[key]
        last = [w for (_, s), w in sorted(cells.items()) if s == stages - 1]
        for worker in last:
            recent = [loss for _, loss in list(worker.losses)[-RECENT_LOSSES:]]
            if len(recent) == RECENT_LOSSES and not any(math.isfinite(loss) for loss in recent):
                why.append(f"cell {worker.cell}'s last {RECENT_LOSSES} losses are NaN or Inf")
        return why


def training_status(trainer: Reported) -> dict[str, Any]:
    """The ``training`` object of the daemon's status JSON."""
    a = trainer.assignment
    cells = [w.info() for _, w in sorted(trainer.cells.items())]
    shards = [s.info() for _, s in sorted(trainer.servers.items())]
    versions = [c["weights"]["versions"][0] for c in cells if c["stage"] == 0] + [
        s["version"] for s in shards if (s["stage"], s["shard"]) == (0, 0)
    ]
    last = [w for (_, s), w in trainer.cells.items() if s == trainer.stages - 1]
    losses = sorted((m, loss) for w in last for m, loss in w.losses)
    recent = [loss for _, loss in losses[-16:]]
    ledger = trainer.held.ledger
    # Trained tokens: applied updates times the tokens of an update (a batch, H batches in
    # local mode), as shard (0, 0)'s server counts them; its version survives hand-overs.
    per_update = trainer.trained_tokens(1)
    first = trainer.servers.get((0, 0))
    stalled = trainer.progress.stalled(trainer.servers, trainer.cells, trainer.stages)
    return {
        "state": "stalled" if stalled and trainer.state == "training" else trainer.state,
        "stalled": stalled,
        "error": trainer.error,
        "stages": trainer.stages,
        "mode": trainer.mode,
        "assignment": None
        if a is None
        else {
            "version": a.version,
            "provisional": a.provisional,
            "pipelines": a.pipelines,
            "local_steps": a.local_steps,
            "share_micro_batches": a.share_micro_batches,
            "shards": [len(row) for row in a.servers],
        },
        "cells": cells,
        "shards": shards,
        "ledger": None if ledger is None else ledger.info(),
        "reducer": trainer.reducer.info(),
        "replicas": trainer.replicas.status(),
        "checkpoints": {
            "refused_states": trainer.sources.refused_states,
            "set_aside": trainer.sources.set_aside,
            "refused_replicas": trainer.replicas.invalid,
        },
        "standby": trainer.books.standby,
        "updates": max(versions, default=0),
        "loss": round(sum(recent) / len(recent), 4) if recent else None,
        "losses": [[m, round(loss, 4)] for m, loss in losses[-512:]],
        "trained_tokens": None if first is None else first.version * per_update,
        "tokens_per_s": None if first is None else trainer.progress.tokens_per_s(per_update),
        "held_out": newest_score(trainer.evaluation.held_out(), trainer.members(), trainer.own),
        "scoring": trainer.evaluation.status() if trainer.evaluation.history or first is not None else None,
    }
