"""The GPU check's single-process reference: the run's model trained in one plain torch loop.

What torchtitan and nanoGPT do on one GPU: the model built from the run's shape and seed
(``build_model``), SDPA attention, bf16 autocast on CUDA with TF32 matmuls and fp32 weights,
fp32 AdamW (fused on CUDA), the run's micro-batch, its batch as gradient accumulation over
micro-batches ``step * per_step + k`` of the run's data (``Dataset.micro_batch``, the sequences
a swarm hands out for the same step), and the run's learning-rate schedule. No torch.compile,
no activation checkpointing: the daemons' defaults.

Run in its own process (``python -m tests.gpu.reference``) so that the device is wholly free
for the daemons after it, and so that its peak memory is its own. It prints nothing but its
result, one JSON object, to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from pathlib import Path
from typing import Any

import torch

from swarmd.models.build import build_model
from swarmd.models.data.shard_files import open_prepared
from swarmd.models.lr_schedule import LrSchedule
from swarmd.models.precision import ComputeSettings, start_device
from swarmd.models.shape import ModelShape
from swarmd.node.compute_probe import StageDims, measure_achieved_tflops


def train(spec: dict[str, Any], seed: int, *, steps: int, warmup: int, device: str, dtype: str) -> dict[str, Any]:
    """``steps`` optimizer steps of the run ``spec`` from ``seed``: each step's mean loss, and
    the rate (tokens/s) over the steps after the first ``warmup``."""
    shape = ModelShape.from_dict(spec["model"])
    batch, micro = spec["batch"]["sequences"], spec["batch"]["micro_batch"]
    per_step = batch // micro
    opt = spec["optimizer"]
    schedule = LrSchedule(opt["lr"], opt.get("warmup_steps", 0), opt.get("decay_steps", 0))
    prepared = open_prepared(Path(spec["data"]["manifest"]).parent, shape.seq_len, seed)
    cuda = device.startswith("cuda")
    compute = ComputeSettings(device=device, dtype=dtype)  # the cells' own autocast and TF32
    start_device(compute.torch_device)
    model = build_model(shape, seed).to(device)  # SDPA, as the stages run it
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=opt["lr"], weight_decay=opt.get("weight_decay", 0.0), fused=cuda or None
    )
    losses: list[float] = []
    started = 0.0
    try:
        for step in range(steps):
            if step == warmup:
                if cuda:
                    torch.cuda.synchronize(device)
                started = time.perf_counter()
            for group in optimizer.param_groups:
                group["lr"] = schedule.at(step)
            total = torch.zeros((), device=device)
            for k in range(per_step):
                ids = prepared.train.micro_batch(step * per_step + k, micro)
                ids = ids.pin_memory().to(device, non_blocking=True) if cuda else ids
                with compute.autocast():
                    loss = model(input_ids=ids, labels=ids).loss
                (loss / per_step).backward()
                total += loss.detach()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(float(total) / per_step)  # a sync per step, as nanoGPT's logging does
        if cuda:
            torch.cuda.synchronize(device)
        elapsed = time.perf_counter() - started
    finally:
        prepared.close()
    embedding = model.get_input_embeddings()
    measured = steps - warmup
    return {
        "seed": seed,
        "losses": losses,
        "tokens_per_s": measured * batch * shape.seq_len / elapsed if measured > 0 and elapsed > 0 else None,
        "measured_steps": measured,
        "params": sum(p.numel() for p in model.parameters()),
        "embedding_params": sum(p.numel() for p in embedding.parameters()) if embedding is not None else 0,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", type=Path, required=True, help="the run spec (JSON) the daemons were given")
    parser.add_argument("--seed", type=int, action="append", required=True, help="the timed seed first, then others")
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--warmup", type=int, required=True, help="steps not timed")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", choices=("bf16", "fp32"), default="fp32")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    cuda = args.device.startswith("cuda")
    if cuda:
        torch.cuda.reset_peak_memory_stats(args.device)
    spec = json.loads(args.spec.read_text())
    result: dict[str, Any] = {"device": args.device, "dtype": args.dtype, "threads": torch.get_num_threads()}
    if cuda:
        result["device_name"] = torch.cuda.get_device_name(args.device)
        result["total_bytes"] = int(torch.cuda.get_device_properties(args.device).total_memory)
    else:
        # The CPU has no rated bf16 figure: what the daemon's probe measures for the run's block,
        # fp32 on these threads, stands in for it.
        result["device_name"] = "cpu"
        dims = StageDims.of_run(ModelShape.from_dict(spec["model"]), spec["batch"]["micro_batch"])
        probe = measure_achieved_tflops("cpu", "fp32", torch.get_num_threads(), dims, run_shapes=True)
        result["measured_gflops"] = probe.achieved_tflops * 1000
    runs = []
    for i, seed in enumerate(args.seed):
        runs.append(train(spec, seed, steps=args.steps, warmup=args.warmup, device=args.device, dtype=args.dtype))
        if i == 0:  # the timed run's peak: the others only give their losses
            result["peak_bytes"] = (
                int(torch.cuda.max_memory_allocated(args.device))
                if cuda
                else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
            )
        if cuda:
            torch.cuda.empty_cache()
    result["runs"] = runs
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
