"""The GPU check's arithmetic: FLOPs per token, MFU, the loss comparison and the table.

Pure functions over numbers the check measured, so that ``tests/unit/test_gpu_check.py``
checks them without a GPU or a daemon.

FLOPs per token follow torchtitan (``get_num_flop_per_token``) and nanoGPT (``estimate_mfu``):
6 per parameter that multiplies (the embedding's lookup is no matmul, so its parameters are left
out; an untied head counts) for a forward and a backward, plus 12 x layers x hidden x seq for
attention's two matmuls per layer (2 forward, 4 backward, 2 FLOPs each), causal masking not
discounted. A recompute (activation checkpointing) is not counted: MFU, not hardware FLOPs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass


def flops_per_token(*, params: int, embedding_params: int, layers: int, hidden: int, seq_len: int) -> int:
    """Training FLOPs per token (module doc): 6 x the parameters that multiply, plus attention's."""
    if not 0 <= embedding_params <= params:
        raise ValueError(f"embedding_params {embedding_params} must be in [0, params = {params}]")
    return 6 * (params - embedding_params) + 12 * layers * hidden * seq_len


def mfu(tokens_per_s: float, flops_token: int, rated_flops: float) -> float:
    """Model FLOPs utilisation: the FLOP/s the model's training did over the rated FLOP/s."""
    if rated_flops <= 0:
        raise ValueError(f"the rated figure must be above 0 FLOP/s, got {rated_flops}")
    return tokens_per_s * flops_token / rated_flops


@dataclass(frozen=True)
class LossComparison:
    """A run's mean training loss over a window of steps against the reference's over the same."""

    first_step: int
    last_step: int
    loss: float
    reference: float
    tolerance: float

    @property
    def gap(self) -> float:
        return self.loss - self.reference

    @property
    def within(self) -> bool:
        """Finite, and no further from the reference than the tolerance either way."""
        return math.isfinite(self.loss) and abs(self.gap) <= self.tolerance


def step_losses(losses: Sequence[Sequence[float]], per_step: int) -> dict[int, float]:
    """The mean loss of every step whose ``per_step`` micro-batches all appear in ``losses``
    (``[micro-batch index, loss]`` pairs, as a daemon's status lists them: micro-batch ``m``
    belongs to step ``m // per_step``); a micro-batch seen twice (recomputed) counts once,
    its latest loss."""
    if per_step < 1:
        raise ValueError(f"per_step must be at least 1, got {per_step}")
    latest = {int(m): float(loss) for m, loss in losses}
    steps: dict[int, list[float]] = {}
    for m, loss in latest.items():
        steps.setdefault(m // per_step, []).append(loss)
    return {step: sum(found) / per_step for step, found in sorted(steps.items()) if len(found) == per_step}


def compare_losses(
    steps: Mapping[int, float], reference: Sequence[float], *, window: int, tolerance: float, upto: int | None = None
) -> LossComparison | None:
    """The mean over the last ``window`` steps both have (up to step ``upto``, when given), the
    run's against the reference's (``reference[s]``: step ``s``'s mean loss); None when the run
    has no such step. Steps the run skipped (its window's losses scrolled away) are left out of
    both means alike."""
    if window < 1:
        raise ValueError(f"window must be at least 1, got {window}")
    last = max((s for s in steps if s < len(reference) and (upto is None or s <= upto)), default=None)
    if last is None:
        return None
    chosen = [s for s in steps if last - window < s <= last]
    return LossComparison(
        first_step=min(chosen),
        last_step=last,
        loss=sum(steps[s] for s in chosen) / len(chosen),
        reference=sum(reference[s] for s in chosen) / len(chosen),
        tolerance=tolerance,
    )


@dataclass(frozen=True)
class Row:
    """One line of the table: a way of training the model, and what it measured."""

    name: str
    tokens_per_s: float | None
    mfu: float | None
    peak_bytes: list[int]
    """Each process's peak memory (one per daemon)."""
    loss: LossComparison | None
    note: str = ""

    def to_json(self) -> dict[str, object]:
        out = asdict(self)
        if self.loss is not None:
            out["loss"] = {**asdict(self.loss), "gap": self.loss.gap, "within": self.loss.within}
        return out


def _number(value: float | None, fmt: str) -> str:
    return "-" if value is None or not math.isfinite(value) else format(value, fmt)


def format_row(row: Row, reference_tps: float | None) -> list[str]:
    """The cells of ``row``: tokens/s, its ratio to the reference's, MFU, peak GiB per process, loss."""
    ratio = None if row.tokens_per_s is None or not reference_tps else row.tokens_per_s / reference_tps
    peaks = " + ".join(f"{b / 2**30:.2f}" for b in row.peak_bytes) or "-"
    if row.loss is None:
        loss = "-"
    else:
        c = row.loss
        steps = f"steps {c.first_step}-{c.last_step}"
        loss = f"{c.loss:.3f} ({c.gap:+.4f} vs ref, {steps})" if row.name != "reference" else f"{c.loss:.3f} ({steps})"
    return [
        row.name,
        _number(row.tokens_per_s, ",.0f"),
        _number(ratio, ".2f") + ("x" if ratio is not None else ""),
        _number(None if row.mfu is None else 100 * row.mfu, ".1f") + ("%" if row.mfu is not None else ""),
        peaks,
        loss,
        row.note,
    ]


HEADER = ["row", "tokens/s", "vs ref", "MFU", "peak GiB", "loss (mean of the window)", "note"]


def markdown_table(rows: Sequence[Row]) -> str:
    """The rows as a markdown table, the reference's tokens/s the yardstick of the ratio column."""
    reference = next((r.tokens_per_s for r in rows if r.name == "reference"), None)
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(format_row(r, reference)) + " |" for r in rows]
    return "\n".join(lines)


@dataclass(frozen=True)
class Goal:
    """A figure the issue asks for: printed, never a failure."""

    what: str
    value: float | None
    target: float

    @property
    def met(self) -> bool:
        return self.value is not None and self.value >= self.target

    def line(self) -> str:
        found = "not measured" if self.value is None else f"{self.value:.2f}"
        return f"{'met ' if self.met else 'MISS'}  {self.what}: {found} (goal >= {self.target:.2f})"


def goals(rows: Sequence[Row]) -> list[Goal]:
    """The issue's two goals: one daemon at >= 0.8x the reference's tokens/s, the reference's MFU >= 35%."""
    by_name = {r.name: r for r in rows}
    reference, alone = by_name.get("reference"), by_name.get("one daemon")
    ratio = None
    if reference and alone and reference.tokens_per_s and alone.tokens_per_s is not None:
        ratio = alone.tokens_per_s / reference.tokens_per_s
    return [
        Goal("one daemon's tokens/s over the reference's", ratio, 0.8),
        Goal("the reference's MFU", None if reference is None else reference.mfu, 0.35),
    ]
