"""Held-out loss of N real daemons against the synchronous reference at equal tokens, per H,
and against what the quality model predicts for the run's shape.

    .venv/bin/python tests/benchmarks/bench_loss_gap.py [--daemons 4] [--local-steps 1 4 16] [--steps 100]

For each H: create the default run with ``[exchange] local_steps = H`` (1: gradient mode,
synchronous SGD over the pipelines; more: DiLoCo rounds of H inner steps and the outer
Nesterov step the exchange's rule gives H), start the daemons on 127.0.0.1, train until shard
(0, 0) has made ``--steps`` updates (outer steps for H > 1), gather and export the weights, and
score them on held-out data beside the single-process synchronous reference trained on as many
tokens (AdamW steps of the run's batch, rounded to the wire's precision where the stages cut),
whose held-out loss is recorded along the way. The quality model
(``learning.token_efficiency`` of the plan's pipelines as replicas, H, and the mean outer steps
late of the contributions shard (0, 0) applied) predicts the swarm's loss: the reference's at
that share of the tokens. Run it on an otherwise idle machine: under load the daemons'
pipelines stall unevenly and the run is not the exchange's. Prints, per H, the gap, the predicted loss
and gap, and the efficiency measured (the tokens the reference needed for the swarm's loss,
over the swarm's). Figures only; nothing is asserted (tests/integration/test_swarm_training.py
asserts H = 1).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM

from swarmd.models.build import build_model
from swarmd.models.data.corpus import load_corpus, train_eval_split
from swarmd.models.presets import DEFAULT_RUN
from swarmd.models.reference import TrainConfig, held_out_loss, train_reference
from swarmd.models.shape import ModelShape
from swarmd.peers.planning.learning import token_efficiency
from swarmd.peers.records.run_spec import run_seed
from swarmd.peers.taskpool.exchange import outer_step_for
from swarmd.system.local_swarm import LocalDaemon, create_run, start_swarm, wait_for

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script: the token-efficiency bench
from tests.benchmarks.bench_token_efficiency import tokens_to_reach  # noqa: E402

FLAGS = ["--heartbeat-interval", "1", "--heartbeat-ttl", "6", "--threads", "1"]
HELD_OUT_SEQUENCES = 256
CURVE_POINTS = 60


def training(daemon: LocalDaemon) -> dict[str, Any]:
    try:
        return (daemon.status() or {}).get("training") or {}
    except Exception:
        return {}


def trained_batches(daemons: list[LocalDaemon], batch_tokens: int) -> float:
    return max((training(d).get("trained_tokens") or 0) for d in daemons) / batch_tokens


def updates(daemons: list[LocalDaemon]) -> int:
    return max((training(d).get("updates") or 0) for d in daemons)


def served_staleness(daemons: list[LocalDaemon]) -> float:
    """Mean versions behind of the contributions shard (0, 0) took, as its server counted them
    (the server that took the most, should it have changed hands)."""
    counts: dict[str, int] = {}
    for d in daemons:
        for shard in training(d).get("shards") or []:
            if (shard.get("stage"), shard.get("shard")) == (0, 0):
                mine = shard.get("staleness") or {}
                if sum(mine.values()) > sum(counts.values()):
                    counts = mine
    taken = sum(counts.values())
    return sum(int(k) * n for k, n in counts.items()) / taken if taken else 0.0


def pipelines(daemons: list[LocalDaemon]) -> int:
    return max(((training(d).get("assignment") or {}).get("pipelines") or 0) for d in daemons)


@dataclass
class SwarmRun:
    run_id: str
    seconds: float
    batches: float
    """Batches' worth of tokens applied at shard (0, 0)."""
    updates: int
    pipelines: int
    staleness: float
    """Mean outer steps late of what shard (0, 0) applied: what the prediction prices."""
    pipelines_seen: tuple[int, ...]
    """Every pipeline count the plan had while the run was polled: a run that replanned
    between one and two pipelines is not the shape the prediction prices."""
    loss: float


def swarm_loss(n: int, local_steps: int, steps: int) -> SwarmRun:
    """Train until shard (0, 0) has made ``steps`` updates; the exported weights' held-out loss."""
    root = Path(tempfile.mkdtemp(prefix="swarmd-gap-", dir="/tmp"))
    spec = root / "run.json"
    spec.write_text(json.dumps({**DEFAULT_RUN, "exchange": {**DEFAULT_RUN["exchange"], "local_steps": local_steps}}))
    run_id = create_run(root / "d0", spec)
    daemons = [LocalDaemon(root / f"d{i}", run_id, FLAGS) for i in range(n)]
    batch_tokens = DEFAULT_RUN["batch"]["sequences"] * DEFAULT_RUN["model"]["seq_len"]
    try:
        start_swarm(daemons)
        started = time.monotonic()
        seen: set[int] = set()

        def done_yet() -> bool:
            seen.add(pipelines(daemons))
            return updates(daemons) >= steps

        wait_for(done_yet, 3600, f"{steps} updates of shard (0, 0)")
        seconds = time.monotonic() - started
        done, made, width = trained_batches(daemons, batch_tokens), updates(daemons), pipelines(daemons)
        late = served_staleness(daemons)
        out = root / "exported"
        daemons[0].export(out)
        shape = ModelShape.from_dict(DEFAULT_RUN["model"])
        _, held_out = train_eval_split(load_corpus("builtin"), shape.seq_len, seed=run_seed(run_id))
        loss = held_out_loss(AutoModelForCausalLM.from_pretrained(out), held_out, sequences=HELD_OUT_SEQUENCES)
        return SwarmRun(run_id, seconds, done, made, width, late, tuple(sorted(seen - {0})), loss)
    finally:
        for d in daemons:
            d.stop(timeout=60)
        shutil.rmtree(root, ignore_errors=True)


