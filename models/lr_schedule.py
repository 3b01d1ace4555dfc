"""The learning rate of a run's steps: a linear warm-up, then constant or a cosine decay.

Adam with its full step size from the first update is unstable on a fresh transformer: the
moments' estimates are poor while the gradients are largest, and a loss spike early can set a
run back for good (tiny-llama-bpe at lr 0.002: one seed in ten jumped 0.62 nats at step 17 and
ended 100 steps later 0.6 nats above the others; with 20 warm-up steps none did). Every recipe
for pretraining warms up and most decay the rate after, as torchtitan's and nanoGPT's do.

The rate depends on nothing but the step's number, so every peer that steps (a shard server in
gradient mode, at its version; a cell's inner optimizer in local mode, at its inner step) and
the single-process reference derive the same one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class LrSchedule:
    lr: float
    """The peak rate: reached after the warm-up, kept when there is no decay."""
    warmup_steps: int = 0
    """Steps whose rate rises linearly, ``lr * (step + 1) / warmup_steps`` (0: none)."""
    decay_steps: int = 0
    """The step by which a cosine from ``lr`` has come down to ``min_lr_ratio * lr``, kept from
    then on (0: no decay); more than ``warmup_steps``."""
    min_lr_ratio: float = 0.1
    """The decay's floor, as a fraction of ``lr``."""

    def __post_init__(self) -> None:
        if not (self.lr >= 0 and math.isfinite(self.lr)):
            raise ValueError(f"lr = {self.lr} must be a finite number >= 0")
        if self.warmup_steps < 0 or self.decay_steps < 0:
            raise ValueError(f"warmup_steps = {self.warmup_steps} and decay_steps = {self.decay_steps} must be >= 0")
        if self.decay_steps and self.decay_steps <= self.warmup_steps:
            raise ValueError(
                f"decay_steps = {self.decay_steps} must exceed warmup_steps = {self.warmup_steps} (or be 0: no decay)"
            )
        if not 0 <= self.min_lr_ratio <= 1:
            raise ValueError(f"min_lr_ratio = {self.min_lr_ratio} must be in [0, 1]")

    @property
    def constant(self) -> bool:
        return self.warmup_steps == 0 and self.decay_steps == 0

    def at(self, step: int) -> float:
        """The rate of step ``step`` (0: the first), taken after ``step`` steps."""
        if step < 0:
            raise ValueError(f"step = {step} must be >= 0")
        if step < self.warmup_steps:
            return self.lr * (step + 1) / self.warmup_steps
        if not self.decay_steps:
            return self.lr
        floor = self.lr * self.min_lr_ratio
        if step >= self.decay_steps:
            return floor
        progress = (step - self.warmup_steps) / (self.decay_steps - self.warmup_steps)
        return floor + (self.lr - floor) * 0.5 * (1 + math.cos(math.pi * progress))
