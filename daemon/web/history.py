"""The dashboard's curves: a bounded ring of samples of this daemon's status, taken every few seconds.

A sample is what a volunteer wants to see move: the training loss, the run's held-out loss,
tokens per second, committed updates per minute, and how many peers this one sees. The ring holds at most ``capacity``
samples (the oldest fall off), so a daemon that runs for weeks holds the last few hours only.
"""

from __future__ import annotations

from collections import deque
from dataclasses import asdict, dataclass
from typing import Any

SAMPLE_S = 5.0
"""How often the server samples the status (the dashboard refreshes at the same pace)."""
CAPACITY = 2880
"""Samples kept: four hours at ``SAMPLE_S``."""


@dataclass(frozen=True, kw_only=True)
class Sample:
    t: float
    """Unix time of the sample."""
    loss: float | None
    """Mean training loss of the last micro-batches this peer saw (None: it trains no last stage)."""
    tokens_per_s: float | None
    """Tokens per second the swarm trains, as shard (0, 0) applies them (None: not served here)."""
    updates: int
    """The model's committed updates as this peer sees them: stage 0's version, or on a peer
    that holds no part of stage 0, the newest version of a stage it holds."""
    updates_per_min: float | None
    """Committed updates per minute since the previous sample (None: the first sample)."""
    peers: int
    """Other members this peer sees."""
    held_out_loss: float | None = None
    """The run's newest held-out loss this peer knows of (None: none scored yet)."""


class History:
    """The last ``capacity`` samples, oldest first."""

    def __init__(self, capacity: int = CAPACITY) -> None:
        if capacity < 2:
            raise ValueError(f"a history of {capacity} sample(s) draws no curve; keep at least 2")
        self._samples: deque[Sample] = deque(maxlen=capacity)

    def __len__(self) -> int:
        return len(self._samples)

    def record(self, status: dict[str, Any], now: float) -> Sample:
        """Take a sample of a status answer (``swarmd.node.control_api.ControlApi.status``)."""
        training = status.get("training") or {}
        updates = updates_seen(training)
        rate = None
        if self._samples:
            last = self._samples[-1]
            elapsed = now - last.t
            # A peer that stops holding stage 0 sees 0 updates for a while: no negative rate.
            rate = round(max(0, updates - last.updates) * 60.0 / elapsed, 2) if elapsed > 0 else None
        sample = Sample(
            t=round(now, 2),
            loss=_number(training.get("loss")),
            tokens_per_s=_number(training.get("tokens_per_s")),
            updates=updates,
            updates_per_min=rate,
            peers=len(status.get("peers") or []),
            held_out_loss=_number((training.get("held_out") or {}).get("loss")),
        )
        self._samples.append(sample)
        return sample

    def samples(self) -> list[dict[str, Any]]:
        return [asdict(s) for s in self._samples]


def updates_seen(training: dict[str, Any]) -> int:
    # The status counts stage 0's version only; a peer that holds another stage still sees the
    # swarm commit updates there (every stage's version grows by one per update).
    stage_zero = int(training.get("updates") or 0)
    if stage_zero:
        return stage_zero
    versions = [v for c in training.get("cells") or [] for v in c["weights"]["versions"]]
    return max([*versions, *(s["version"] for s in training.get("shards") or [])], default=0)


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None
