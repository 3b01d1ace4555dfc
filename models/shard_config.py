"""A parameter shard's settings, the step rule they choose, and the errors a shard raises.

Two step rules, both elementwise (so a slice of the flat vector is an optimizer of its own):
``gradient`` mode steps AdamW on the mean gradient; ``local`` mode (DiLoCo) steps SGD with
Nesterov momentum on the mean pseudo-gradient, taken as the gradient.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from swarmd.errors import SwarmdError
from swarmd.models.lr_schedule import LrSchedule
from swarmd.models.robust_aggregation import AGGREGATIONS

MODES = ("gradient", "local")


class ShardError(SwarmdError):
    """A shard was used against its rules (a log replayed out of order, a version from the future,
    a checkpoint of another slice or mode)."""


class ContributionError(ShardError):
    """A contribution is refused before it touches the weights. ``reason`` says why without text
    to parse: ``length``, ``dtype``, ``finite``, ``norm``, ``version``, ``micro_batches``,
    ``share_ids``, ``weight`` or ``overlap`` (a sum of several cells' contributions, some of
    whose shares are already in)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True, kw_only=True)
class ShardConfig:
    mode: str
    """``gradient`` (AdamW on mean gradients) or ``local`` (Nesterov on mean pseudo-gradients)."""
    lr: float
    """AdamW learning rate (gradient mode): the peak of ``schedule``, when there is one."""
    schedule: LrSchedule | None = None
    """The rate of each step by the shard's version (gradient mode); None: ``lr`` throughout."""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW moment decay rates (gradient mode)."""
    eps: float = 1e-8
    """AdamW denominator guard (gradient mode)."""
    weight_decay: float = 0.0
    """AdamW decoupled weight decay (gradient mode)."""
    outer_lr: float = 0.7
    """Outer step size (local mode); the daemon passes its run's ``ExchangeConfig.outer_step``."""
    outer_momentum: float = 0.9
    """Outer Nesterov momentum (local mode); 0 makes it plain SGD."""
    keep_versions: int = 64
    """Deltas kept for pulls; a cell further behind gets the whole slice in fp32."""
    recent_share_ids: int = 65_536
    """Share IDs remembered as done (least recently settled forgotten first)."""
    max_norm_factor: float = 10.0
    """A contribution whose norm exceeds this times the median of recent accepted norms is
    scaled down to it (counted ``clipped``)."""
    refuse_norm_factor: float = 1000.0
    """A contribution whose norm exceeds this times that median is refused (no honest gradient
    is that far off)."""
    norm_warmup: int = 8
    """Accepted contributions seen before the norm bound applies (a median of fewer means little)."""
    norm_window: int = 256
    """Recent accepted norms the median is taken over (norms drift as training goes on)."""
    aggregation: str = "mean"
    """One of ``AGGREGATIONS``: the weighted mean of a round's contributions, or centred clipping
    (each one's difference from the previous aggregate clipped before averaging,
    ``robust_aggregation``); the daemon passes the run spec's ``aggregation``."""
    clip_radius_factor: float = 2.0
    """Centred clipping's radius: this times the median distance of recent contributions from
    the centre (``bench_robust`` measures what it costs in loss)."""

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode = {self.mode!r} is not one of {MODES}")
        if self.aggregation not in AGGREGATIONS:
            raise ValueError(f"aggregation = {self.aggregation!r} is not one of {AGGREGATIONS}")
        for name in ("lr", "outer_lr", "eps", "max_norm_factor", "refuse_norm_factor", "clip_radius_factor"):
            value = getattr(self, name)
            if not (value > 0 and math.isfinite(value)):
                raise ValueError(f"{name} = {value} must be a positive finite number")
        if not all(0 <= b < 1 for b in self.betas) or len(self.betas) != 2:
            raise ValueError(f"betas = {self.betas} must be two numbers in [0, 1)")
        if not (self.weight_decay >= 0 and math.isfinite(self.weight_decay)):
            raise ValueError(f"weight_decay = {self.weight_decay} must be a finite number >= 0")
        if not 0 <= self.outer_momentum < 1:
            raise ValueError(f"outer_momentum = {self.outer_momentum} must be in [0, 1)")
        for name in ("keep_versions", "recent_share_ids", "norm_warmup", "norm_window"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} = {getattr(self, name)} must be >= 1")

    def lr_at(self, version: int) -> float:
        """The rate of the step from ``version`` to the next (gradient mode)."""
        return self.lr if self.schedule is None else self.schedule.at(version)

    def make_optimizer(self, param: torch.nn.Parameter) -> torch.optim.Optimizer:
        """This mode's step rule over ``param`` (the slice)."""
        if self.mode == "gradient":
            return torch.optim.AdamW(
                [param], lr=self.lr, betas=self.betas, eps=self.eps, weight_decay=self.weight_decay
            )
        # DiLoCo's outer optimizer: SGD with Nesterov momentum on the pseudo-gradient as the gradient.
        nesterov = self.outer_momentum > 0  # torch refuses Nesterov without momentum
        return torch.optim.SGD([param], lr=self.outer_lr, momentum=self.outer_momentum, nesterov=nesterov)
