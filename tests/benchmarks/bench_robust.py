"""What robust aggregation costs in loss, and what it saves under a poisoner: the default run.

    .venv/bin/python tests/benchmarks/bench_robust.py [--steps 150] [--threads 1]

Trains the default run's model (``tiny-bytes``) as one stage held by one real
``ParameterShard`` in gradient mode (AdamW at the run's lr): every step, each of the batch's
micro-batches is one honest cell's contribution (its mean gradient, in data-index order, as the
swarm hands them out), and the shard steps on them with ``aggregation = mean`` or
``centred-clip``. With ``poisoned``, one more contribution per round comes from a liar: the
round's honest mean gradient flipped and scaled by ``--flip`` (it points uphill, within the norm
bound's refusal: the norm bound alone only clips it). Prints the held-out loss at the start and
after the steps for each of the four runs, and the time each took. Figures only; nothing is
asserted (``tests/unit/models/test_robust_aggregation.py`` asserts the bound on a poisoner).
No network, no daemon: a few minutes on one CPU core.
"""

from __future__ import annotations

import argparse
import time

import torch

from swarmd.models.build import build_model
from swarmd.models.cell_compute import flatten_parameters
from swarmd.models.data.corpus import load_corpus, train_eval_split
from swarmd.models.parameter_shard import ParameterShard
from swarmd.models.presets import DEFAULT_RUN
from swarmd.models.reference import held_out_loss
from swarmd.models.shape import ModelShape
from swarmd.models.shard_config import ShardConfig

SEED = 1234


def gradient(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """One cell's contribution: the mean gradient of its micro-batch, flattened."""
    model.zero_grad(set_to_none=True)
    model(input_ids=ids, labels=ids).loss.backward()
    return torch.cat([p.grad.reshape(-1) for p in model.parameters() if p.grad is not None])


def train(aggregation: str, poisoned: bool, steps: int, flip: float) -> tuple[float, float, dict[str, int]]:
    """(held-out loss before, after ``steps``; the shard's counters)."""
    shape = ModelShape.from_dict(DEFAULT_RUN["model"])
    train_set, held_out = train_eval_split(load_corpus("builtin"), shape.seq_len, seed=SEED)
    batch, optimizer = DEFAULT_RUN["batch"], DEFAULT_RUN["optimizer"]
    per_step = batch["sequences"] // batch["micro_batch"]
    model = build_model(shape, SEED)
    model.train()
    start = held_out_loss(model, held_out)
    initial = flatten_parameters(model)
    config = ShardConfig(
        mode="gradient", lr=optimizer["lr"], weight_decay=optimizer["weight_decay"], aggregation=aggregation
    )
    shard = ParameterShard(0, initial.numel(), initial, config, step_micro_batches=10**6)
    share = 0
    for step in range(steps):
        honest = []
        for k in range(per_step):
            honest.append(gradient(model, train_set.micro_batch(step * per_step + k, batch["micro_batch"])))
        if poisoned:  # first in the round, as a liar that does not wait would be
            share += 1
            lie = -flip * torch.stack(honest).mean(0)
            shard.contribute(lie, shard.version, 1, [share], 1.0, sender="liar")
        for k, g in enumerate(honest):
            share += 1
            shard.contribute(g, shard.version, 1, [share], 1.0, sender=f"cell-{k}")
        made = shard.flush()
        assert made is not None
        shard.confirm(made.version)
        weights = shard.weights()
        assert weights is not None
        torch.nn.utils.vector_to_parameters(weights[1], model.parameters())
    c = shard.counters
    counters = {"clipped": c.clipped, "centre_clipped": c.centre_clipped, "refused": c.refused}
    return start, held_out_loss(model, held_out), counters


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--flip", type=float, default=8.0, help="the liar's contribution: -flip x the honest mean")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(SEED)
    print(f"default run, one shard, {args.steps} steps, liar = -{args.flip:g} x the honest mean gradient", flush=True)
    print(f"{'aggregation':<13} {'poisoned':<9} {'seconds':>8} {'start':>7} {'final':>7}  counters", flush=True)
    for poisoned in (False, True):
        for aggregation in ("mean", "centred-clip"):
            started = time.monotonic()
            start, final, counters = train(aggregation, poisoned, args.steps, args.flip)
            seconds = time.monotonic() - started
            print(f"{aggregation:<13} {poisoned!s:<9} {seconds:8.0f} {start:7.3f} {final:7.3f}  {counters}", flush=True)


if __name__ == "__main__":
    main()
