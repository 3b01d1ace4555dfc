"""Throughput of the staged asynchronous pipeline against the same model trained in one process.

    .venv/bin/python tests/benchmarks/bench_pipeline.py [--updates 40] [--stages 1 2 4] [--threads 2]

Trains the default run's model (``tiny-bytes``) on the built-in corpus: once with the
single-process synchronous reference, then with the in-process pipeline at each stage count
(one parameter server, task queue and worker per stage; fp16 wire frames between stages), all
with the same torch thread count. Prints tokens/s, the ratio to the reference, where the
pipeline's time went (compute, wire encode/decode, queue bookkeeping, the rest) and the final
loss of both. Figures only; nothing is asserted. Real daemons over the network data path:
``bench_swarm.py``.
"""

from __future__ import annotations

import argparse
import time

import torch

from swarmd.local_pipeline import LocalPipeline, PipelineSettings
from swarmd.models.corpus import load_corpus, train_eval_split
from swarmd.models.presets import DEFAULT_RUN
from swarmd.models.reference import TrainSettings, train_reference
from swarmd.models.shape import ModelShape


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--updates", type=int, default=40)
    parser.add_argument("--stages", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    shape = ModelShape.from_dict(DEFAULT_RUN["model"])
    batch, micro = DEFAULT_RUN["batch"]["sequences"], DEFAULT_RUN["batch"]["micro_batch"]
    lr = DEFAULT_RUN["optimizer"]["lr"]
    train, _ = train_eval_split(load_corpus("builtin"), shape.seq_len, seed=0)
    tokens = args.updates * batch * shape.seq_len
    print(f"model {shape}; {args.updates} updates of {batch} sequences x {shape.seq_len} tokens; "
          f"{args.threads} torch threads")  # fmt: skip

    started = time.perf_counter()
    ref, _ = train_reference(shape, train, TrainSettings(seed=0, steps=args.updates, batch_sequences=batch,
                                                         micro_batch=micro, lr=lr, threads=args.threads))  # fmt: skip
    ref_s = time.perf_counter() - started
    ref_rate = tokens / ref_s
    print(f"{'reference (1 process)':<24} {ref_rate:9.0f} tokens/s   1.00x   final loss {ref[-1].loss:.3f}")

    for stages in args.stages:
        settings = PipelineSettings(seed=0, stages=stages, micro_batch=micro, accumulate=batch // micro, lr=lr,
                                    max_in_flight=2 * stages)  # fmt: skip
        pipeline = LocalPipeline(shape, train, settings)
        started = time.perf_counter()
        report = pipeline.run(args.updates)
        wall = time.perf_counter() - started
        rate = report.tokens / wall
        per = batch // micro
        losses = [loss for _, loss in sorted(report.losses)]
        final = sum(losses[(args.updates - 1) * per : args.updates * per]) / per
        other = wall - sum(report.seconds.values())
        shares = ", ".join(f"{k} {v / wall:4.0%}" for k, v in {**report.seconds, "other": other}.items())
        print(f"{f'pipeline, {stages} stage(s)':<24} {rate:9.0f} tokens/s   {rate / ref_rate:.2f}x   "
              f"final loss {final:.3f}   ({shares}; {report.dropped_stale} stale pushes dropped)")  # fmt: skip


if __name__ == "__main__":
    main()
