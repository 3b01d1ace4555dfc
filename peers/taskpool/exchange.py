"""The exchange schedule: shares, rounds, shards, staleness and when a server steps.

Pure functions and one settings type, used as they are by the daemon's cells and shard
servers, by the planner's cost model and by the simulator (``docs/data-path.md``):

- a pipeline trains on **shares** of ``share_micro_batches`` (k) micro-batches; ``local_steps``
  (H) shares make a **round**, after which each cell contributes once to every shard of its
  stage: its accumulated gradient (H = 1, *gradient* mode) or its pseudo-gradient (H > 1,
  *local* mode, DiLoCo);
- a stage's parameters, flattened, are cut into ``K`` contiguous **shards** (``shard_range``);
- a shard server weighs each contribution by its staleness (``staleness_weight``) and steps
  once the weighted work buffered reaches ``step_micro_batches``;
- inside a share the pipeline runs 1F1B with at most ``window`` micro-batches in flight and
  flushes at the share's end; ``share_seconds`` is that schedule's length, for the planner and
  the simulator, which do not run it micro-batch by micro-batch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

MODES = ("gradient", "local")
DILOCO_OUTER_LR = 0.7
DILOCO_OUTER_MOMENTUM = 0.9
"""DiLoCo's outer Nesterov step (Douillard et al. 2023), the values INTELLECT-1 kept too."""
OUTER_FULL_STEPS = 64
"""Rounds of this many inner steps or more take DiLoCo's outer rate whole (``outer_step_for``)."""
OUTER_RATE_EXPONENT = 0.7
MAX_LOCAL_STEPS = 1000


def outer_step_for(local_steps: int) -> tuple[float, float]:
    """The outer step (rate, Nesterov momentum) for rounds of ``local_steps`` inner steps.

    DiLoCo's rate 0.7 with momentum 0.9 applies a steady pseudo-gradient about seven times over
    (0.7 / (1 - 0.9)); it was tuned for rounds of 100 to 500 steps, whose pseudo-gradients fall
    short of H single steps' worth. Short rounds do not, and seven times over overshoots: on
    the swarm's own exchange (``tests/benchmarks/bench_token_efficiency.py``, docs/results.md)
    two replicas at H = 4 measured efficiency 0.86 at rate 0.1 (about once over), 0.72 at 0.175
    and 0.31 at 0.35; at H = 16, 0.86 at 0.35 and 0.17 at 0.7. So the momentum stays
    DiLoCo's and the rate grows with the round as ``(H / 64) ** 0.7`` up to 0.7 from 64 steps."""
    if not 1 <= local_steps <= MAX_LOCAL_STEPS:
        raise ValueError(f"local_steps = {local_steps} must be in [1, {MAX_LOCAL_STEPS}]")
    scale = min(1.0, (local_steps / OUTER_FULL_STEPS) ** OUTER_RATE_EXPONENT)
    return DILOCO_OUTER_LR * scale, DILOCO_OUTER_MOMENTUM


@dataclass(frozen=True, kw_only=True)
class ExchangeConfig:
    batch_micro_batches: int
    """The run's batch (sequences per update across the swarm) over its micro-batch."""
    share_micro_batches: int
    """k: micro-batches one pipeline trains on between two flushes."""
    local_steps: int = 1
    """H: shares per round. 1 contributes gradients (the servers step AdamW); more runs H inner
    optimizer steps on each cell and contributes the pseudo-gradient (the servers step Nesterov)."""
    max_staleness: int = 4
    """Server versions a contribution may lag and still count; beyond, it is dropped."""
    pipelines: int = 1
    """N: the pipelines of the assignment in force (an outer step averages about one round of each)."""
    outer_lr: float = 0.0
    """The outer step's rate; 0: ``outer_step_for(H)`` sets rate and momentum (the default)."""
    outer_momentum: float = DILOCO_OUTER_MOMENTUM

    def __post_init__(self) -> None:
        if self.batch_micro_batches < 1:
            raise ValueError(f"batch_micro_batches = {self.batch_micro_batches} must be >= 1")
        if self.share_micro_batches < 1:
            raise ValueError(f"share_micro_batches = {self.share_micro_batches} must be >= 1")
        if not 1 <= self.local_steps <= MAX_LOCAL_STEPS:
            raise ValueError(f"local_steps = {self.local_steps} must be in [1, {MAX_LOCAL_STEPS}]")
        if self.pipelines < 1:
            raise ValueError(f"pipelines = {self.pipelines} must be >= 1")
        if self.max_staleness < 0:
            raise ValueError(f"max_staleness = {self.max_staleness} must be >= 0")
        if not (self.outer_lr >= 0 and math.isfinite(self.outer_lr)):
            raise ValueError(f"outer_lr = {self.outer_lr} must be a finite number >= 0 (0: by H)")
        if not 0 <= self.outer_momentum < 1:
            raise ValueError(f"outer_momentum = {self.outer_momentum} must be in [0, 1)")

    @property
    def mode(self) -> str:
        return "gradient" if self.local_steps == 1 else "local"

    @property
    def outer_step(self) -> tuple[float, float]:
        """The outer step's (rate, momentum): the run's, or ``outer_step_for(H)`` where it gives 0."""
        if self.outer_lr > 0:
            return self.outer_lr, self.outer_momentum
        return outer_step_for(self.local_steps)

    @property
    def round_micro_batches(self) -> int:
        """Micro-batches one contribution covers: H shares of k."""
        return self.local_steps * self.share_micro_batches


