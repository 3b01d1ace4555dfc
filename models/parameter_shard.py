"""A shard server's state: one slice of a stage's flattened parameters and its optimizer.

A stage's parameters, in ``named_parameters()`` order, flattened to one fp32 vector, are cut
into contiguous slices (``docs/data-path.md``); a :class:`ParameterShard` owns ``[lo, hi)`` of
it. AdamW and the outer Nesterov step are elementwise, so a slice is a complete optimizer of
its own: two shards stepping side by side equal one optimizer over the whole vector.

- **Contributions** (:meth:`ParameterShard.contribute`) are checked, and clipped or refused
  past a norm bound (``shard_contribution``); with ``aggregation = "centred-clip"`` their
  difference from the previous aggregate is clipped too (``robust_aggregation``). Then they
  are buffered as ``weight * micro_batches * vector``, with the micro-batches counted
  unweighted. The step divides the buffer by that count, so a stale contribution (weight
  below 1, the caller's staleness rule) shrinks the step rather than renormalising it
  (FedBuff's rule). The shard steps once the counted micro-batches reach
  ``step_micro_batches``.
- **Deltas** go to cells in fp16 with error feedback kept here (``shard_deltas``): a cell that
  adds them in order holds the shard's weights bit for bit.
- **Share IDs** make contributions idempotent (``shard_share_ids``): one naming only shares
  already applied or buffered is not applied again (DUPLICATE: the server refuses it
  ``AlreadyApplied``, a recompute after a failure and a replay alike); one naming some taken and
  some not is refused whole (``overlap``), and settles nothing: an ID is done here only when its
  own contribution is applied (or dropped as stale), never because another named it.
- **Confirmation.** An applied step is *committed* once the caller has logged it at the
  standby and says so (:meth:`ParameterShard.confirm`); pulls see committed versions only,
  so no cell ever holds weights that a failover could lose.
- **A non-finite step is undone.** Checked contributions can still make a step that is not
  finite (an optimizer overflow, an lr blow-up, a bug). Such a step is never returned, so it is
  never logged, served or replicated: the weights, the optimizer state, the fp16 residual and
  the centre are put back as they were (``_StepUndo``), the version stays, and the round's
  buffered shares are forgotten (neither buffered nor done), so a pull reports them
  ``unknown`` and their cells send them again: no share is lost, and none counted done.

Pure torch, no network, not thread-safe: the daemon calls one shard from one thread at a time.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

import torch

from swarmd.models.robust_aggregation import CentredClip
from swarmd.models.shard_checkpoint import ShardCheckpoint, write_shard_checkpoint
from swarmd.models.shard_config import ContributionError, ShardConfig, ShardError
from swarmd.models.shard_contribution import NormBound, check_contribution
from swarmd.models.shard_deltas import DeltaLog
from swarmd.models.shard_share_ids import ShardShareIds

logger = logging.getLogger(__name__)


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
    refused_by: dict[str, int] = field(default_factory=dict)
    """The refusals by ``ContributionError.reason`` (``finite``, ``norm``, ...)."""
    clipped: int = 0
    """Contributions scaled down to the norm bound."""
    centre_clipped: int = 0
    """Contributions whose distance from the centre was clipped (centred clipping only)."""
    steps: int = 0
    """Optimizer steps taken here (replayed log entries not included)."""
    replayed: int = 0
    """Logged steps applied by apply_logged (a standby's replica)."""
    dropped_steps: int = 0
    """Steps that came out non-finite and were undone: their shares are sent again."""


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
    without being applied (dropped as stale), so that a standby knows them all."""
    micro_batches: int
    """The micro-batches the step averaged over (unweighted)."""


@dataclass(frozen=True)
class ContributeResult:
    outcome: Outcome
    version: int
    """The shard's version after this contribution (a new one when it completed a step)."""
    step: ShardStep | None = None
    """The step this contribution completed, if it did."""


def _all_finite(x: torch.Tensor) -> bool:
    # A sum is NaN or infinite whenever an element is, so a finite sum settles it in one cheap
    # pass; only a sum that overflowed from finite elements needs the elementwise check.
    return bool(torch.isfinite(x.sum())) or bool(torch.isfinite(x).all())


@dataclass
class _StepUndo:
    """What a step changes, as it was before it: enough to put a non-finite step back exactly.
    The weights copy is the one the delta is taken against anyway; the optimizer state's tensors
    (AdamW's moments and step count, or the outer step's momentum) and the residual are copied,
    the centre only referenced (``recentre`` replaces it rather than writing into it)."""

    weights: torch.Tensor
    optimizer_state: dict[str, Any]
    residual: torch.Tensor
    centre: torch.Tensor | None

    @classmethod
    def take(
        cls, param: torch.nn.Parameter, optimizer: torch.optim.Optimizer, deltas: DeltaLog, centred: CentredClip | None
    ) -> _StepUndo:
        state = optimizer.state.get(param, {})
        return cls(
            weights=param.detach().clone(),
            optimizer_state={k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in state.items()},
            residual=deltas.residual,  # already a copy
            centre=None if centred is None else centred.centre,
        )

    def restore(
        self, param: torch.nn.Parameter, optimizer: torch.optim.Optimizer, deltas: DeltaLog, centred: CentredClip | None
    ) -> None:
        with torch.no_grad():
            param.copy_(self.weights)
        if self.optimizer_state:
            optimizer.state[param] = self.optimizer_state
        else:  # the first step: the optimizer initialises its state afresh next time
            optimizer.state.pop(param, None)
        deltas.restore_residual(self.residual)
        if centred is not None and self.centre is not None:
            centred.centre = self.centre


def _centred_clip(config: ShardConfig, size: int) -> CentredClip | None:
    """The centred clip's state for an aggregation that clips around the last aggregate, else None."""
    if config.aggregation != "centred-clip":
        return None
    return CentredClip(size, config.clip_radius_factor, config.norm_window, config.norm_warmup)


def _warn_dropped(shard: ParameterShard, counted: int, forgotten: int) -> None:
    logger.warning(
        "shard [%d, %d): the step to version %d over %d micro-batches came out NaN or Inf; undone "
        "(weights and optimizer state as at version %d, nothing logged or served) and its %d share(s) "
        "given back for their cells to send again (%d such step(s) so far)",
        shard.lo,
        shard.hi,
        shard.version + 1,
        counted,
        shard.version,
        forgotten,
        shard.counters.dropped_steps,
    )


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
        self._optimizer = config.make_optimizer(self._param)
        self._deltas = DeltaLog(self._param.data, config.keep_versions)
        self._sum = torch.zeros_like(self._param.data)
        self._count = 0
        self._share_ids = ShardShareIds(config.recent_share_ids)
        self._norms = NormBound(config)
        self._centred = _centred_clip(config, hi - lo)

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
        sender: str = "",
    ) -> ContributeResult:
        """Take one cell's contribution to this slice: its mean gradient or pseudo-gradient over
        ``micro_batches`` micro-batches computed on weights ``base_version``, for ``share_ids``,
        weighted ``weight`` (from the caller's staleness rule; 0 drops it).

        Raises ContributionError (nothing changes but ``counters.refused``) for a malformed
        contribution, and for one whose shares are partly taken here (``overlap``: nothing of it
        is settled); returns DUPLICATE when every share ID is already buffered or applied,
        DROPPED for weight 0 (its IDs settled), else BUFFERED, with the step when this one
        completed it. ``parts``: the cells' contributions this one sums (a reduction head's).
        ``sender``:
        who sent it, so that each sender has one vote in the adaptive bounds (``VoteMedian``)."""
        # Every refusal, whichever check makes it, is counted here and nowhere else.
        try:
            ids = check_contribution(
                vector, base_version, micro_batches, share_ids, weight, lo=self.lo, hi=self.hi, version=self.version
            )
            if taken := self._share_ids.taken(ids):
                if len(taken) < len(ids):
                    # Some of its shares are in and some are not: a reduction head's sum some of
                    # whose parts came in by themselves (a member that gave up on its head; the
                    # head then sends the parts one by one), or a round with a share issued again
                    # that another pipeline trained first. Nothing of it is applied, and none of
                    # its fresh IDs is settled: a share is done here only once its own
                    # contribution is applied, so naming another's shares cannot mark them done.
                    raise ContributionError(
                        "overlap",
                        f"a contribution of {parts} part(s) names {len(taken)} share(s) already taken here "
                        f"({taken[:3]}) and {len(ids) - len(taken)} not; a sum's parts go one by one",
                    )
                self.counters.duplicates += 1
                return ContributeResult(Outcome.DUPLICATE, self.version)
            vector = vector.detach().to(device=self._sum.device, dtype=torch.float32)
            vector, norm, clipped = self._norms.screen(vector, ids)
            if weight == 0:
                self.counters.dropped += 1
                self._share_ids.settle(ids, self.committed_version)
                return ContributeResult(Outcome.DROPPED, self.version)
            self.counters.clipped += clipped
            if self._centred is not None:
                vector, centre_clipped = self._centred.clip(vector, sender)
                self.counters.centre_clipped += centre_clipped
            self._sum.add_(vector, alpha=weight * micro_batches)
            self._count += micro_batches
            self._share_ids.buffer(ids)
            self._norms.accept(sender, norm)
            self.counters.applied += 1
        except ContributionError as e:
            self.counters.refused += 1
            self.counters.refused_by[e.reason] = self.counters.refused_by.get(e.reason, 0) + 1
            raise
        step = self._step() if self._count >= self._step_micro_batches else None
        return ContributeResult(Outcome.BUFFERED, self.version, step)

    def norm_bound(self) -> float | None:
        """The norm a contribution is clipped to now (None: too few seen to judge yet)."""
        return self._norms.bound()

    def clip_radius(self) -> float | None:
        """Centred clipping's radius now (None: not centred clipping, or too few seen yet)."""
        return None if self._centred is None else self._centred.radius()

    def distrusted(self) -> dict[str, float]:
        """Senders centred clipping weighs down for pointing against the others, and the weight
        each gets (``SenderTrust``); empty for the mean."""
        return {} if self._centred is None else self._centred.trust.distrusted()

    # --- steps -----------------------------------------------------------------------------

    def flush(self) -> ShardStep | None:
        """Step on a partial buffer (before a checkpoint on stop); None when nothing is buffered
        or the step came out non-finite (undone, ``counters.dropped_steps``)."""
        return self._step() if self._count > 0 else None

    def unknown(self, share_ids: Sequence[int]) -> list[int]:
        """Those of ``share_ids`` this shard neither buffers nor is done with: never seen here,
        or given back by a dropped step. Their cells send them again."""
        return self._share_ids.fresh(share_ids)

    def given_back(self, share_ids: Sequence[int]) -> dict[int, int]:
        """Those of ``share_ids`` a dropped step gave back, not sent again since (``ShardShareIds``)."""
        return self._share_ids.given_back(share_ids)

    def _step(self) -> ShardStep | None:
        """Step on the buffer; None (everything as before the step, the buffer's shares
        forgotten) when the result is not finite."""
        counted = self._count
        undo = _StepUndo.take(self._param, self._optimizer, self._deltas, self._centred)
        self._param.grad = self._sum.div_(counted)
        if self._centred is not None:
            self._centred.recentre(self._param.grad)
        if self.config.mode == "gradient":
            for group in self._optimizer.param_groups:  # every peer derives it from the version alone
                group["lr"] = self.config.lr_at(self.version)
        self._optimizer.step()
        self._param.grad = None
        with torch.no_grad():
            finite = _all_finite(self._param)
            if finite:
                delta = self._deltas.encode(self._param.detach() - undo.weights)
                # old + the delta, exactly the sum a cell computes when it adds the delta.
                self._param.copy_(undo.weights).add_(delta.to(torch.float32))
                # The residual overflows where the change is finite but near fp32's range.
                finite = _all_finite(self._param) and _all_finite(self._deltas.residual)
        self._sum.zero_()
        self._count = 0
        if not finite:
            undo.restore(self._param, self._optimizer, self._deltas, self._centred)
            self.counters.dropped_steps += 1
            _warn_dropped(self, counted, self._share_ids.forget_buffered(self.counters.dropped_steps))
            return None
        self.version += 1
        self.counters.steps += 1
        share_ids = self._share_ids.close_step(self.version)
        self._deltas.record(self.version, delta)
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
            self._share_ids.remember(int(i), version)
        self._deltas.record(version, delta)
        self.counters.replayed += 1
        return True

    # --- serving ---------------------------------------------------------------------------

    def deltas_since(self, have: int) -> list[tuple[int, torch.Tensor]] | None:
        """The committed deltas after version ``have``, oldest first ([] when up to date), or None
        when they are not here to send: ``have`` older than the kept history, or newer than this
        shard's committed version (a lineage it does not know, e.g. after it restarted from an
        older checkpoint). Send ``weights()`` instead."""
        return self._deltas.since(have, self.committed_version)

    def weights(self) -> tuple[int, torch.Tensor] | None:
        """The committed version and a copy of the fp32 slice; None while a newer step awaits
        ``confirm`` (the copy would hold weights a failover could lose: answer after it)."""
        if self.version != self.committed_version:
            return None
        return self.version, self._param.detach().clone()

    def committed(self, share_ids: Sequence[int]) -> set[int]:
        """Which of ``share_ids`` this shard is done with: applied in a committed step, or
        acknowledged without being applied (dropped as too stale)."""
        return self._share_ids.committed(share_ids, self.committed_version)

    @property
    def residual(self) -> torch.Tensor:
        """A copy of what fp16 has not yet carried to the cells."""
        return self._deltas.residual

    # --- checkpoints -----------------------------------------------------------------------

    def checkpoint(self, path: str | Path, metadata: Mapping[str, str] | None = None) -> Path:
        """Write the slice's whole state atomically (safetensors); ``metadata`` (else ``self.metadata``)
        travels with it. Buffered contributions are not in it: ``flush()`` first when stopping."""
        path = Path(path)
        write_shard_checkpoint(
            path,
            span=(self.lo, self.hi),
            mode=self.config.mode,
            version=self.version,
            weights=self._param.detach(),
            residual=self._deltas.residual,
            optimizer_state=self._optimizer.state.get(self._param, {}),
            done=self._share_ids.done,
            caller=dict(self.metadata if metadata is None else metadata),
        )
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
        saved = ShardCheckpoint.read(path, config.mode, expected_range)
        lo, hi = saved.span
        shard = cls(lo, hi, saved.weights, config, step_micro_batches=step_micro_batches, version=saved.version)
        optimizer_state = saved.optimizer_state()
        shard._deltas.restore_residual(saved.tensors["residual"])
        if optimizer_state:
            shard._optimizer.state[shard._param] = optimizer_state
        for share_id, version in saved.done():
            shard._share_ids.remember(share_id, min(version, shard.version))
        shard.metadata = saved.caller_metadata()
        logger.info("restored shard [%d, %d) at version %d from %s", lo, hi, shard.version, path)
        return shard
