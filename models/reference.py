"""The single-process synchronous reference: the same model, data and seed, trained in one place.

The swarm's loss is judged against this curve at equal tokens (issue 3's correctness test),
and its throughput against this one's (the benchmark). Each optimizer step averages the
gradients of ``batch_sequences / micro_batch`` micro-batches, taken in data-index order with
``Dataset.micro_batch``: exactly the sequences a swarm hands out for the same step.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from swarmd.models.build import ModelShape, build_model
from swarmd.models.data.windows import Dataset
from swarmd.models.lr_schedule import LrSchedule
from swarmd.models.shard_config import ShardConfig
from swarmd.models.shard_contribution import NormBound
from swarmd.models.shard_deltas import DeltaLog
from swarmd.models.stages import split_layers, stage_parameter_shapes

logger = logging.getLogger(__name__)

WIRE_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


class _Travel(torch.autograd.Function):
    """Identity but for the rounding of a trip between peers: the value on the way forward, its
    gradient on the way back."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        ctx.dtype = dtype
        return x.to(dtype).to(x.dtype)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad.to(ctx.dtype).to(grad.dtype), None


def round_at_stage_cuts(model: torch.nn.Module, shape: ModelShape, stages: int, wire: str) -> None:
    """Make ``model``'s hidden state (and its gradient) travel in ``wire`` at each cut between
    ``stages`` even stages, as between a swarm's cells."""
    if stages < 2 or wire == "fp32":
        return
    dtype = WIRE_DTYPES[wire]
    body: Any = model.model if shape.family == "llama" else model.transformer
    blocks: Any = body.layers if shape.family == "llama" else body.h

    def travel(_module: torch.nn.Module, _inputs: Any, out: Any) -> Any:
        if isinstance(out, tuple):  # older transformers: (hidden, ...)
            return (_Travel.apply(out[0], dtype), *out[1:])
        return _Travel.apply(out, dtype)

    for _, end in split_layers(shape.layers, stages)[:-1]:
        blocks[end - 1].register_forward_hook(travel)


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    seed: int
    """Seeds the weights and the data order."""
    steps: int
    """Optimizer steps to take."""
    batch_sequences: int
    """Sequences per optimizer step."""
    micro_batch: int
    """Sequences per micro-batch (gradients are accumulated over the step's micro-batches)."""
    lr: float
    weight_decay: float = 0.0
    schedule: LrSchedule | None = None
    """Each step's rate, as the run's (None: ``lr`` throughout)."""
    threads: int | None = None
    """torch intra-op threads (None: torch's default), to match a swarm's total in benchmarks."""
    stages: int = 1
    """Stages a swarm cuts the model into (``split_layers``' even split, as the daemon's)."""
    wire: str = "fp32"
    """What hidden states and their gradients are rounded to at each cut between stages, as
    they travel between a swarm's cells (``ModelShape.wire_half``): with it the reference
    differs from the swarm by what the swarm does (the order of additions, a lost share), not by
    its numerics. Rounding a small model's hidden state to bf16 moves its held-out loss after
    100 steps by as much as 0.17 nats either way (tiny-llama-bpe), 10x what a lost micro-batch
    does."""
    contribution: str = "fp32"
    """What each step's mean gradient is rounded to on its way from the cells to the shard
    servers, the rounding repaid in the next step (``codecs.ErrorFeedback``): the run's half on a
    fast link (``sizes.codec_for``)."""
    fp16_deltas: bool = False
    """Each step lands as an fp16 delta, what rounding left out carried into the next (the shard
    server's ``DeltaLog``: cells add exactly those deltas). With ``contribution`` and ``wire``
    this is the swarm's arithmetic: two daemons score what this does to 1e-4 until a cell moves."""
    norm_bound: bool = False
    """Each stage's gradient clipped as its shard server clips a contribution: to
    ``max_norm_factor`` times the median norm of the recent ones (``NormBound``, the servers'
    defaults). A loss spike's gradient (28 times the median at one step of one tiny-llama-bpe
    run) is cut to that bound in the swarm; without this the reference takes it whole, and the
    two part by 0.05 to 0.13 nats within 15 steps."""

    def __post_init__(self) -> None:
        for name, codec in (("wire", self.wire), ("contribution", self.contribution)):
            if codec not in WIRE_DTYPES:
                raise ValueError(f"{name} {codec!r} is not one of {sorted(WIRE_DTYPES)}")
        if self.steps < 1 or self.micro_batch < 1 or self.batch_sequences < self.micro_batch:
            raise ValueError(
                f"need steps >= 1 and batch_sequences >= micro_batch >= 1; got steps={self.steps}, "
                f"batch_sequences={self.batch_sequences}, micro_batch={self.micro_batch}"
            )
        if self.batch_sequences % self.micro_batch:
            raise ValueError(
                f"batch_sequences {self.batch_sequences} is not a multiple of micro_batch {self.micro_batch}"
            )

    @property
    def micro_batches_per_step(self) -> int:
        return self.batch_sequences // self.micro_batch