SYNC_WAIT_S = 10.0
"""Gradient mode: the longest a pipeline waits, between rounds, for the step its last round's
contribution went into before it goes on with the weights it has (a pipeline that is slow or
gone must not hold the others). The daemons' cells and the simulator both follow it."""


def step_micro_batches(settings: ExchangeConfig) -> int:
    """The weighted micro-batches a server buffers before it steps: the run's batch for
    gradients; for pseudo-gradients H times the batch or one round of every pipeline, whichever
    is less, so that an outer step averages about one round of each pipeline (DiLoCo's outer
    batch) and never waits for more rounds than the pipelines may hold open: with ``N x k``
    under the batch, ``H x batch`` would be more rounds than N pipelines run before their
    open shares (and contributions) must be committed, and no server would ever step."""
    if settings.mode == "gradient":
        return settings.batch_micro_batches
    per_round = min(settings.batch_micro_batches, settings.pipelines * settings.share_micro_batches)
    return per_round * settings.local_steps


def staleness_weight(staleness: int, settings: ExchangeConfig) -> float:
    """What a contribution ``staleness`` versions behind the server counts for (0: dropped).

    Gradients count in full up to ``max_staleness`` (bounded-staleness asynchronous SGD, as the
    servers always did). Pseudo-gradients are each the work of a whole round, and an old one
    points away from where the weights are now, so they count ``1 / sqrt(1 + staleness)``
    (FedBuff, Nguyen et al. 2022), up to the same bound."""
    if staleness < 0:
        raise ValueError(f"staleness = {staleness} must be >= 0 (a contribution from the future)")
    if staleness > settings.max_staleness:
        return 0.0
    if settings.mode == "gradient":
        return 1.0
    return 1.0 / math.sqrt(1.0 + staleness)


def shard_range(elements: int, shards: int, k: int) -> tuple[int, int]:
    """The half-open range of a stage's flattened parameters that shard ``k`` of ``shards`` owns."""
    if shards < 1 or not 0 <= k < shards:
        raise ValueError(f"shard {k} of {shards}: need 0 <= k < shards and shards >= 1")
    if elements < shards:
        raise ValueError(f"{elements} parameters cannot be cut into {shards} non-empty shards")
    return (k * elements) // shards, ((k + 1) * elements) // shards


def shard_sizes(elements: int, shards: int) -> list[int]:
    """The elements of each of ``shards`` shards (they differ by at most one)."""
    return [hi - lo for lo, hi in (shard_range(elements, shards, k) for k in range(shards))]


def window(stages: int) -> int:
    """Micro-batches stage 0 keeps in flight inside a share: one per stage, and one more so
    that the first stage computes while the last one's gradient is on its way back."""
    return stages + 1


def fill_fraction(share_micro_batches: int, stages: int) -> float:
    """The share of a pipeline's time lost to filling and draining at each flush."""
    return (stages - 1) / (share_micro_batches + stages - 1)


def share_seconds(
    forward_s: Sequence[float], backward_s: Sequence[float], send_s: Sequence[float], share_micro_batches: int
) -> float:
    """How long a pipeline takes over one share in 1F1B, flush to flush.

    ``forward_s[s]`` and ``backward_s[s]`` are stage ``s``'s times per micro-batch (the last
    stage's backward includes its loss); ``send_s[b]`` is boundary ``b``'s time for one
    activation (or its gradient, the same bytes the other way) between stages ``b`` and ``b+1``,
    latency included. The first micro-batch crosses every stage and boundary twice (fill and
    drain); every other one adds the pipeline's bottleneck: the slowest stage's forward and
    backward, or the slowest boundary, which carries one tensor each way per micro-batch on a
    full-duplex link, or, when latency dominates, the time one micro-batch takes through the
    whole pipeline and back over the ``window`` that may be in flight."""
    stages = len(forward_s)
    if stages < 1 or len(backward_s) != stages or len(send_s) != stages - 1:
        raise ValueError(f"{stages} stages need {stages} backward times and {stages - 1} boundary times")
    if share_micro_batches < 1:
        raise ValueError(f"share_micro_batches = {share_micro_batches} must be >= 1")
    through = sum(forward_s) + sum(backward_s) + 2 * sum(send_s)
    bottleneck = max(
        max(f + b for f, b in zip(forward_s, backward_s, strict=True)),
        max(send_s, default=0.0),
        through / window(stages),
    )
    return through + (share_micro_batches - 1) * bottleneck


def trained_tokens(micro_batches: float, micro_batch: int, seq_len: int) -> float:
    """Tokens in ``micro_batches`` applied micro-batches: what 'trained tokens' counts."""
    return micro_batches * micro_batch * seq_len
