"""What robust aggregation costs in loss, and what it saves under a poisoner: the default run.

    .venv/bin/python tests/benchmarks/bench_robust.py [--steps 150] [--threads 1]
        [--scenarios clean sign-flip liar] [--aggregations mean centred-clip] [--seeds 1234]

Trains the default run's model (``tiny-bytes``) as one stage held by one real
``ParameterShard`` in gradient mode (AdamW at the run's lr): every step, each of the batch's
micro-batches is one contribution (its mean gradient, in data-index order, as the swarm hands
them out), and the shard steps on them with each ``--aggregations`` rule. The scenarios:

- ``clean``: three honest members compute the micro-batches in turn (micro-batch ``j`` is
  member ``j % 3``'s), each one a contribution of its own;
- ``sign-flip``: the same three, but member 2 sends each of its gradients negated (a third of
  every round's contributions point uphill, each with an honest norm, so no norm bound sees it);
- ``absent``: the same three, but member 2 sends nothing (its micro-batches are lost): the
  best any defence against ``sign-flip`` can do, short of training its micro-batches again;
- ``liar``: the four micro-batches from four honest cells, and one more contribution per round
  from a liar: the round's honest mean gradient flipped and scaled by ``--flip`` (it points
  uphill, within the norm bound's refusal: the norm bound alone only clips it).

``--pipelines P`` shapes a round as the swarm's shard sees it: P contributions, each the mean
of its pipeline's share of the batch (not one per micro-batch), sent by the members in turn;
``--staleness S`` computes each on the weights of up to S versions before (drawn uniformly, as
an asynchronous pipeline's share lands on a shard that stepped meanwhile).

Prints the held-out loss at the start and after the steps of each run, the time each took and
the shard's counters (``centre_clipped``: contributions centred clipping cut), then, per
scenario, the gap of each rule to the clean mean. Figures only; nothing is asserted
(``tests/unit/models/test_robust_aggregation.py`` asserts the bound on a poisoner). No network,
no daemon: about a minute a run on one CPU core.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import torch
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from swarmd.models.build import build_model
from swarmd.models.cell_compute import flatten_parameters
from swarmd.models.data.corpus import load_corpus, train_eval_split
from swarmd.models.parameter_shard import ParameterShard
from swarmd.models.presets import DEFAULT_RUN
from swarmd.models.reference import held_out_loss
from swarmd.models.shape import ModelShape
from swarmd.models.shard_config import ShardConfig

SEED = 1234
SCENARIOS = ("clean", "sign-flip", "absent", "liar")
MEMBERS = 3
"""Members in ``clean``, ``sign-flip`` and ``absent``; the last one lies in ``sign-flip``, is
silent in ``absent``."""


def gradient(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """One cell's contribution: the mean gradient of its micro-batch, flattened."""
    model.zero_grad(set_to_none=True)
    model(input_ids=ids, labels=ids).loss.backward()
    return torch.cat([p.grad.reshape(-1) for p in model.parameters() if p.grad is not None])


@dataclass(frozen=True)
class RoundShape:
    """How a round reaches the shard: ``pipelines`` contributions (0: one per micro-batch), each
    on weights up to ``staleness`` versions old."""

    pipelines: int = 0
    staleness: int = 0


def round_gradients(
    model: torch.nn.Module,
    past: deque[torch.Tensor],
    batches: list[torch.Tensor],
    rounds: RoundShape,
    rng: random.Random,
) -> list[torch.Tensor]:
    """The round's contributions before any member lies: one per micro-batch, or one per
    pipeline (the mean of its share of ``batches``), each on weights drawn from ``past``."""
    every = rounds.pipelines or len(batches)
    groups = [batches[p::every] for p in range(every)]
    newest = parameters_to_vector(model.parameters()).detach().clone()
    out = []
    for group in groups:
        if rounds.staleness:
            vector_to_parameters(past[-1 - rng.randint(0, min(rounds.staleness, len(past) - 1))], model.parameters())
        out.append(torch.stack([gradient(model, ids) for ids in group]).mean(0))
    vector_to_parameters(newest, model.parameters())
    return out


