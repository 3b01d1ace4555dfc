"""What a run's model costs the data path.

Parameters per stage and shard, compute per micro-batch, and the bytes of every message, priced
with ``swarmd.peers.wire.sizes`` exactly as the planner's cost model prices them.

- A stage's parameters are the planner's count (``plan_cost.stage_parameters``: its layers',
  the embedding on the first stage, the output head on the last), cut into the plan's ``K_s``
  shards by ``exchange.shard_sizes``.
- A micro-batch's forward is a third of its stage's flops (``stage_flops_per_sequence``) and
  its backward the other two thirds; on a stage the plan checkpoints, the backward also runs
  its layers' forward again (``recompute_flops_per_sequence``), as the planner prices it.
- Messages: an activation (or its gradient) in the codec its link calls for; a contribution
  per shard; a step's delta in fp16; a whole slice in fp32; a checkpoint of a shard (its
  fp32 weights, AdamW's two moments and the delta's error-feedback residual).

``RunSizes`` adds what swarmd's data path fixes with them at its first plan: ``k``, ``H`` and
the exchange's schedule (``taskpool.exchange.ExchangeConfig``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from swarmd.peers.planning.plan_cost import (
    Plan,
    recompute_flops_per_sequence,
    stage_flops_per_sequence,
    stage_parameters,
)
from swarmd.peers.planning.scenario import Scenario
from swarmd.peers.taskpool.exchange import ExchangeConfig, shard_sizes
from swarmd.peers.wire.sizes import activation_elements, codec_for, message_bytes

CHECKPOINT_FLOATS_PER_PARAM = 4
"""What a shard's checkpoint holds per parameter, in fp32: weights, AdamW's two moments, and
the residual the server keeps for its fp16 deltas (``docs/data-path.md``)."""


@dataclass(frozen=True)
class Workload:
    """The sizes of one run: fixed by its first plan's stage cut and shards (module doc)."""

    shard_elements: tuple[tuple[int, ...], ...]
    """shard_elements[s][k]: parameters of shard k of stage s."""
    forward_flops: tuple[float, ...]
    """Per micro-batch, per stage."""
    backward_flops: tuple[float, ...]
    activation_elements: int
    tokens_per_micro_batch: int
    half: str = "fp16"

    @classmethod
    def of(
        cls,
        scenario: Scenario,
        layers_per_stage: tuple[int, ...],
        shards: tuple[int, ...],
        checkpointing: tuple[bool, ...] = (),
    ) -> Workload:
        """``checkpointing``: per stage, whether its cells checkpoint activations (the plan's)."""
        params = stage_parameters(scenario, layers_per_stage)
        flops = stage_flops_per_sequence(scenario, np.asarray(layers_per_stage, dtype=float)) * scenario.micro_batch
        again = recompute_flops_per_sequence(scenario, layers_per_stage, checkpointing) * scenario.micro_batch
        m = scenario.model
        return cls(
            shard_elements=tuple(tuple(shard_sizes(p, k)) for p, k in zip(params, shards, strict=True)),
            forward_flops=tuple(float(f) / 3.0 for f in flops),
            backward_flops=tuple(2.0 * float(f) / 3.0 + float(a) for f, a in zip(flops, again, strict=True)),
            activation_elements=activation_elements(scenario.micro_batch, m.seq_len, m.hidden),
            tokens_per_micro_batch=scenario.micro_batch * m.seq_len,
        )

    @property
    def stages(self) -> int:
        return len(self.shard_elements)

    def activation_bytes(self, link_Bps: float) -> int:
        """One activation, or its gradient, on a link of ``link_Bps``."""
        return message_bytes(self.activation_elements, codec_for("activation", link_Bps, half=self.half), ndim=3)

    def contribution_bytes(self, stage: int, shard: int, link_Bps: float) -> int:
        codec = codec_for("contribution", link_Bps, half=self.half)
        return message_bytes(self.shard_elements[stage][shard], codec)

    def delta_bytes(self, stage: int, shard: int) -> int:
        return message_bytes(self.shard_elements[stage][shard], codec_for("delta", 0.0))

    def slice_bytes(self, stage: int, shard: int) -> int:
        """The whole slice, for a new cell or one further behind than the server keeps deltas."""
        return message_bytes(self.shard_elements[stage][shard], codec_for("weights", 0.0))

    def checkpoint_bytes(self, stage: int, shard: int) -> int:
        return message_bytes(self.shard_elements[stage][shard] * CHECKPOINT_FLOATS_PER_PARAM, "fp32")

    def pull_bytes(self, stage: int, shard: int, behind: int, keep_versions: int) -> int:
        """What a pull ``behind`` versions behind brings: a delta per version, or the whole
        slice when further behind than the server keeps deltas (``docs/data-path.md``)."""
        if behind > keep_versions:
            return self.slice_bytes(stage, shard)
        return behind * self.delta_bytes(stage, shard)


@dataclass(frozen=True)
class RunSizes:
    """What swarmd's data path fixes at its first plan: the workload, ``k`` micro-batches a
    share, ``H`` shares a round, and the exchange's schedule (``swarmd_path`` module doc)."""

    workload: Workload
    share_micro_batches: int
    local_steps: int
    exchange: ExchangeConfig

    @classmethod
    def of(cls, scenario: Scenario, plan: Plan, max_staleness: int) -> RunSizes:
        k = plan.micro_batches_per_share(scenario)
        return cls(
            workload=Workload.of(
                scenario,
                plan.layers_per_stage,
                tuple(len(row) for row in plan.shard_servers),
                tuple(plan.checkpointing),
            ),
            share_micro_batches=k,
            local_steps=plan.local_steps,
            exchange=ExchangeConfig(
                batch_micro_batches=max(1, scenario.batch_sequences // scenario.micro_batch),
                share_micro_batches=k,
                local_steps=plan.local_steps,
                max_staleness=max_staleness,
                pipelines=max(1, len(plan.pipelines)),
            ),
        )
