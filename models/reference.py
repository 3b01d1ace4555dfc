"""The single-process synchronous reference: the same model, data and seed, trained in one place.

The swarm's loss is judged against this curve at equal tokens (issue 3's correctness test),
and its throughput against this one's (the benchmark). Each optimizer step averages the
gradients of ``batch_sequences / micro_batch`` micro-batches, taken in data-index order with
``Dataset.micro_batch``: exactly the sequences a swarm hands out for the same step.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from swarmd.models.build import ModelShape, build_model
from swarmd.models.data.windows import Dataset

logger = logging.getLogger(__name__)


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
    threads: int | None = None
    """torch intra-op threads (None: torch's default), to match a swarm's total in benchmarks."""

    def __post_init__(self) -> None:
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
) -> tuple[list[StepResult], dict[str, torch.Tensor]]:
    """Train synchronously; returns the per-step results and the final weights."""
    if dataset.seq_len != shape.seq_len:
        raise ValueError(f"dataset sequences are {dataset.seq_len} tokens; the model takes {shape.seq_len}")
    if settings.threads is not None:
        torch.set_num_threads(settings.threads)
    model = build_model(shape, settings.seed)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=settings.lr, weight_decay=settings.weight_decay)
    per_step = settings.micro_batches_per_step
    results: list[StepResult] = []
    tokens = 0
    for step in range(settings.steps):
        started = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        total = 0.0
        for k in range(per_step):
            ids = dataset.micro_batch(step * per_step + k, settings.micro_batch)
            loss = model(input_ids=ids, labels=ids).loss
            (loss / per_step).backward()
            total += float(loss.detach())
            tokens += ids.numel()
        optimizer.step()
        result = StepResult(step, total / per_step, tokens, time.perf_counter() - started)
        results.append(result)
        if on_step is not None:
            on_step(result)
    return results, {name: p.detach().clone() for name, p in model.state_dict().items()}


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
