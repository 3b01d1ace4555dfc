"""The swarm's weights scored on the run's held-out data: the loss a user compares runs by.

The holder of shard (0, 0) (one peer, so one score per version) gathers every stage's newest
committed weights from its shards' holders every ``eval.every`` versions, builds the whole
model and takes its mean loss over the first ``eval.sequences`` sequences of the held-out
split, which no cell ever trains on and which are the same on every peer and at every score.
The score is shown in ``swarmd status``, on ``/metrics`` and the dashboard, and carried in
this peer's heartbeat so that every member's status shows the run's newest figure.

Scoring runs as one task at a time beside training, the model's forwards in a worker thread,
never on the loop; a gather that fails (a shard between holders) is tried again at the next
version due.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch

from swarmd.errors import SwarmdError
from swarmd.models.build import ModelShape, build_model
from swarmd.models.data.windows import Dataset
from swarmd.models.reference import held_out_loss
from swarmd.models.stages import merge_stage_state_dicts
from swarmd.peers.records.heartbeat import HeldOut

logger = logging.getLogger(__name__)

HISTORY = 2048
"""Scores kept for status and the dashboard's curve."""
MICRO_BATCH = 8


@dataclass(frozen=True)
class Score:
    version: int
    """Shard (0, 0)'s version when the score was asked for (its updates applied)."""
    stage_versions: list[int]
    """Each stage's oldest shard version among the weights scored."""
    loss: float
    sequences: int
    tokens: int
    """Tokens trained on by then (as status counts them)."""
    at: float
    """Unix time of the score."""
    seconds: float


def newest_score(own: HeldOut | None, members: list[dict[str, Any]], own_id: str) -> dict[str, Any] | None:
    """The run's newest held-out score this peer knows of: its own, or one a member's heartbeat
    carries (the scorer moves with shard (0, 0); the highest version wins)."""
    found = [(own.version, own.loss, own_id)] if own is not None else []
    found += [(int(m["held_out"][0]), float(m["held_out"][1]), str(m["peer_id"])) for m in members if m.get("held_out")]
    if not found:
        return None
    version, loss, by = max(found)
    return {"version": version, "loss": loss, "by": by, "here": by == own_id}


def score_weights(
    shape: ModelShape, seed: int, stages: list[dict[str, torch.Tensor]], held_out: Dataset, sequences: int
) -> float:
    """The mean held-out loss of the model the stages' weights make (blocking: a worker thread)."""
    model = build_model(shape, seed)
    model.load_state_dict(merge_stage_state_dicts(stages, shape), strict=True)
    return held_out_loss(model, held_out, sequences=sequences, micro_batch=MICRO_BATCH)


class Evaluation:
    """When to score, the scores so far, and the one task that makes the next."""

    def __init__(self, every: int, sequences: int) -> None:
        self.every = every
        """Versions between two scores (0: never)."""
        self.sequences = sequences
        self.history: deque[Score] = deque(maxlen=HISTORY)
        self.failures = 0
        self._task: asyncio.Task[None] | None = None
        self._next = 0

    def due(self, version: int) -> bool:
        return self.every > 0 and version >= self._next and (self._task is None or self._task.done())

    def start(self, version: int, tokens: int, score: Callable[[], Awaitable[tuple[list[int], float | None]]]) -> None:
        """Score the weights now (in a task of its own); ``score`` gathers and scores them."""
        self._next = (version // self.every + 1) * self.every
        self._task = asyncio.create_task(self._score(version, tokens, score), name="held-out score")

    async def _score(
        self, version: int, tokens: int, score: Callable[[], Awaitable[tuple[list[int], float | None]]]
    ) -> None:
        started = time.monotonic()
        try:
            versions, loss = await score()
        except (SwarmdError, RuntimeError, ValueError) as e:
            self.failures += 1
            self._next = version  # due again at once: the next round tries again
            logger.warning("held-out score at version %d failed (%s); trying again", version, e)
            return
        if loss is None:
            self.every = 0  # the run's data holds nothing out: nothing to score, ever
            logger.warning("the run's data has no held-out split: its held-out loss is not scored")
            return
        result = Score(version, versions, loss, self.sequences, tokens, time.time(), time.monotonic() - started)
        self.history.append(result)
        logger.info(
            "held-out loss %.4f at version %d (%d sequences, stage versions %s, %.1f s)",
            loss,
            version,
            self.sequences,
            versions,
            result.seconds,
        )

    async def stop(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    @property
    def latest(self) -> Score | None:
        return self.history[-1] if self.history else None

    def held_out(self) -> HeldOut | None:
        """The newest score, as this peer's heartbeat carries it."""
        latest = self.latest
        return None if latest is None else HeldOut(version=latest.version, loss=round(latest.loss, 6))

    def status(self) -> dict[str, Any]:
        latest = self.latest
        return {
            "every": self.every,
            "sequences": self.sequences,
            "latest": None if latest is None else asdict(latest),
            "history": [[s.version, s.tokens, round(s.loss, 5)] for s in self.history],
            "failures": self.failures,
        }
