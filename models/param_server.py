"""A stage's parameter server: authoritative weights, AdamW state, versions, and checkpoints.

Workers compute gradients against the weights version they pulled (PipeDream-style: a
micro-batch's backward uses the weights its forward used) and push them with that version.
Each push is judged on arrival: a gradient computed ``s`` versions ago, with ``s`` over the
run's bound, is dropped or down-weighted by policy, and counted either way. Accepted pushes
are summed, weighted by the micro-batches each covers, until ``accumulate`` micro-batches are
in; then the server steps AdamW on their mean (asynchronous SGD over batches of the run's
size, whoever computed them) and makes a new version. Versions only grow. ``flush`` steps on
a partial batch, so that stopping never drops an accepted gradient.

Checkpoints hold weights, optimizer moments and the version, written atomically every
``checkpoint_every`` updates and on stop; a restarted server resumes from the last one.
This module computes; it knows no network (the daemon serves it to peers).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import safe_open

from swarmd.errors import SwarmdError
from swarmd.models.checkpoint import load_safetensors, save_safetensors_atomic

logger = logging.getLogger(__name__)

STALENESS_POLICIES = ("drop", "scale")


class GradientError(SwarmdError):
    """A pushed gradient does not match the stage's parameters (names, shapes) or is not finite."""


@dataclass(kw_only=True)
class ServerConfig:
    lr: float
    """AdamW learning rate."""
    weight_decay: float = 0.0
    """AdamW decoupled weight decay."""
    max_staleness: int = 4
    """Versions a gradient may lag behind the current weights and still be applied in full."""
    staleness_policy: str = "drop"
    """``drop`` refuses a too-stale gradient; ``scale`` applies it times 1 / (1 + excess)."""
    checkpoint_every: int = 50
    """Updates between checkpoints (and one more on stop)."""
    accumulate: int = 1
    """Micro-batches whose gradients make one update: pushes are summed until this many are in."""

    def __post_init__(self) -> None:
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ValueError(f"lr = {self.lr} must be a positive finite number")
        if self.max_staleness < 0:
            raise ValueError(f"max_staleness = {self.max_staleness} must be >= 0")
        if self.staleness_policy not in STALENESS_POLICIES:
            raise ValueError(f"staleness_policy = {self.staleness_policy!r} is not one of {STALENESS_POLICIES}")
        if self.accumulate < 1:
            raise ValueError(f"accumulate = {self.accumulate} must be >= 1")
        if self.checkpoint_every < 1:
            raise ValueError(f"checkpoint_every = {self.checkpoint_every} must be >= 1")


@dataclass
class ServerCounters:
    applied: int = 0
    """Pushes applied in full."""
    scaled: int = 0
    """Too-stale pushes applied down-weighted (policy ``scale``)."""
    dropped_stale: int = 0
    """Too-stale pushes refused (policy ``drop``)."""
    staleness_histogram: dict[int, int] = field(default_factory=dict)


@dataclass(frozen=True)
class PushResult:
    accepted: bool
    version: int
    """The version after this push (unchanged when dropped)."""
    staleness: int
    weight: float
    """The factor the gradient was applied with (0 when dropped)."""
    stepped: bool = False
    """Whether this push completed a batch and made a new version."""


def stage_checkpoint_name(stage: int) -> str:
    """The file a stage's server checkpoints to, inside the run's checkpoint folder."""
    return f"stage{stage}.safetensors"


def checkpoint_version(path: Path) -> int | None:
    """The version a server checkpoint holds, from its metadata alone (None: no readable file)."""
    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            return int((f.metadata() or {}).get("version", "0"))
    except Exception:
        return None


def checkpoint_log_seq(path: Path) -> int:
    """The number of pushes a server checkpoint's weights include (0: none, or no readable file)."""
    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            return int((f.metadata() or {}).get("log_seq", "0"))
    except Exception:
        return 0


def read_checkpoint_weights(path: Path) -> tuple[int, dict[str, torch.Tensor]]:
    """The version and weights a server checkpoint holds (for export; the moments stay behind)."""
    tensors, metadata = load_safetensors(path)
    weights = {key.split("/", 1)[1]: t for key, t in tensors.items() if key.startswith("weight/")}
    if not weights:
        raise GradientError(f"{path} holds no stage weights; is it a swarmd parameter-server checkpoint?")
    return int(metadata.get("version", "0")), weights


