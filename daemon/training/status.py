"""The training section of the daemon's status: what this peer holds, how far the swarm has
trained, and at what rate.

Progress is read off shard (0, 0)'s version, the count of updates its server applied: it
survives hand-overs (a new holder goes on from the version it took over), so the figures stay
right while that shard moves. Only the peer that serves it reports tokens and a rate.
"""

from __future__ import annotations

import time
from collections import deque
from typing import TYPE_CHECKING, Any

from swarmd.peers.taskpool.exchange import step_micro_batches

if TYPE_CHECKING:
    from swarmd.training.trainer import Trainer

SAMPLES = 30
"""Rounds over which the rate is measured (a round is the trainer's tick)."""


class Progress:
    """Shard (0, 0)'s version over the last rounds, sampled while this peer serves it."""

    def __init__(self) -> None:
        self._samples: deque[tuple[float, int]] = deque(maxlen=SAMPLES)  # (monotonic time, version)

    def note(self, version: int) -> None:
        self._samples.append((time.monotonic(), version))

    def tokens_per_s(self, per_update: int) -> float | None:
        """The rate over the samples kept; None until two of them are apart in time."""
        if len(self._samples) < 2 or self._samples[-1][0] <= self._samples[0][0]:
            return None
        (t0, n0), (t1, n1) = self._samples[0], self._samples[-1]
        return round((n1 - n0) * per_update / (t1 - t0), 1)


def training_status(trainer: Trainer) -> dict[str, Any]:
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
    ledger = trainer.handlers.ledger
    # Trained tokens: applied updates times the tokens of an update (a batch, H batches in
    # local mode), as shard (0, 0)'s server counts them; its version survives hand-overs.
    spec = trainer.spec.spec
    per_update = (
        spec.micro_batch
        * spec.model.seq_len
        * (step_micro_batches(trainer.exchange_settings()) if a is not None else 0)
    )
    first = trainer.servers.get((0, 0))
    return {
        "state": trainer.state,
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
        "standby": trainer.books.standby,
        "updates": max(versions, default=0),
        "loss": round(sum(recent) / len(recent), 4) if recent else None,
        "losses": [[m, round(loss, 4)] for m, loss in losses[-512:]],
        "trained_tokens": None if first is None else first.version * per_update,
        "tokens_per_s": None if first is None else trainer.progress.tokens_per_s(per_update),
    }
