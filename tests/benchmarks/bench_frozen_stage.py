"""What a stage that never learns costs, in held-out nats against the reference, after a number
of updates of the ``tiny-llama-bpe`` preset: how far a swarm with a broken stage would end from
the reference in tests/integration/test_swarm_training.py, whose ``TOLERANCE_NATS`` must stay
well under it at its ``UPDATES``.

    .venv/bin/python tests/benchmarks/bench_frozen_stage.py [--updates 50 70 100] [--seed 7]

The reference trains as the test's does (the preset's batch, optimizer and warm-up, the hidden
state rounded at the stage cut), three ways per count: as is, and with each stage's weights put
back to their initial values after every step (its gradients computed and thrown away, as a
shard that never applies a step). Prints the end loss of each and the frozen runs' excess.
Measured (seed 7, one thread, 2026-12-07): +0.34/+0.74 nats (stage 0/1) at 50 updates,
+0.85/+1.18 at 70, +1.29/+1.65 at 100.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch

from swarmd.models.data.shard_files import PreparedData, open_prepared
from swarmd.models.lr_schedule import LrSchedule
from swarmd.models.presets import PRESETS, materialize
from swarmd.models.reference import TrainConfig, held_out_loss, reference_steps
from swarmd.models.shape import ModelShape
from swarmd.models.stages import split_layers, stage_parameter_shapes


def end_loss(
    shape: ModelShape, prepared: PreparedData, settings: TrainConfig, frozen: int | None
) -> tuple[float, float]:
    """(start, end) held-out loss of ``settings.steps`` reference steps, stage ``frozen`` held at its start."""
    names: set[str] = set()
    if frozen is not None:
        ranges = tuple(split_layers(shape.layers, settings.stages))
        names = {name for name, _ in stage_parameter_shapes(shape, ranges, frozen)}
    initial: dict[str, torch.Tensor] = {}
    assert prepared.validation is not None, "the preset holds a split out"
    start = end = float("nan")
    for step, model, _ in reference_steps(shape, prepared.train, settings):
        params = {name: p for name, p in model.named_parameters() if name in names}
        if step == 0:
            initial = {name: p.detach().clone() for name, p in params.items()}
            start = held_out_loss(model, prepared.validation)
        with torch.no_grad():
            for name, p in params.items():
                p.copy_(initial[name])
        end = held_out_loss(model, prepared.validation) if step == settings.steps else end
    return start, end


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--updates", type=int, nargs="+", default=[50, 70, 100])
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(1)
    preset = PRESETS["tiny-llama-bpe"]
    folder = Path(tempfile.mkdtemp(prefix="bench-frozen-"))
    spec = json.loads(materialize(preset, folder / "files").read_text())
    shape = ModelShape.from_dict(spec["model"])
    prepared = open_prepared(folder / "files" / "data", shape.seq_len, args.seed)
    opt = spec["optimizer"]
    for updates in args.updates:
        settings = TrainConfig(
            seed=args.seed,
            steps=updates,
            batch_sequences=spec["batch"]["sequences"],
            micro_batch=spec["batch"]["micro_batch"],
            lr=opt["lr"],
            weight_decay=opt["weight_decay"],
            schedule=LrSchedule(opt["lr"], opt.get("warmup_steps", 0), opt.get("decay_steps", 0)),
            stages=spec["stages"],
            wire=shape.wire_half,
            contribution=shape.wire_half,
            fp16_deltas=True,
            norm_bound=True,
        )
        start, reference = end_loss(shape, prepared, settings, None)
        line = f"{updates:4d} updates: start {start:.3f}, reference {reference:.3f}"
        for stage in range(spec["stages"]):
            _, frozen = end_loss(shape, prepared, settings, stage)
            line += f"; stage {stage} frozen {frozen:.3f} ({frozen - reference:+.2f})"
        print(line, flush=True)


if __name__ == "__main__":
    main()