class StageParameterServer:
    def __init__(self, initial: dict[str, torch.Tensor], config: ServerConfig, checkpoint_path: Path | None) -> None:
        self.config = config
        self.checkpoint_path = checkpoint_path
        self.params = {name: torch.nn.Parameter(t.detach().clone().float()) for name, t in initial.items()}
        self.optimizer = torch.optim.AdamW(self.params.values(), lr=config.lr, weight_decay=config.weight_decay)
        self.version = 0
        self.counters = ServerCounters()
        self.metadata: dict[str, str] = {}
        """Strings the owner keeps with the weights (a data cursor): checkpointed and restored."""
        self._since_checkpoint = 0
        self._sum: dict[str, torch.Tensor] | None = None
        self._count = 0
        self.received = 0
        """Valid pushes so far (the sequence number of the last one)."""
        self.received_at_step = 0
        """``received`` at the last step: the pushes the weights include (a checkpoint's log_seq)."""
        if checkpoint_path is not None and checkpoint_path.exists():
            self._restore(checkpoint_path)

    # --- serving ---------------------------------------------------------------------------

    def weights(self) -> tuple[int, dict[str, torch.Tensor]]:
        """The current version and a copy of the weights (a worker keeps it for its backward)."""
        return self.version, {name: p.detach().clone() for name, p in self.params.items()}

    def validate(self, gradients: dict[str, torch.Tensor], base_version: int, micro_batches: int = 1) -> None:
        """Raise ``GradientError`` if ``push`` would refuse these (names, shapes, NaN, versions)."""
        self._check(gradients)
        if not 0 <= base_version <= self.version:
            raise GradientError(f"gradient claims weights version {base_version}; this server is at {self.version}")
        if not 1 <= micro_batches <= 1_000_000:
            raise GradientError(f"a push covers {micro_batches} micro-batches; must be at least 1")

    def push(self, gradients: dict[str, torch.Tensor], base_version: int, micro_batches: int = 1) -> PushResult:
        """Add the mean gradient of ``micro_batches`` micro-batches computed on weights
        ``base_version``, subject to the staleness bound; step once ``accumulate`` are in.

        Every valid push is numbered (``received``): replaying the pushes numbered after a
        checkpoint's ``log_seq``, in order, rebuilds this server's state exactly."""
        self.validate(gradients, base_version, micro_batches)
        self.received += 1
        staleness = self.version - base_version
        histogram = self.counters.staleness_histogram
        histogram[staleness] = histogram.get(staleness, 0) + 1
        excess = staleness - self.config.max_staleness
        if excess > 0 and self.config.staleness_policy == "drop":
            self.counters.dropped_stale += 1
            return PushResult(False, self.version, staleness, 0.0)
        weight = 1.0 / (1 + excess) if excess > 0 else 1.0
        if weight < 1.0:
            self.counters.scaled += 1
        else:
            self.counters.applied += 1
        factor = weight * micro_batches
        if self._sum is None:
            self._sum = {name: g.detach().to(torch.float32) * factor for name, g in gradients.items()}
        else:
            for name, g in gradients.items():
                self._sum[name].add_(g.detach().to(torch.float32), alpha=factor)
        self._count += micro_batches
        stepped = self._count >= self.config.accumulate
        if stepped:
            self._step()
        return PushResult(True, self.version, staleness, weight, stepped)

    @property
    def pending_micro_batches(self) -> int:
        """Micro-batches summed toward the next update."""
        return self._count

    def flush(self) -> bool:
        """Step on a partial batch (before a checkpoint on stop): no accepted gradient is lost."""
        if self._count == 0:
            return False
        self._step()
        return True

    def _step(self) -> None:
        assert self._sum is not None
        for name, param in self.params.items():
            param.grad = self._sum[name] / self._count
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self._sum, self._count = None, 0
        self.received_at_step = self.received
        self.version += 1
        self._since_checkpoint += 1
        if self.checkpoint_path is not None and self._since_checkpoint >= self.config.checkpoint_every:
            self.checkpoint()

    def _check(self, gradients: dict[str, torch.Tensor]) -> None:
        if set(gradients) != set(self.params):
            missing, extra = set(self.params) - set(gradients), set(gradients) - set(self.params)
            raise GradientError(
                f"gradient names do not match the stage: missing {sorted(missing)[:3]}, unknown {sorted(extra)[:3]}"
            )
        for name, grad in gradients.items():
            if grad.shape != self.params[name].shape:
                raise GradientError(
                    f"gradient {name} has shape {list(grad.shape)}; the parameter is {list(self.params[name].shape)}"
                )
            if not bool(torch.isfinite(grad).all()):
                raise GradientError(f"gradient {name} holds NaN or Inf; refused")

    # --- checkpoints -----------------------------------------------------------------------

    def checkpoint(self) -> Path | None:
        """Write weights, AdamW moments and the version atomically; returns the path."""
        if self.checkpoint_path is None:
            return None
        tensors: dict[str, torch.Tensor] = {}
        steps = []
        for name, param in self.params.items():
            tensors[f"weight/{name}"] = param.detach().contiguous()
            state = self.optimizer.state.get(param)
            if state:
                tensors[f"exp_avg/{name}"] = state["exp_avg"].contiguous()
                tensors[f"exp_avg_sq/{name}"] = state["exp_avg_sq"].contiguous()
                steps.append(float(state["step"]))
        metadata = {**self.metadata, "version": str(self.version), "adam_step": str(int(max(steps, default=0))),
                    "log_seq": str(self.received_at_step)}  # fmt: skip
        save_safetensors_atomic(tensors, self.checkpoint_path, metadata)
        self._since_checkpoint = 0
        logger.debug("Checkpointed version %d to %s", self.version, self.checkpoint_path)
        return self.checkpoint_path

    def _restore(self, path: Path) -> None:
        tensors, metadata = load_safetensors(path)
        names = {key.split("/", 1)[1] for key in tensors if key.startswith("weight/")}
        if names != set(self.params):
            raise GradientError(
                f"checkpoint {path} holds other parameters than this stage; move it away to start fresh"
            )
        step = int(metadata.get("adam_step", "0"))
        for name, param in self.params.items():
            with torch.no_grad():
                param.copy_(tensors[f"weight/{name}"])
            if f"exp_avg/{name}" in tensors and step > 0:
                self.optimizer.state[param] = {
                    "step": torch.tensor(float(step)),
                    "exp_avg": tensors[f"exp_avg/{name}"].clone(),
                    "exp_avg_sq": tensors[f"exp_avg_sq/{name}"].clone(),
                }
        self.version = int(metadata.get("version", "0"))
        self.received = self.received_at_step = int(metadata.get("log_seq", "0"))
        self.metadata = {k: v for k, v in metadata.items() if k not in ("version", "adam_step", "format", "log_seq")}
        logger.info("Resumed stage weights at version %d from %s", self.version, path)
