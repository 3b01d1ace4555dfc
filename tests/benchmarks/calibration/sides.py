"""The figures each side of the comparison yields, real or simulated, from its timeline.

Both sides are reduced the same way (the same buckets, the same windows around the kill, the
same recovery rule) so that their figures can be set side by side.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from swarmd.peers.sim.results import recovery_times

BUCKET_S = 2.0
"""Seconds per bucket of a timeline: fine enough to see the kill and the recovery, coarse
enough that the real side's half-second samples fill each bucket."""
WINDOW_BUCKETS = 10
"""Buckets before the kill that make the throughput a recovery is measured against (20 s)."""
LEDGER_COUNTS = ("issued", "reissued", "completed", "abandoned", "expired")
"""The share ledger's counters that both sides count over the window."""


@dataclass
class Side:
    """One side of the comparison (real or simulated)."""

    tokens_per_s: float
    before_kill: float
    after_kill: float
    recovery_s: float | None
    timeline: list[int]
    """Micro-batches trained (applied in committed updates of shard ``(0, 0)``) per ``BUCKET_S``
    from the start of the window."""


def summarize(timeline: list[int], kill_s: float, tokens_per_mb: int) -> Side:
    """A timeline of micro-batches per bucket as tokens/s over the window, before the kill and
    once recovered, with the recovery's time (to 90% of the rate before the kill)."""
    rate = tokens_per_mb / BUCKET_S
    k = int(kill_s // BUCKET_S)
    # the window before the kill is its last WINDOW_BUCKETS buckets, the one after starts once
    # recovery is over
    before = timeline[max(0, k - WINDOW_BUCKETS) : k]
    recovered = recovery_times(timeline, BUCKET_S, [kill_s], window=WINDOW_BUCKETS, back=0.9)
    settle = int((kill_s + (recovered[0] if recovered else 0.0)) // BUCKET_S) + 1
    after = timeline[settle:] or timeline[k + 1 :]
    return Side(
        tokens_per_s=statistics.mean(timeline) * rate,
        before_kill=statistics.mean(before) * rate if before else 0.0,
        after_kill=statistics.mean(after) * rate if after else 0.0,
        recovery_s=recovered[0] if recovered else None,
        timeline=list(timeline),
    )


def mean_side(sides: list[Side]) -> Side:
    """The simulated windows' figures averaged (a recovery that never came counts as none)."""
    recovered = [s.recovery_s for s in sides if s.recovery_s is not None]
    return Side(
        tokens_per_s=statistics.mean(s.tokens_per_s for s in sides),
        before_kill=statistics.mean(s.before_kill for s in sides),
        after_kill=statistics.mean(s.after_kill for s in sides),
        recovery_s=statistics.median(recovered) if len(recovered) * 2 > len(sides) else None,
        timeline=[round(statistics.mean(column), 2) for column in zip(*(s.timeline for s in sides), strict=True)],
    )
