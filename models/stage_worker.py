"""What a worker computes for one stage: forward and backward tasks on a named weights version.

PipeDream's rule: a micro-batch's backward uses the weights its forward used. A forward task
runs on the newest weights the worker holds and records that version; the backward task for
the same micro-batch names it, and the worker recomputes the stage's forward on exactly those
weights (from the stage input the task carries) before back-propagating. Recomputing rather
than keeping activations is what lets any worker, not just the one that ran the forward, take
the backward, and what makes a vanished worker cost time, never data.

The last stage has no separate backward task: it computes the loss and back-propagates at
once. Parameter gradients accumulate over a configured number of micro-batches before they are
pushed, tagged with the oldest weights version they were computed on (the staleness the
parameter server judges).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch

from swarmd.models.build import ModelError
from swarmd.models.stages import StageModule


@dataclass(frozen=True)
class BackwardResult:
    grad_input: torch.Tensor | None
    """Gradient of the stage's input, for the previous stage's backward task (None on stage 0)."""
    loss: float | None
    """The micro-batch's loss (last stage only)."""


@dataclass(frozen=True)
class GradientPush:
    gradients: dict[str, torch.Tensor]
    """Mean parameter gradient over the accumulated micro-batches."""
    base_version: int
    """The oldest weights version any of them was computed on."""
    micro_batches: int


class StageWorker:
    def __init__(self, module: StageModule, *, keep_versions: int = 8, accumulate: int = 1) -> None:
        if keep_versions < 1 or accumulate < 1:
            raise ModelError(f"keep_versions {keep_versions} and accumulate {accumulate} must be >= 1")
        self.module = module
        self.keep_versions = keep_versions
        self.accumulate = accumulate
        self._versions: OrderedDict[int, dict[str, torch.Tensor]] = OrderedDict()
        self._loaded: int | None = None
        self._sum: dict[str, torch.Tensor] | None = None
        self._count = 0
        self._oldest: int | None = None

    # --- weights ---------------------------------------------------------------------------

    def add_weights(self, version: int, weights: dict[str, torch.Tensor]) -> None:
        """Keep ``weights`` (as pulled from the parameter server) for tasks that name ``version``."""
        own = set(self.module.state_dict())
        if set(weights) != own:
            raise ModelError(f"weights for version {version} do not match stage {self.module.stage}'s parameters")
        self._versions[version] = weights
        self._versions.move_to_end(version)
        while len(self._versions) > self.keep_versions:
            self._versions.popitem(last=False)

    def forget_versions(self) -> None:
        """Drop every kept weights version (the stage's server changed: its versions are another lineage)."""
        self._versions.clear()
        self._loaded = None

    @property
    def versions(self) -> list[int]:
        """The weights versions kept here."""
        return sorted(self._versions)

    @property
    def newest_version(self) -> int | None:
        return max(self._versions) if self._versions else None

    def has_version(self, version: int) -> bool:
        return version in self._versions

    def _use(self, version: int) -> None:
        if version not in self._versions:
            raise ModelError(
                f"stage {self.module.stage} holds weights versions {sorted(self._versions)}, not {version}; "
                "pull it from the parameter server first"
            )
        if self._loaded != version:
            self.module.load_state_dict(self._versions[version], strict=True)
            self._loaded = version

    # --- tasks -----------------------------------------------------------------------------

    def forward(self, x: torch.Tensor, version: int) -> torch.Tensor:
        """A forward task on a middle or first stage: the output for the next stage."""
        if self.module.is_last:
            raise ModelError("the last stage runs train_last() (loss and backward at once), not forward()")
        self._use(version)
        with torch.no_grad():
            return self.module(x)

    def backward(
        self, x: torch.Tensor, grad_output: torch.Tensor, version: int, *, accumulate: bool = True
    ) -> BackwardResult:
        """A backward task: recompute the forward on ``version``, back-propagate ``grad_output``.
        ``accumulate=False`` runs it for the input gradient only (the parameter gradient is not summed)."""
        if self.module.is_last:
            raise ModelError("the last stage runs train_last(), which includes its backward")
        self._use(version)
        x_in = self._input_for_grad(x)
        output = self.module(x_in)
        if output.shape != grad_output.shape:
            raise ModelError(f"output gradient has shape {tuple(grad_output.shape)}; output is {tuple(output.shape)}")
        output.backward(grad_output)
        return self._collect(x_in, version, loss=None, accumulate=accumulate)

    def train_last(
        self, x: torch.Tensor, labels: torch.Tensor, version: int, *, accumulate: bool = True
    ) -> BackwardResult:
        """The last stage's task: loss on ``labels`` (the micro-batch's token ids) and its backward."""
        if not self.module.is_last:
            raise ModelError(f"stage {self.module.stage} is not the last stage")
        self._use(version)
        x_in = self._input_for_grad(x)
        loss = self.module(x_in, labels=labels)
        loss.backward()
        return self._collect(x_in, version, loss=float(loss.detach()), accumulate=accumulate)

    def _input_for_grad(self, x: torch.Tensor) -> torch.Tensor:
        # Token ids (stage 0) take no gradient; hidden states do, for the previous stage.
        return x if self.module.is_first else x.detach().float().requires_grad_(True)

    def _collect(self, x_in: torch.Tensor, version: int, loss: float | None, accumulate: bool) -> BackwardResult:
        if accumulate:
            self._add_to_sum(version)
        self.module.zero_grad(set_to_none=True)
        if self.module.is_first:
            return BackwardResult(None, loss)
        assert x_in.grad is not None, "hidden-state inputs require grad"
        return BackwardResult(x_in.grad.detach(), loss)

    def _add_to_sum(self, version: int) -> None:
        grads = {name: p.grad for name, p in self.module.named_parameters() if p.grad is not None}
        if self._sum is None:
            self._sum = {name: g.detach().clone() for name, g in grads.items()}
        else:
            for name, g in grads.items():
                self._sum[name] += g
        self._count += 1
        self._oldest = version if self._oldest is None else min(self._oldest, version)

    # --- pushing ---------------------------------------------------------------------------

    def ready_to_push(self) -> bool:
        return self._count >= self.accumulate

    @property
    def accumulated(self) -> int:
        """Micro-batches in the gradient sum not yet pushed."""
        return self._count

    def discard(self) -> None:
        """Forget the accumulated gradient (its micro-batches will be recomputed elsewhere)."""
        self._sum, self._count, self._oldest = None, 0, None

    def take_push(self) -> GradientPush | None:
        """The accumulated mean gradient, and reset; None when nothing was accumulated."""
        if self._sum is None or self._oldest is None or self._count == 0:
            return None
        # Parameters that got no gradient (none in a causal LM stage) still need one to push.
        names = [name for name, _ in self.module.named_parameters()]
        mean = {name: (self._sum[name] / self._count) if name in self._sum else torch.zeros_like(p)
                for name, p in zip(names, self.module.parameters(), strict=True)}  # fmt: skip
        push = GradientPush(mean, self._oldest, self._count)
        self._sum, self._count, self._oldest = None, 0, None
        return push