class _Exchange:
    """A step as the swarm's shard servers take it, stage by stage (``TrainConfig``): the gradient
    rounded to the contribution's codec, its rounding carried into the next step; clipped by the
    stage's norm bound (``NormBound``, the servers' own); the change landing as the fp16 delta
    the servers' ``DeltaLog`` makes of it. (The rounding is written here, not taken from
    ``codecs.ErrorFeedback``: the models layer knows nothing of the wire.)"""

    def __init__(self, model: torch.nn.Module, shape: ModelShape, settings: TrainConfig) -> None:
        self.stages = _parameters_by_stage(model, shape, settings.stages)
        params = [p for stage in self.stages for p in stage]
        self.dtype = None if settings.contribution == "fp32" else WIRE_DTYPES[settings.contribution]
        self.feedback = [torch.zeros_like(p) for p in params] if self.dtype is not None else []
        config = ShardConfig(mode="gradient", lr=settings.lr)
        self.bounds = [NormBound(config) for _ in self.stages] if settings.norm_bound else []
        self.deltas = [DeltaLog(p.detach(), keep_versions=1) for p in params] if settings.fp16_deltas else []
        self.params = params
        self.steps = 0

    @torch.no_grad()
    def step(self, optimizer: torch.optim.Optimizer) -> None:
        for p, left in zip(self.params, self.feedback, strict=False):
            if p.grad is not None:
                left.add_(p.grad)
                p.grad.copy_(left.to(self.dtype))
                left.sub_(p.grad)
        for stage, bound in zip(self.stages, self.bounds, strict=False):
            grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in stage]
            vector, norm, clipped = bound.screen(torch.cat([g.reshape(-1) for g in grads]), [self.steps])
            bound.accept("reference", norm)
            if clipped:
                for p, part in zip(stage, vector.split([p.numel() for p in stage]), strict=True):
                    p.grad = part.view_as(p).clone()
        before = [p.detach().clone() for p in self.params] if self.deltas else []
        optimizer.step()
        for p, old, log in zip(self.params, before, self.deltas, strict=False):
            p.copy_(old.add_(log.encode(p - old).to(torch.float32)))
        self.steps += 1


def _parameters_by_stage(model: torch.nn.Module, shape: ModelShape, stages: int) -> list[list[torch.nn.Parameter]]:
    """``model``'s parameters grouped as a swarm's ``stages`` even stages hold them, each in its
    stage's flat-vector order (``stage_parameter_shapes``)."""
    named = dict(model.named_parameters())
    ranges = tuple(split_layers(shape.layers, stages))
    grouped = [[named.pop(name) for name, _ in stage_parameter_shapes(shape, ranges, i)] for i in range(stages)]
    if named:
        raise ValueError(f"parameters {sorted(named)[:3]} belong to no stage of {stages}")
    return grouped


@dataclass(frozen=True)
class StepResult:
    step: int
    loss: float
    """Mean training loss over the step's micro-batches (before the update)."""
    tokens: int
    """Tokens trained on so far, this step included."""
    seconds: float
    """Wall time of this step."""


def train_reference(
    shape: ModelShape,
    dataset: Dataset,
    settings: TrainConfig,
    on_step: Callable[[StepResult], None] | None = None,
    on_weights: Callable[[int, torch.nn.Module], None] | None = None,
) -> tuple[list[StepResult], dict[str, torch.Tensor]]:
    """Train synchronously; returns the per-step results and the final weights. ``on_weights``
    is called with the steps taken and the model before the first step and after each."""
    results: list[StepResult] = []
    model: torch.nn.Module | None = None
    for taken, model, result in reference_steps(shape, dataset, settings):
        if result is not None:
            results.append(result)
            if on_step is not None:
                on_step(result)
        if on_weights is not None:
            on_weights(taken, model)
    assert model is not None
    return results, {name: p.detach().clone() for name, p in model.state_dict().items()}


def reference_steps(
    shape: ModelShape, dataset: Dataset, settings: TrainConfig
) -> Iterator[tuple[int, torch.nn.Module, StepResult | None]]:
    """``train_reference`` one step at a time: yields the steps taken and the model before the
    first step (with no result) and after each of ``settings.steps`` (with its result). A caller
    that needs the weights after different step counts at different times goes on from where it
    stopped instead of training again."""
    if dataset.seq_len != shape.seq_len:
        raise ValueError(f"dataset sequences are {dataset.seq_len} tokens; the model takes {shape.seq_len}")
    if settings.threads is not None:
        torch.set_num_threads(settings.threads)
    model = build_model(shape, settings.seed)
    round_at_stage_cuts(model, shape, settings.stages, settings.wire)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=settings.lr, weight_decay=settings.weight_decay)
    exchange = _Exchange(model, shape, settings)
    per_step = settings.micro_batches_per_step
    tokens = 0
    yield 0, model, None
    for step in range(settings.steps):
        started = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        if settings.schedule is not None:
            for group in optimizer.param_groups:
                group["lr"] = settings.schedule.at(step)
        total = 0.0
        for k in range(per_step):
            ids = dataset.micro_batch(step * per_step + k, settings.micro_batch)
            loss = model(input_ids=ids, labels=ids).loss
            (loss / per_step).backward()
            total += float(loss.detach())
            tokens += ids.numel()
        exchange.step(optimizer)
        yield step + 1, model, StepResult(step, total / per_step, tokens, time.perf_counter() - started)


def held_out_loss(model: torch.nn.Module, dataset: Dataset, *, sequences: int = 64, micro_batch: int = 8) -> float:
    """Mean loss of ``model`` (a causal LM) over the first ``sequences`` of ``dataset``.

    The yardstick for comparing two sets of weights (a swarm's against the reference's): the
    same held-out sequences, one consistent set of weights, no dropout, no gradient."""
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    try:
        with torch.no_grad():
            for start in range(0, min(sequences, len(dataset)), micro_batch):
                ids = dataset.batch(range(start, min(start + micro_batch, sequences, len(dataset))))
                total += float(model(input_ids=ids, labels=ids).loss) * len(ids)
                count += len(ids)
    finally:
        model.train(was_training)
    return total / count
