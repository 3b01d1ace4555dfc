"""A shard server's state: one slice of a stage's flattened parameters and its optimizer.

A stage's parameters, in ``named_parameters()`` order, flattened to one fp32 vector, are cut
into contiguous slices (``docs/data-path.md``); a :class:`ParameterShard` owns ``[lo, hi)`` of
it. AdamW and the outer Nesterov step are elementwise, so a slice is a complete optimizer of
its own: two shards stepping side by side equal one optimizer over the whole vector.

- **Contributions** (:meth:`ParameterShard.contribute`) are checked (length, finiteness, a
  norm bound against the running median of accepted norms: clipped to ``max_norm_factor``
  times it, as centred clipping does against outliers, and refused outright past
  ``refuse_norm_factor`` times it; honest gradients spike early in training, a bound that
  refused them dropped real work), then buffered as
  ``weight * micro_batches * vector``, with the micro-batches counted unweighted. The step
  divides the buffer by that count, so a stale contribution (weight below 1, the caller's
  staleness rule) shrinks the step rather than renormalising it (FedBuff's rule). The shard
  steps once the counted micro-batches reach ``step_micro_batches``.
- **Deltas** go to cells in fp16 with error feedback kept here: the authoritative weights
  become ``old + fp16(change + residual).float()`` exactly, and the residual keeps what fp16
  rounded off (or clipped) for the next step. A cell that adds the deltas in order holds these
  weights bit for bit; a standby that replays them on a checkpoint does too.
- **Share IDs** make contributions idempotent: one naming a share already applied or
  already buffered is acknowledged and not applied again (a recompute after a failure).
- **Confirmation.** An applied step is *committed* once the caller has logged it at the
  standby and says so (:meth:`ParameterShard.confirm`); pulls see committed versions only,
  so no cell ever holds weights that a failover could lose.

Pure torch, no network, not thread-safe: the daemon calls one shard from one thread at a time.
"""

from __future__ import annotations

import logging
import math
import statistics
from collections import OrderedDict, deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

import torch

from swarmd.errors import SwarmdError
from swarmd.models.checkpoint import load_safetensors, save_safetensors_atomic

logger = logging.getLogger(__name__)

MODES = ("gradient", "local")
FP16_MAX = float(torch.finfo(torch.float16).max)
MAX_SHARE_IDS_PER_CONTRIBUTION = 100_000
MAX_MICRO_BATCHES = 10_000_000
"""The most micro-batches one contribution may claim to cover."""
CHECKPOINT_FORMAT = "swarmd-parameter-shard-1"
_META_PREFIX = "caller."  # the caller's metadata keys, kept apart from the shard's own


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
    """AdamW learning rate (gradient mode)."""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW moment decay rates (gradient mode)."""
    eps: float = 1e-8
    """AdamW denominator guard (gradient mode)."""
    weight_decay: float = 0.0
    """AdamW decoupled weight decay (gradient mode)."""
    outer_lr: float = 0.7
    """Outer step size (local mode); the daemon passes the run's ``ExchangeConfig.outer_lr``."""
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

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode = {self.mode!r} is not one of {MODES}")
        for name in ("lr", "outer_lr", "eps", "max_norm_factor", "refuse_norm_factor"):
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


@dataclass
class ShardCounters:
    applied: int = 0
    """Contributions buffered toward a step (weight above 0)."""
    duplicates: int = 0
    """Contributions acknowledged and not applied: a share ID already buffered or applied."""
    dropped: int = 0
    """Contributions the caller weighted 0 (too stale): acknowledged, not applied."""
    refused: int = 0
    """Contributions refused with ContributionError (malformed, non-finite, absurdly large)."""
    clipped: int = 0
    """Contributions scaled down to the norm bound."""
    steps: int = 0
    """Optimizer steps taken here (replayed log entries not included)."""
    replayed: int = 0
    """Logged steps applied by apply_logged (a standby's replica)."""


class Outcome(StrEnum):
    BUFFERED = "buffered"
    DUPLICATE = "duplicate"
    DROPPED = "dropped"


@dataclass(frozen=True)
class ShardStep:
    """What a step made: the caller logs it at the standby, then calls ``confirm(version)``."""

    version: int
    delta: torch.Tensor
    """fp16, the slice's length: authoritative weights = previous + ``delta.float()``. Not to be modified."""
    share_ids: tuple[int, ...]
    """Every share ID settled since the previous step: the applied ones, and those acknowledged
    without being applied (duplicates' new IDs, dropped ones), so that a standby knows them all."""
    micro_batches: int
    """The micro-batches the step averaged over (unweighted)."""


