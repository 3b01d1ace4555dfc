"""Held-out loss of N real daemons against the synchronous reference at equal tokens, per H.

    .venv/bin/python tests/benchmarks/bench_loss_gap.py [--daemons 4] [--local-steps 1 4 16] [--batches 150]

For each H: create the default run with ``[exchange] local_steps = H`` (1: gradient mode,
synchronous SGD over the pipelines; more: DiLoCo rounds of H inner steps and an outer Nesterov
step on the pseudo-gradients), start the daemons on 127.0.0.1, train until shard (0, 0) has
applied ``--batches`` batches' worth of tokens, gather and export the weights, and score them
on held-out data beside the single-process synchronous reference trained on as many tokens
(``--batches`` AdamW steps of the run's batch, rounded to the wire's precision where the stages
cut). Prints the gap per H, and the time it took.
Figures only; nothing is asserted (tests/integration/test_swarm_training.py asserts H = 1).
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from transformers import AutoModelForCausalLM

from swarmd.models.build import build_model
from swarmd.models.data.corpus import load_corpus, train_eval_split
from swarmd.models.presets import DEFAULT_RUN
from swarmd.models.reference import TrainConfig, held_out_loss, train_reference
from swarmd.models.shape import ModelShape
from swarmd.peers.records.run_spec import run_seed
from swarmd.system.local_swarm import LocalDaemon, create_run, start_swarm, wait_for

FLAGS = ["--heartbeat-interval", "1", "--heartbeat-ttl", "6", "--threads", "1"]


def training(daemon: LocalDaemon) -> dict[str, Any]:
    try:
        return (daemon.status() or {}).get("training") or {}
    except Exception:
        return {}


def trained_batches(daemons: list[LocalDaemon], batch_tokens: int) -> float:
    return max((training(d).get("trained_tokens") or 0) for d in daemons) / batch_tokens


def swarm_loss(n: int, local_steps: int, batches: int) -> tuple[str, float, float, float]:
    """(run ID, seconds, batches trained, held-out loss of the exported weights)."""
    root = Path(tempfile.mkdtemp(prefix="swarmd-gap-", dir="/tmp"))
    spec = root / "run.json"
    spec.write_text(json.dumps({**DEFAULT_RUN, "exchange": {**DEFAULT_RUN["exchange"], "local_steps": local_steps}}))
    run_id = create_run(root / "d0", spec)
    daemons = [LocalDaemon(root / f"d{i}", run_id, FLAGS) for i in range(n)]
    batch_tokens = DEFAULT_RUN["batch"]["sequences"] * DEFAULT_RUN["model"]["seq_len"]
    try:
        start_swarm(daemons)
        started = time.monotonic()
        wait_for(lambda: trained_batches(daemons, batch_tokens) >= batches, 1800, f"{batches} batches trained")
        seconds = time.monotonic() - started
        done = trained_batches(daemons, batch_tokens)
        out = root / "exported"
        daemons[0].export(out)
        shape = ModelShape.from_dict(DEFAULT_RUN["model"])
        _, held_out = train_eval_split(load_corpus("builtin"), shape.seq_len, seed=run_seed(run_id))
        return run_id, seconds, done, held_out_loss(AutoModelForCausalLM.from_pretrained(out), held_out)
    finally:
        for d in daemons:
            d.stop(timeout=60)
        shutil.rmtree(root, ignore_errors=True)


def reference_loss(run_id: str, batches: int) -> tuple[float, float]:
    """(held-out loss at the start, after ``batches`` synchronous steps)."""
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
    _, weights = train_reference(shape, train, settings)
    model = build_model(shape, seed)
    start = held_out_loss(model, held_out)
    model.load_state_dict(weights)
    return start, held_out_loss(model, held_out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--daemons", type=int, default=4)
    parser.add_argument("--local-steps", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--batches", type=int, default=150, help="tokens to train, in batches of the run")
    args = parser.parse_args()
    print(
        f"{args.daemons} daemons, default run, {args.batches} batches of {DEFAULT_RUN['batch']['sequences']} sequences",
        flush=True,
    )
    print(f"{'H':>4} {'seconds':>8} {'batches':>8} {'start':>7} {'reference':>9} {'swarm':>7} {'gap':>7}", flush=True)
    for h in args.local_steps:
        run_id, seconds, done, swarm = swarm_loss(args.daemons, h, args.batches)
        start, ref = reference_loss(run_id, round(done))
        print(f"{h:>4} {seconds:8.0f} {done:8.1f} {start:7.3f} {ref:9.3f} {swarm:7.3f} {swarm - ref:+7.3f}", flush=True)


if __name__ == "__main__":
    main()
