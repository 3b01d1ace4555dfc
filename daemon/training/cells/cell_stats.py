"""A cell's counters, and the object the daemon's status shows of it (``training.cells``)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from swarmd.peers.taskpool.cells import Cell


@dataclass
class CellStats:
    shares: int = 0
    abandoned: int = 0
    dropped_rounds: int = 0
    """Rounds whose contribution came out NaN or infinite: never sent, their shares trained again."""
    rounds: int = 0
    forwards: int = 0
    backwards: int = 0
    refused_epoch: int = 0
    refused_share: int = 0
    """Neighbours' tensors refused for a share larger than the run's shares."""
    send_failures: int = 0
    sync_timeouts: int = 0
    """Rounds that went on without the step of the round before (gradient mode)."""
    seconds: dict[str, float] = field(
        default_factory=lambda: {"compute": 0.0, "codec": 0.0, "waiting": 0.0, "sync": 0.0}
    )

    @contextlib.contextmanager
    def timing(self, what: str) -> Iterator[None]:
        """Count the time the block takes as ``what`` (one of ``seconds``' keys)."""
        started = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[what] += time.perf_counter() - started


def cell_info(
    cell: Cell,
    epoch: str | None,
    share: int | None,
    s: CellStats,
    losses: Iterable[tuple[int, float]],
    weights: dict[str, Any],
    contributions: dict[str, Any],
) -> dict[str, Any]:
    """The cell's entry in the status JSON: which it is, its epoch and share in flight, its
    counters, its recent loss, and its parts' own entries (``Puller.info``, ``Contributions.info``)."""
    recent = [loss for _, loss in list(losses)[-16:]]
    return {
        "pipeline": cell[0],
        "stage": cell[1],
        "epoch": epoch,
        "share": share,
        "shares": s.shares,
        "abandoned": s.abandoned,
        "dropped_rounds": s.dropped_rounds,
        "rounds": s.rounds,
        "forwards": s.forwards,
        "backwards": s.backwards,
        "refused_epoch": s.refused_epoch,
        "refused_share": s.refused_share,
        "send_failures": s.send_failures,
        "sync_timeouts": s.sync_timeouts,
        "seconds": {k: round(v, 2) for k, v in s.seconds.items()},
        "loss": round(sum(recent) / len(recent), 4) if recent else None,
        "weights": weights,
        "contributions": contributions,
    }