def train(
    aggregation: str,
    scenario: str,
    steps: int,
    flip: float,
    seed: int,
    radius_factor: float | None,
    rounds: RoundShape = RoundShape(),
) -> tuple[float, float, dict[str, Any]]:
    """(held-out loss before, after ``steps``; the shard's counters)."""
    shape = ModelShape.from_dict(DEFAULT_RUN["model"])
    train_set, held_out = train_eval_split(load_corpus("builtin"), shape.seq_len, seed=seed)
    batch, optimizer = DEFAULT_RUN["batch"], DEFAULT_RUN["optimizer"]
    per_step = batch["sequences"] // batch["micro_batch"]
    model = build_model(shape, seed)
    model.train()
    start = held_out_loss(model, held_out)
    initial = flatten_parameters(model)
    config = ShardConfig(
        mode="gradient",
        lr=optimizer["lr"],
        weight_decay=optimizer["weight_decay"],
        aggregation=aggregation,
        **({} if radius_factor is None else {"clip_radius_factor": radius_factor}),
    )
    shard = ParameterShard(0, initial.numel(), initial, config, step_micro_batches=10**6)
    share = 0
    rng = random.Random(seed)
    past: deque[torch.Tensor] = deque([initial.clone()], maxlen=rounds.staleness + 1)
    for step in range(steps):
        batches = [train_set.micro_batch(step * per_step + k, batch["micro_batch"]) for k in range(per_step)]
        honest = round_gradients(model, past, batches, rounds, rng)
        if scenario == "liar":  # first in the round, as a liar that does not wait would be
            share += 1
            lie = -flip * torch.stack(honest).mean(0)
            shard.contribute(lie, shard.version, 1, [share], 1.0, sender="liar")
        for k, g in enumerate(honest):
            share += 1
            if scenario == "liar":
                sender = f"cell-{k}"
            else:
                member = (step * len(honest) + k) % MEMBERS
                sender = f"member-{member}"
                if member == MEMBERS - 1 and scenario == "absent":
                    continue
                if member == MEMBERS - 1 and scenario == "sign-flip":
                    g = -g
            shard.contribute(g, shard.version, 1, [share], 1.0, sender=sender)
        made = shard.flush()
        if made is None:  # ``absent`` with one contribution a round: the silent member's round is lost
            continue
        shard.confirm(made.version)
        weights = shard.weights()
        assert weights is not None
        vector_to_parameters(weights[1], model.parameters())
        past.append(weights[1].detach().clone())
    c = shard.counters
    counters = {"clipped": c.clipped, "centre_clipped": c.centre_clipped, "refused": c.refused}
    if distrusted := shard.distrusted():
        counters["distrusted"] = distrusted
    return start, held_out_loss(model, held_out), counters


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--flip", type=float, default=8.0, help="the liar's contribution: -flip x the honest mean")
    parser.add_argument("--scenarios", nargs="+", choices=SCENARIOS, default=list(SCENARIOS))
    parser.add_argument("--aggregations", nargs="+", choices=("mean", "centred-clip"), default=["mean", "centred-clip"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[SEED], help="the model's and the data's seeds")
    parser.add_argument("--radius-factor", type=float, default=None, help="centred clipping's (default: the shard's)")
    parser.add_argument("--pipelines", type=int, default=0, help="contributions per round (0: one per micro-batch)")
    parser.add_argument("--staleness", type=int, default=0, help="versions a contribution's weights may lag")
    args = parser.parse_args()
    rounds = RoundShape(args.pipelines, args.staleness)
    torch.set_num_threads(args.threads)
    print(
        f"default run, one shard, {args.steps} steps, seeds {args.seeds}, radius factor "
        f"{args.radius_factor or ShardConfig(mode='gradient', lr=1.0).clip_radius_factor:g}; "
        f"{args.pipelines or 'one per micro-batch'} contribution(s) a round, staleness up to {args.staleness}; "
        f"liar = -{args.flip:g} x the honest mean gradient",
        flush=True,
    )
    print(f"{'scenario':<10} {'aggregation':<13} {'seed':>5} {'seconds':>8} {'start':>7} {'final':>7}  counters")
    finals: dict[tuple[str, str], list[float]] = {}
    for scenario in args.scenarios:
        for aggregation in args.aggregations:
            for seed in args.seeds:
                torch.manual_seed(seed)
                started = time.monotonic()
                start, final, counters = train(
                    aggregation, scenario, args.steps, args.flip, seed, args.radius_factor, rounds
                )
                seconds = time.monotonic() - started
                finals.setdefault((scenario, aggregation), []).append(final)
                print(
                    f"{scenario:<10} {aggregation:<13} {seed:>5} {seconds:8.0f} {start:7.3f} {final:7.3f}  {counters}",
                    flush=True,
                )
    clean = finals.get(("clean", "mean"))
    print("\nmean final over the seeds, and its gap to the clean mean's:")
    for (scenario, aggregation), values in finals.items():
        gap = f"{statistics.fmean(values) - statistics.fmean(clean):+7.3f}" if clean else "      -"
        print(f"{scenario:<10} {aggregation:<13} {statistics.fmean(values):7.3f} {gap}")


if __name__ == "__main__":
    main()
