"""A cell's compute for one stage: forwards that keep their graphs, backwards, shares, rounds.

A cell ``(p, s)`` runs stage ``s`` of pipeline ``p`` (``docs/data-path.md``). Its weights, in
``named_parameters()`` order, flattened to one fp32 vector, are the stage's vector that the
shards slice (``flatten_parameters``; shard ``k`` owns ``[lo, hi)`` of it, and a contribution is
cut the same way). Within a **share** a cell keeps the autograd graph of each micro-batch it
forwarded (at most ``window`` at once) until that micro-batch's gradient comes back: nothing
is recomputed unless lost. At the end of a share, gradient mode (H = 1) adds the share's
parameter gradient to the round's sum; local mode (H > 1) takes one inner AdamW step on the
cell's local copy. At the end of a **round**, :meth:`CellCompute.contribution` gives the mean
gradient or the pseudo-gradient (round base minus local weights), once per round.

The cell computes on ``settings.device`` (``precision.ComputeSettings``): its module, the global
copy, the round's sum or base and the inner AdamW's state live there, in fp32; the forward runs
under bf16 autocast when ``settings.dtype`` is "bf16" (its backward follows the forward's
dtypes, and the parameters' gradients are fp32). Tensors come in from the wire and go back out
in host memory: this class moves them (``precision.to_device`` / ``to_host``), so its callers
never see the device.

The cell also tracks the **global** weights, the servers' authoritative ones, bit for bit:
``apply_deltas`` adds each shard's fp16 deltas in order exactly as the shard did, and
``rebase`` takes them up between shares (gradient mode: the cell's weights become them; local
mode: ``local = global + (local - round_base)``, so that progress made since the base is kept).

The inner AdamW's moments are kept across rounds and rebases (DiLoCo's workers do the same):
they describe the gradients' scale, which a rebase barely moves, and starting them afresh each
round would redo Adam's bias-corrected warm-up every H steps.

Not thread-safe: the daemon calls a cell from one worker thread at a time.
"""

from __future__ import annotations

import itertools
import logging
from collections import OrderedDict
from collections.abc import Sequence

import torch
from torch import nn

from swarmd.models.build import ModelError
from swarmd.models.lr_schedule import LrSchedule
from swarmd.models.precision import ComputeSettings, start_device, to_device, to_host
from swarmd.models.stages import StageModule

logger = logging.getLogger(__name__)

MODES = ("gradient", "local")