@dataclass(frozen=True)
class ContributeResult:
    outcome: Outcome
    version: int
    """The shard's version after this contribution (a new one when it completed a step)."""
    step: ShardStep | None = None
    """The step this contribution completed, if it did."""


class ParameterShard:
    """Slice ``[lo, hi)`` of a stage's flat fp32 parameters, its optimizer, versions and deltas."""

    def __init__(
        self,
        lo: int,
        hi: int,
        initial: torch.Tensor,
        config: ShardConfig,
        *,
        step_micro_batches: int,
        version: int = 0,
    ) -> None:
        if not 0 <= lo < hi:
            raise ShardError(f"shard range [{lo}, {hi}) is empty or negative; need 0 <= lo < hi")
        if initial.dim() != 1 or initial.numel() != hi - lo or not initial.is_floating_point():
            raise ShardError(
                f"initial slice is {initial.dtype} {tuple(initial.shape)}; shard [{lo}, {hi}) needs a float "
                f"vector of {hi - lo} elements"
            )
        if not bool(torch.isfinite(initial).all()):
            raise ShardError(f"initial slice of shard [{lo}, {hi}) holds NaN or Inf")
        if version < 0:
            raise ShardError(f"version = {version} must be >= 0")
        self.lo, self.hi = lo, hi
        self.config = config
        self.step_micro_batches = step_micro_batches
        self.version = version
        """The newest applied version (committed or not)."""
        self.committed_version = version
        """The newest version logged at the standby: what pulls see."""
        self.counters = ShardCounters()
        self.metadata: dict[str, str] = {}
        """The caller's strings (the share ledger), restored by from_checkpoint."""
        self._param = torch.nn.Parameter(initial.detach().to(torch.float32).clone())
        self._optimizer = self._make_optimizer()
        self._residual = torch.zeros_like(self._param.data)
        self._sum = torch.zeros_like(self._param.data)
        self._count = 0
        self._buffered_ids: set[int] = set()
        self._settled_ids: list[int] = []  # acknowledged since the last step, to log with it
        # share ID -> the version that settled it (applied ones are committed at that version).
        self._done_ids: OrderedDict[int, int] = OrderedDict()
        self._history: deque[tuple[int, torch.Tensor]] = deque(maxlen=config.keep_versions)
        self._norms: deque[float] = deque(maxlen=config.norm_window)

    def _make_optimizer(self) -> torch.optim.Optimizer:
        c = self.config
        if c.mode == "gradient":
            return torch.optim.AdamW([self._param], lr=c.lr, betas=c.betas, eps=c.eps, weight_decay=c.weight_decay)
        # DiLoCo's outer optimizer: SGD with Nesterov momentum on the pseudo-gradient as the gradient.
        nesterov = c.outer_momentum > 0  # torch refuses Nesterov without momentum
        return torch.optim.SGD([self._param], lr=c.outer_lr, momentum=c.outer_momentum, nesterov=nesterov)

    # --- settings and status ---------------------------------------------------------------

    @property
    def step_micro_batches(self) -> int:
        """Counted micro-batches that make a step; a change takes effect at the next contribution."""
        return self._step_micro_batches

    @step_micro_batches.setter
    def step_micro_batches(self, value: int) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ShardError(f"step_micro_batches = {value!r} must be an integer >= 1")
        self._step_micro_batches = value

    @property
    def size(self) -> int:
        return self.hi - self.lo

    @property
    def buffered_micro_batches(self) -> int:
        """Micro-batches counted toward the next step."""
        return self._count

    # --- contributions ---------------------------------------------------------------------

    def contribute(
        self,
        vector: torch.Tensor,
        base_version: int,
        micro_batches: int,
        share_ids: Sequence[int],
        weight: float,
        *,
        parts: int = 1,
    ) -> ContributeResult:
        """Take one cell's contribution to this slice: its mean gradient or pseudo-gradient over
        ``micro_batches`` micro-batches computed on weights ``base_version``, for ``share_ids``,
        weighted ``weight`` (from the caller's staleness rule; 0 drops it).

        Raises ContributionError (nothing changes but ``counters.refused``) for a malformed
        contribution; returns DUPLICATE when a share ID is already buffered or applied (its new
        IDs, if any, are settled with it), DROPPED for weight 0 (its IDs settled), else BUFFERED,
        with the step when this one completed it. ``parts``: the cells' contributions this one
        sums (a reduction head's); such a sum is taken whole or refused (``overlap``)."""
        try:
            ids = self._check(vector, base_version, micro_batches, share_ids, weight)
        except ContributionError:
            self.counters.refused += 1
            raise
        if any(i in self._buffered_ids or i in self._done_ids for i in ids):
            if parts > 1:
                # A reduction head's sum, some of whose shares came in by themselves (a member
                # that gave up on its head): no part of a sum can be taken out, so none is
                # settled; the head sends the parts one by one.
                self.counters.refused += 1
                taken = [i for i in ids if i in self._buffered_ids or i in self._done_ids]
                raise ContributionError(
                    "overlap",
                    f"a sum of {parts} contributions names shares already taken here ({taken[:3]}); "
                    "send its parts one by one",
                )
            self.counters.duplicates += 1
            self._settle([i for i in ids if i not in self._buffered_ids and i not in self._done_ids])
            return ContributeResult(Outcome.DUPLICATE, self.version)
        vector = vector.detach().to(device=self._sum.device, dtype=torch.float32)
        norm = float(torch.linalg.vector_norm(vector))
        median = self._median_norm()
        if median is not None and norm > self.config.refuse_norm_factor * median:
            self.counters.refused += 1
            raise ContributionError(
                "norm",
                f"contribution norm {norm:.4g} exceeds {self.config.refuse_norm_factor:g} x the median of recent "
                f"accepted norms ({median:.4g}); refused (shares {ids[:3]})",
            )
        if median is not None and norm > self.config.max_norm_factor * median:
            bound = self.config.max_norm_factor * median
            vector = vector * (bound / norm)
            norm = bound
            self.counters.clipped += 1
        if weight == 0:
            self.counters.dropped += 1
            self._settle(ids)
            return ContributeResult(Outcome.DROPPED, self.version)
        self._sum.add_(vector, alpha=weight * micro_batches)
        self._count += micro_batches
        self._buffered_ids.update(ids)
        self._norms.append(norm)
        self.counters.applied += 1
        step = self._step() if self._count >= self._step_micro_batches else None
        return ContributeResult(Outcome.BUFFERED, self.version, step)

    def norm_bound(self) -> float | None:
        """The norm a contribution is clipped to now (None: too few seen to judge yet)."""
        median = self._median_norm()
        return None if median is None else self.config.max_norm_factor * median

    def _median_norm(self) -> float | None:
        if len(self._norms) < self.config.norm_warmup:
            return None
        return statistics.median(self._norms)

    def _check(
        self, vector: torch.Tensor, base_version: int, micro_batches: int, share_ids: Sequence[int], weight: float
    ) -> list[int]:
        if not isinstance(vector, torch.Tensor) or not vector.is_floating_point():
            kind = vector.dtype if isinstance(vector, torch.Tensor) else type(vector).__name__
            raise ContributionError("dtype", f"contribution is {kind}; send a float tensor")
        if vector.dim() != 1 or vector.numel() != self.size:
            raise ContributionError(
                "length",
                f"contribution has shape {tuple(vector.shape)}; shard [{self.lo}, {self.hi}) takes {self.size}",
            )
        if not bool(torch.isfinite(vector).all()):
            raise ContributionError("finite", f"contribution to shard [{self.lo}, {self.hi}) holds NaN or Inf; refused")
        if isinstance(base_version, bool) or not isinstance(base_version, int) or not 0 <= base_version <= self.version:
            raise ContributionError(
                "version", f"contribution claims base version {base_version!r}; this shard is at {self.version}"
            )
        if (
            isinstance(micro_batches, bool)
            or not isinstance(micro_batches, int)
            or not 1 <= micro_batches <= MAX_MICRO_BATCHES
        ):
            raise ContributionError(
                "micro_batches",
                f"contribution covers {micro_batches!r} micro-batches; the limit is 1 to {MAX_MICRO_BATCHES}",
            )
        ids = list(share_ids)
        if not 1 <= len(ids) <= MAX_SHARE_IDS_PER_CONTRIBUTION or len(set(ids)) != len(ids):
            raise ContributionError(
                "share_ids",
                f"contribution names {len(ids)} share IDs ({len(set(ids))} distinct); "
                f"name 1 to {MAX_SHARE_IDS_PER_CONTRIBUTION} distinct ones",
            )
        if any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in ids):
            raise ContributionError("share_ids", f"share IDs must be integers >= 0, got {ids[:5]}")
        if isinstance(weight, bool) or not isinstance(weight, int | float) or not 0 <= weight <= 1:  # and NaN
            raise ContributionError("weight", f"contribution weight {weight} must be in [0, 1]")
        return ids

    def _settle(self, ids: Iterable[int]) -> None:
        """Remember share IDs acknowledged without being applied: done now (nothing of theirs can
        be lost), and logged with the next step so that a standby knows them too."""
        for i in ids:
            self._settled_ids.append(i)
            self._remember(i, self.committed_version)

    def _remember(self, share_id: int, version: int) -> None:
        self._done_ids[share_id] = version
        self._done_ids.move_to_end(share_id)
        while len(self._done_ids) > self.config.recent_share_ids:
            self._done_ids.popitem(last=False)

    # --- steps -----------------------------------------------------------------------------

    def flush(self) -> ShardStep | None:
        """Step on a partial buffer (before a checkpoint on stop); None when nothing is buffered."""
        return self._step() if self._count > 0 else None

    def _step(self) -> ShardStep:
        counted = self._count
        old = self._param.detach().clone()
        self._param.grad = self._sum.div_(counted)
        self._optimizer.step()
        self._param.grad = None
        with torch.no_grad():
            # Error feedback: the residual takes the change, fp16 takes what it can represent
            # (clipped to its range), and the residual keeps the rest for the next step.
            self._residual.add_(self._param.detach() - old)
            delta = self._residual.clamp(-FP16_MAX, FP16_MAX).to(torch.float16)
            applied = delta.to(torch.float32)
            self._residual.sub_(applied)
            # old + applied, exactly the sum a cell computes when it adds the delta.
            self._param.copy_(old.add_(applied))
        self._sum.zero_()
        self._count = 0
        self.version += 1
        self.counters.steps += 1
        share_ids = (*self._settled_ids, *sorted(self._buffered_ids))
        for i in self._buffered_ids:
            self._remember(i, self.version)
        self._buffered_ids.clear()
        self._settled_ids = []
        self._history.append((self.version, delta))
        logger.debug("shard [%d, %d) stepped to %d over %d micro-batches", self.lo, self.hi, self.version, counted)
        return ShardStep(self.version, delta, share_ids, counted)

    def confirm(self, version: int) -> None:
        """Versions up to ``version`` are logged at the standby: pulls may now see them."""
        if version > self.version:
            raise ShardError(f"cannot confirm version {version}: shard [{self.lo}, {self.hi}) is at {self.version}")
        self.committed_version = max(self.committed_version, version)

    def apply_logged(self, version: int, delta: torch.Tensor, share_ids: Sequence[int]) -> bool:
        """A standby's replay of the holder's step ``version`` (its delta and share IDs), in order.

        Applies ``weights += delta.float()`` exactly and records the IDs as committed; a version
        this replica already holds (in its checkpoint) is skipped (False). The optimizer state
        stays as of the checkpoint: the weights are exact, the moments as old as the checkpoint."""
        if version <= self.version:
            return False
        if version != self.version + 1:
            raise ShardError(
                f"logged step {version} does not follow this replica's version {self.version}; "
                f"replay the log from {self.version + 1} on, or take a newer checkpoint"
            )
        if delta.dtype != torch.float16 or delta.dim() != 1 or delta.numel() != self.size:
            raise ShardError(
                f"logged delta is {delta.dtype} {tuple(delta.shape)}; shard [{self.lo}, {self.hi}) needs fp16 "
                f"of {self.size} elements"
            )
        if not bool(torch.isfinite(delta).all()):
            raise ShardError(f"logged delta for version {version} holds NaN or Inf")
        delta = delta.detach().to(self._param.device).clone()
        with torch.no_grad():
            self._param.add_(delta.to(torch.float32))
        self.version = self.committed_version = version
        for i in share_ids:
            self._remember(int(i), version)
        self._history.append((version, delta))
        self.counters.replayed += 1
        return True

    # --- serving ---------------------------------------------------------------------------

    def deltas_since(self, have: int) -> list[tuple[int, torch.Tensor]] | None:
        """The committed deltas after version ``have``, oldest first ([] when up to date), or None
        when they are not here to send: ``have`` older than the kept history, or newer than this
        shard's committed version (a lineage it does not know, e.g. after it restarted from an
        older checkpoint). Send ``weights()`` instead."""
        if have < 0:
            raise ShardError(f"a cell claims version {have}; versions start at 0")
        if have == self.committed_version:
            return []
        if have > self.committed_version or not self._history or self._history[0][0] > have + 1:
            return None
        return [(v, d) for v, d in self._history if have < v <= self.committed_version]

    def weights(self) -> tuple[int, torch.Tensor] | None:
        """The committed version and a copy of the fp32 slice; None while a newer step awaits
        ``confirm`` (the copy would hold weights a failover could lose: answer after it)."""
        if self.version != self.committed_version:
            return None
        return self.version, self._param.detach().clone()

    def committed(self, share_ids: Sequence[int]) -> set[int]:
        """Which of ``share_ids`` this shard is done with: applied in a committed step, or
        acknowledged without being applied (a duplicate's, a dropped one's)."""
        done = self._done_ids
        return {i for i in share_ids if i in done and done[i] <= self.committed_version}

    @property
    def residual(self) -> torch.Tensor:
        """A copy of what fp16 has not yet carried to the cells."""
        return self._residual.clone()

    # --- checkpoints -----------------------------------------------------------------------

    def checkpoint(self, path: str | Path, metadata: Mapping[str, str] | None = None) -> Path:
        """Write the slice's whole state atomically (safetensors); ``metadata`` (else ``self.metadata``)
        travels with it. Buffered contributions are not in it: ``flush()`` first when stopping."""
        path = Path(path)
        caller = dict(self.metadata if metadata is None else metadata)
        tensors = {"weights": self._param.detach(), "residual": self._residual}
        state = self._optimizer.state.get(self._param, {})
        step = 0
        if self.config.mode == "gradient" and state:
            tensors["exp_avg"], tensors["exp_avg_sq"] = state["exp_avg"], state["exp_avg_sq"]
            step = int(float(state["step"]))
        elif state.get("momentum_buffer") is not None:
            tensors["momentum"] = state["momentum_buffer"]
        tensors["share_ids"] = torch.tensor(list(self._done_ids), dtype=torch.int64)
        tensors["share_versions"] = torch.tensor(list(self._done_ids.values()), dtype=torch.int64)
        own = {
            "format": CHECKPOINT_FORMAT,
            "mode": self.config.mode,
            "lo": str(self.lo),
            "hi": str(self.hi),
            "version": str(self.version),
            "adam_step": str(step),
        }
        save_safetensors_atomic(tensors, path, {**own, **{_META_PREFIX + k: v for k, v in caller.items()}})
        return path

    @classmethod
    def from_checkpoint(
        cls,
        path: str | Path,
        config: ShardConfig,
        *,
        step_micro_batches: int,
        expected_range: tuple[int, int] | None = None,
    ) -> ParameterShard:
        """The shard a checkpoint holds, every version in it committed; refuses one of another
        mode or (with ``expected_range``) another slice. The caller's metadata is in ``.metadata``."""
        tensors, meta = load_safetensors(path)
        if meta.get("format") != CHECKPOINT_FORMAT:
            raise ShardError(f"{path} is not a parameter-shard checkpoint (format {meta.get('format')!r})")
        lo, hi = int(meta["lo"]), int(meta["hi"])
        if expected_range is not None and (lo, hi) != tuple(expected_range):
            raise ShardError(f"{path} holds shard [{lo}, {hi}); expected [{expected_range[0]}, {expected_range[1]})")
        if meta.get("mode") != config.mode:
            raise ShardError(f"{path} holds a {meta.get('mode')}-mode shard; this run's shards are {config.mode}")
        version = int(meta["version"])
        shard = cls(lo, hi, tensors["weights"], config, step_micro_batches=step_micro_batches, version=version)
        shard._restore_state(tensors, int(meta.get("adam_step", "0")))
        shard.metadata = {k[len(_META_PREFIX) :]: v for k, v in meta.items() if k.startswith(_META_PREFIX)}
        logger.info("restored shard [%d, %d) at version %d from %s", lo, hi, shard.version, path)
        return shard

    def _restore_state(self, tensors: Mapping[str, torch.Tensor], adam_step: int) -> None:
        residual = tensors["residual"]
        if residual.shape != self._residual.shape or not bool(torch.isfinite(residual).all()):
            raise ShardError(f"checkpointed residual {tuple(residual.shape)} does not fit shard of {self.size}")
        self._residual.copy_(residual)
        if "exp_avg" in tensors and adam_step > 0:
            self._optimizer.state[self._param] = {
                "step": torch.tensor(float(adam_step)),
                "exp_avg": tensors["exp_avg"].clone(),
                "exp_avg_sq": tensors["exp_avg_sq"].clone(),
            }
        elif "momentum" in tensors:
            self._optimizer.state[self._param] = {"momentum_buffer": tensors["momentum"].clone()}
        for i, v in zip(tensors["share_ids"].tolist(), tensors["share_versions"].tolist(), strict=True):
            self._remember(int(i), min(int(v), self.version))
