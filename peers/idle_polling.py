"""When an idle worker asks again for work: the daemon's polling schedule, for the simulator too.

A worker with nothing to do goes round its stages asking each for a task (a claim, one round
trip each). When a whole round brings nothing, it waits ``IDLE_MIN_S`` and goes round again,
doubling the wait up to ``IDLE_MAX_S``; once it has been idle ``FLUSH_IDLE_S``, it pushes the
gradients it holds rather than sit on micro-batches others wait for. ``swarmd``'s
``PipelineWorker`` runs this loop; the simulator computes from the same schedule when an
idle worker notices new work, instead of simulating every fruitless round.

Times are offsets from the end of the first fruitless round, where the idle spell begins.
"""

from __future__ import annotations

import math

IDLE_MIN_S, IDLE_MAX_S = 0.005, 0.1
"""The first wait between fruitless rounds of claims, and the most it doubles to."""
FLUSH_IDLE_S = 0.05
"""Idle this long, a worker pushes what it holds."""


def next_round(idle_for: float, round_s: float) -> tuple[float, int]:
    """The first round that starts at or after ``idle_for`` (rounds that find nothing take
    ``round_s``): its start, and how many rounds started before it (each a round of claims
    that found nothing)."""
    if idle_for < 0 or round_s < 0:
        raise ValueError(f"idle_for ({idle_for}) and round_s ({round_s}) must be >= 0")
    start, wait, before = 0.0, IDLE_MIN_S, 0
    while wait < IDLE_MAX_S:  # the waits still doubling
        start += wait
        if start >= idle_for:
            return start, before
        start += round_s
        before += 1
        wait *= 2
    start += IDLE_MAX_S  # then a round every round_s + IDLE_MAX_S
    if start >= idle_for:
        return start, before
    period = round_s + IDLE_MAX_S
    k = math.ceil((idle_for - start) / period)
    return start + k * period, before + k


def flush_at(round_s: float) -> float:
    """When an idle worker pushes what it holds: the end of the first fruitless round that ends
    ``FLUSH_IDLE_S`` or more into the idle spell."""
    end, wait = 0.0, IDLE_MIN_S
    while end < FLUSH_IDLE_S:
        end += wait + round_s
        wait = min(2 * wait, IDLE_MAX_S)
    return end