def reference_curve(run_id: str, batches: int) -> list[tuple[int, float]]:
    """Held-out loss of the synchronous reference at about ``CURVE_POINTS`` steps from 0 to ``batches``."""
    shape = ModelShape.from_dict(DEFAULT_RUN["model"])
    seed = run_seed(run_id)
    train, held_out = train_eval_split(load_corpus("builtin"), shape.seq_len, seed=seed)
    b, opt = DEFAULT_RUN["batch"], DEFAULT_RUN["optimizer"]
    settings = TrainConfig(
        seed=seed,
        steps=batches,
        batch_sequences=b["sequences"],
        micro_batch=b["micro_batch"],
        lr=opt["lr"],
        weight_decay=opt["weight_decay"],
        stages=DEFAULT_RUN["stages"],
        wire=shape.wire_half,
    )
    every = max(1, batches // CURVE_POINTS)
    curve: list[tuple[int, float]] = []

    def score(step: int, model: torch.nn.Module) -> None:
        if step % every == 0 or step == batches:
            curve.append((step, held_out_loss(model, held_out, sequences=HELD_OUT_SEQUENCES)))

    train_reference(shape, train, settings, on_weights=score)
    return curve


def loss_at(curve: list[tuple[int, float]], step: float) -> float:
    """The curve's loss at ``step`` (linear between its points; its ends outside them)."""
    if step <= curve[0][0]:
        return curve[0][1]
    for (s0, l0), (s1, l1) in zip(curve, curve[1:], strict=False):
        if step <= s1:
            return l0 + (l1 - l0) * (step - s0) / (s1 - s0)
    return curve[-1][1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--daemons", type=int, default=4)
    parser.add_argument("--local-steps", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--steps", type=int, default=100, help="updates of shard (0, 0): outer steps for H > 1")
    parser.add_argument(
        "--tolerance", type=float, default=0.05, help="nats the swarm may end above the predicted loss and agree"
    )
    args = parser.parse_args()
    busy, cores = os.getloadavg()[0], os.cpu_count() or 1
    if busy > cores / 2:
        # Under load the daemons' pipelines stall unevenly (leases lapse, one pipeline trains
        # alone, rounds arrive late): the gap measured then is the load's, not the exchange's.
        print(f"warning: load average {busy:.1f} on {cores} cores; run this on an otherwise idle machine", flush=True)
    shape = ModelShape.from_dict(DEFAULT_RUN["model"])
    params = float(sum(p.numel() for p in build_model(shape, 0).parameters()))
    print(
        f"{args.daemons} daemons, default run ({params:,.0f} parameters), {args.steps} updates per H; held-out loss "
        f"over {HELD_OUT_SEQUENCES} sequences; agreement: the swarm within {args.tolerance} nats of the predicted loss "
        "or below it",
        flush=True,
    )
    print(
        "| H | N | N seen | late | outer lr | updates | batches | seconds | start | reference | swarm | gap "
        "| model efficiency | predicted loss | predicted gap | measured efficiency | agrees |\n"
        "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
        flush=True,
    )
    for h in args.local_steps:
        run = swarm_loss(args.daemons, h, args.steps)
        curve = reference_curve(run.run_id, round(run.batches))
        ref = loss_at(curve, run.batches)
        # Each pipeline's inner step is its share of the run's batch.
        share = DEFAULT_RUN["batch"]["sequences"] * shape.seq_len / max(1, run.pipelines)
        efficiency = token_efficiency(params, max(1, run.pipelines), h, share, run.staleness if h > 1 else 0.0)
        predicted = loss_at(curve, efficiency * run.batches)
        needed, _ = tokens_to_reach(curve, run.loss, 1)
        outer = outer_step_for(h)[0] if h > 1 else 0.0
        seen = "/".join(map(str, run.pipelines_seen))
        print(
            f"| {h} | {run.pipelines} | {seen} | {run.staleness:.2f} | {outer:.3f} | {run.updates} "
            f"| {run.batches:.0f} | {run.seconds:.0f} "
            f"| {curve[0][1]:.3f} | {ref:.3f} | {run.loss:.3f} | {run.loss - ref:+.3f} | {efficiency:.2f} "
            f"| {predicted:.3f} | {predicted - ref:+.3f} | {needed / run.batches:.2f} "
            f"| {'yes' if run.loss <= predicted + args.tolerance else 'NO'} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