def parameter_views(module: nn.Module, vector: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
    """``vector`` (a stage's flat parameters) cut into views shaped like ``module``'s parameters,
    named and in ``named_parameters()`` order: the order every shard's slice assumes."""
    params = list(module.named_parameters())
    total = sum(p.numel() for _, p in params)
    if vector.dim() != 1 or vector.numel() != total:
        raise ModelError(f"a flat vector of {tuple(vector.shape)} does not fit a stage of {total} parameters")
    views, offset = [], 0
    for name, p in params:
        views.append((name, vector[offset : offset + p.numel()].view(p.shape)))
        offset += p.numel()
    return views


def flatten_parameters(module: nn.Module) -> torch.Tensor:
    """A stage's parameters as one fp32 vector, in ``named_parameters()`` order (a copy)."""
    return torch.cat([p.detach().to(torch.float32).reshape(-1) for p in module.parameters()])


def unflatten_parameters(module: nn.Module, vector: torch.Tensor) -> dict[str, torch.Tensor]:
    """A stage's flat vector as a state dict of ``module``'s names and shapes (for export)."""
    return {name: view.clone() for name, view in parameter_views(module, vector)}


class CellCompute:
    """One stage's compute on a cell: micro-batches, shares and rounds, and the global copy."""

    def __init__(
        self,
        module: StageModule,
        *,
        mode: str,
        window: int,
        lr: float,
        weight_decay: float = 0.0,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        schedule: LrSchedule | None = None,
        settings: ComputeSettings | None = None,
    ) -> None:
        if mode not in MODES:
            raise ModelError(f"mode {mode!r} is not one of {MODES}")
        if window < 1:
            raise ModelError(f"window {window} must be >= 1 micro-batch in flight")
        self.settings = settings = settings or ComputeSettings()
        self.device = settings.torch_device
        start_device(self.device)
        self.module = module.to(self.device)
        module.set_layer_options(checkpointing=settings.checkpointing, compile=settings.compile)
        self.mode = mode
        self.schedule = schedule
        """The inner steps' rates (local mode; gradient mode's steps are the servers')."""
        self.window = window
        self._params = [p for _, p in module.named_parameters()]
        self._global = flatten_parameters(module)
        self.size = self._global.numel()
        """P_s: the elements of the stage's flat vector."""
        # Gradient mode sums the round's gradients; local mode keeps the round's base weights
        # and steps AdamW on the module's parameters, which are its local copy.
        self._sum = torch.zeros_like(self._global) if mode == "gradient" else None
        self._base = self._global.clone() if mode == "local" else None
        # The fused CUDA kernel steps every parameter in one launch (its numbers are AdamW's).
        fused = True if self.device.type == "cuda" else None
        self._inner = (
            torch.optim.AdamW(self._params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, fused=fused)
            if mode == "local"
            else None
        )
        self._graphs: OrderedDict[int, tuple[torch.Tensor, torch.Tensor]] = OrderedDict()
        self._share_done: set[int] = set()
        self._round_micro_batches = 0

    # --- weights ---------------------------------------------------------------------------

    def flat(self) -> torch.Tensor:
        """The weights this cell computes with (its local copy in local mode), flattened: a copy
        in host memory."""
        return to_host(flatten_parameters(self.module))

    @property
    def global_vector(self) -> torch.Tensor:
        """A copy, in host memory, of the global weights as the deltas applied so far make them."""
        return self._global.to("cpu", copy=True)

    def load_flat(self, vector: torch.Tensor) -> None:
        """Start over from ``vector`` (a new lineage: the seed, or every shard's whole slice): the
        global copy, the round base and the weights become it, and the round so far is dropped."""
        self._require_between_shares("load_flat")
        self._global = to_device(self._checked_flat(vector), self.device).clone()
        self._load(self._global)
        if self._base is not None:
            self._base = self._global.clone()
        if self._sum is not None:
            self._sum.zero_()
        self._round_micro_batches = 0

    def apply_deltas(self, lo: int, deltas: Sequence[tuple[int, torch.Tensor]]) -> None:
        """Add a shard's fp16 deltas (``deltas_since``'s answer, versions consecutive) to the global
        copy from element ``lo`` on, in order: the exact sums the shard made. Safe mid-share (the
        weights in use change only at ``rebase``)."""
        versions = [v for v, _ in deltas]
        if any(b != a + 1 for a, b in itertools.pairwise(versions)):
            raise ModelError(f"deltas for versions {versions[:8]} are not consecutive; pull them again")
        for version, delta in deltas:
            if delta.dtype != torch.float16 or delta.dim() != 1 or not 0 <= lo <= self.size - delta.numel():
                raise ModelError(
                    f"delta for version {version} is {delta.dtype} {tuple(delta.shape)} at {lo}; a stage of "
                    f"{self.size} takes fp16 slices within it"
                )
            if not bool(torch.isfinite(delta).all()):
                raise ModelError(f"delta for version {version} at {lo} holds NaN or Inf; refused")
        # fp16 to fp32 is exact and an fp32 add rounds alike on every IEEE device (no fused
        # multiply-add here): the sums are the shard's to the bit, on the CPU or a GPU.
        for _, delta in deltas:
            self._global[lo : lo + delta.numel()] += to_device(delta, self.device).to(torch.float32)

    def load_global(self, lo: int, weights: torch.Tensor) -> None:
        """Set the global copy's slice from ``lo`` to a shard's whole fp32 slice (``weights()``)."""
        if weights.dim() != 1 or not 0 <= lo <= self.size - weights.numel() or not weights.is_floating_point():
            raise ModelError(f"a slice of {weights.dtype} {tuple(weights.shape)} at {lo} does not fit {self.size}")
        if not bool(torch.isfinite(weights).all()):
            raise ModelError(f"the slice at {lo} holds NaN or Inf; refused")
        self._global[lo : lo + weights.numel()] = to_device(weights, self.device).to(torch.float32)

    def rebase(self) -> None:
        """Take up the global copy between shares: gradient mode, the weights become it; local mode,
        ``local = global + (local - round_base)`` and ``round_base = global``."""
        self._require_between_shares("rebase")
        if self._base is None:
            self._load(self._global)
            return
        local = flatten_parameters(self.module)
        local.sub_(self._base).add_(self._global)
        self._load(local)
        self._base = self._global.clone()

    # --- micro-batches ---------------------------------------------------------------------

    def forward(self, micro_batch: int, x: torch.Tensor) -> torch.Tensor:
        """Run a first or middle stage on ``x`` and keep the graph for ``backward``; returns the
        output (detached) for the next cell."""
        if self.module.is_last:
            raise ModelError("the last stage runs forward_backward_last() (loss and backward at once)")
        self._check_new(micro_batch)
        if len(self._graphs) >= self.window:
            raise ModelError(
                f"stage {self.module.stage} already holds {len(self._graphs)} micro-batches in flight, its window; "
                f"run a backward first"
            )
        x_in = self._input(x)
        with self.settings.autocast():
            output = self.module(x_in)
        self._graphs[micro_batch] = (x_in, output)
        return to_host(output)

    def backward(self, micro_batch: int, grad_output: torch.Tensor) -> torch.Tensor | None:
        """Back-propagate the next cell's gradient through ``micro_batch``'s kept graph; the
        parameter gradient joins the share's. Returns the input's gradient (None on stage 0)."""
        kept = self._graphs.get(micro_batch)
        if kept is None:
            raise ModelError(
                f"stage {self.module.stage} holds no forward of micro-batch {micro_batch} "
                f"(in flight: {list(self._graphs)[:8]}); run forward() again"
            )
        x_in, output = kept
        if grad_output.shape != output.shape or not grad_output.is_floating_point():
            raise ModelError(
                f"output gradient is {grad_output.dtype} {tuple(grad_output.shape)}; output is {tuple(output.shape)}"
            )
        if not bool(torch.isfinite(grad_output).all()):
            raise ModelError(f"output gradient of micro-batch {micro_batch} holds NaN or Inf; refused")
        del self._graphs[micro_batch]
        # Outside autocast, as torch advises: the backward runs in the dtypes the forward chose.
        output.backward(to_device(grad_output, self.device).to(output.dtype))
        self._share_done.add(micro_batch)
        return None if self.module.is_first else self._grad_of(x_in)

    def forward_backward_last(
        self, micro_batch: int, x: torch.Tensor, labels: torch.Tensor
    ) -> tuple[torch.Tensor | None, float]:
        """The last stage: loss on ``labels`` (the micro-batch's token ids) and its backward at
        once. Returns the input's gradient (None when this is also stage 0) and the loss."""
        if not self.module.is_last:
            raise ModelError(f"stage {self.module.stage} is not the last stage; use forward() and backward()")
        self._check_new(micro_batch)
        if labels.dtype != torch.long or tuple(labels.shape) != tuple(x.shape[:2]):
            raise ModelError(f"labels are {labels.dtype} {tuple(labels.shape)}; need long {tuple(x.shape[:2])}")
        x_in = self._input(x)
        with self.settings.autocast():
            loss = self.module(x_in, labels=to_device(labels, self.device))
        loss.backward()
        self._share_done.add(micro_batch)
        grad = None if self.module.is_first else self._grad_of(x_in)
        return grad, float(loss.detach())

    def drop(self, micro_batch: int) -> bool:
        """Free ``micro_batch``'s kept graph (its gradient will not come); False if none was kept.
        A micro-batch whose backward has run is in the share's gradient: drop the share instead."""
        return self._graphs.pop(micro_batch, None) is not None

    def drop_share(self) -> int:
        """Abandon the share in flight: its graphs and its partial gradient go (the round's earlier
        shares stay). Returns the micro-batches whose work was thrown away."""
        lost = len(self._graphs) + len(self._share_done)
        self._graphs.clear()
        self._share_done.clear()
        self.module.zero_grad(set_to_none=True)
        if lost:
            logger.debug("stage %d dropped a share of %d micro-batches", self.module.stage, lost)
        return lost

    @property
    def in_flight(self) -> list[int]:
        """Micro-batches whose graphs are kept, waiting for their gradient."""
        return list(self._graphs)

    @property
    def share_micro_batches(self) -> int:
        """Micro-batches of the share in flight whose backward has run."""
        return len(self._share_done)

    @property
    def round_micro_batches(self) -> int:
        """Micro-batches of the round's ended shares: what the next contribution covers."""
        return self._round_micro_batches

    # --- shares and rounds -----------------------------------------------------------------

    def end_share(self, inner_step: int | None = None) -> int:
        """Close the share whose backwards have all run: gradient mode adds its gradient to the
        round's sum; local mode takes one inner AdamW step on its mean gradient, at the
        schedule's rate for ``inner_step`` (the swarm's inner steps before this one) when both
        are given, else at ``lr``. Returns its micro-batches."""
        if self._graphs:
            raise ModelError(f"micro-batches {list(self._graphs)[:8]} still wait for their backward; the share is open")
        count = len(self._share_done)
        if count == 0:
            raise ModelError(f"stage {self.module.stage} ran no backward in this share; nothing to end")
        if self._sum is not None:
            for (_, view), p in zip(parameter_views(self.module, self._sum), self._params, strict=True):
                if p.grad is not None:
                    view.add_(p.grad)
        else:
            assert self._inner is not None
            for p in self._params:
                if p.grad is not None:
                    p.grad.div_(count)
            if self.schedule is not None and inner_step is not None:
                for group in self._inner.param_groups:
                    group["lr"] = self.schedule.at(inner_step)
            self._inner.step()
        self.module.zero_grad(set_to_none=True)
        self._share_done.clear()
        self._round_micro_batches += count
        return count

    def contribution(self) -> tuple[torch.Tensor, int]:
        """The round's contribution and the micro-batches it covers, then a new round: the mean
        gradient (gradient mode) or the pseudo-gradient ``round_base - local`` (local mode, and the
        local weights become the next round's base). Slice it per shard with ``[lo:hi]``."""
        self._require_between_shares("contribution")
        count = self._round_micro_batches
        if count == 0:
            raise ModelError(f"stage {self.module.stage} has trained no micro-batch since its last contribution")
        if self._sum is not None:
            vector = self._sum / count
            self._sum.zero_()
        else:
            assert self._base is not None
            local = flatten_parameters(self.module)
            vector = self._base - local
            self._base = local
        self._round_micro_batches = 0
        return to_host(vector), count

    # --- internals -------------------------------------------------------------------------

    def _require_between_shares(self, what: str) -> None:
        if self._graphs or self._share_done:
            raise ModelError(
                f"{what} runs between shares; stage {self.module.stage} has a share open "
                f"({len(self._graphs)} in flight, {len(self._share_done)} done): end_share() or drop_share() first"
            )

    def _check_new(self, micro_batch: int) -> None:
        if micro_batch in self._graphs or micro_batch in self._share_done:
            raise ModelError(f"micro-batch {micro_batch} is already in this share on stage {self.module.stage}")

    def _input(self, x: torch.Tensor) -> torch.Tensor:
        # Checked where it arrived (host memory: no device sync), then moved. Token ids take no
        # gradient; hidden states (fp16 or bf16 off the wire) are computed on in fp32 (or under
        # autocast) and collect the gradient the previous cell needs.
        if self.module.is_first:
            vocab = int(self.module.config.vocab_size)
            if x.dtype == torch.long and x.numel() and not (int(x.min()) >= 0 and int(x.max()) < vocab):
                raise ModelError(f"token ids span [{int(x.min())}, {int(x.max())}]; the vocabulary is 0..{vocab - 1}")
            return to_device(x, self.device)
        if not x.is_floating_point() or not bool(torch.isfinite(x).all()):
            raise ModelError(f"stage {self.module.stage} input is {x.dtype} or holds NaN or Inf; refused")
        return to_device(x.detach(), self.device).to(torch.float32).requires_grad_(True)

    def _grad_of(self, x_in: torch.Tensor) -> torch.Tensor:
        assert x_in.grad is not None, "hidden-state inputs require grad"
        return to_host(x_in.grad)

    def _checked_flat(self, vector: torch.Tensor) -> torch.Tensor:
        if vector.dim() != 1 or vector.numel() != self.size or not vector.is_floating_point():
            raise ModelError(f"a flat vector of {vector.dtype} {tuple(vector.shape)}; stage has {self.size} elements")
        if not bool(torch.isfinite(vector).all()):
            raise ModelError("the flat weights hold NaN or Inf; refused")
        return vector.to(torch.float32)

    def _load(self, vector: torch.Tensor) -> None:
        with torch.no_grad():
            for (_, view), p in zip(parameter_views(self.module, vector), self._params, strict=True):
                p.copy_(view)
