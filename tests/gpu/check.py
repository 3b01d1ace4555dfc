"""The GPU check (issue 28): a ~350M Llama trained by one process, one daemon and two daemons.

``tests/gpu/check.sh`` runs this after setting up ``.venv``. On one GPU, with nothing prepared:

1. the built-in corpus is made into a BPE tokenizer and token shards (``presets.materialize``:
   nothing is downloaded), and two runs of one model are created, one of one stage and one of
   two (``swarmd run create``; each run's seed comes from its ID);
2. the reference (``tests.gpu.reference``, its own process) trains the model ``--steps`` steps
   from each run's seed, timed on the first;
3. one daemon trains the one-stage run alone: its rate between update ``--warmup`` and
   ``--steps``, its losses, its peak memory; ``swarmd doctor`` runs against it;
4. two daemons, each capped at half the GPU's memory (``[limits] gpu_memory_gib``), train the
   two-stage run as a pipeline; NVML's view of them and their caps are checked;
5. the table (tokens/s, MFU against the device's rated bf16 TFLOPS, peak memory per process,
   the loss over the last steps against the reference's) is printed and written as markdown
   and JSON to ``--out``; then the issue's goals (printed, never failing).

It exits 1 only when a step fails: a daemon does not train, a loss is NaN, a loss is further
from the reference's than ``LOSS_TOLERANCE_NATS``, or a check of a CUDA branch fails.

``--cpu`` runs the same steps on a tiny Llama in fp32 on the CPU (the dry run): MFU is then
against the CPU's measured fp32 matmul throughput (``measure_throughput_gflops``), not a
rating, and the CUDA-only checks say they were skipped.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from swarmd.models.presets import Preset, materialize
from swarmd.models.shape import ModelShape
from swarmd.node.rated_tflops import rated_tflops  # the daemon's table: doctor's MFU and this one agree
from swarmd.peers.records.run_spec import run_seed
from swarmd.system.local_swarm import create_run
from tests.gpu import daemons as d
from tests.gpu import device_checks as checks
from tests.gpu.figures import Row, compare_losses, flops_per_token, goals, markdown_table, mfu
from tests.gpu.figures import step_losses as by_step

LOSS_WINDOW = 5
"""Steps whose mean training loss is compared (the last ones both reached)."""
LOSS_TOLERANCE_NATS = 0.1
"""How far a daemon's mean loss over ``LOSS_WINDOW`` steps may be from the reference's. The
daemons compute what the reference does (synchronous AdamW over the same micro-batches from
the same weights), but the swarm's data path rounds: contributions in the run's half with
error feedback, fp16 deltas, the hidden state in bf16 between stages, a shard server's norm
bound on a spike. The --cpu dry run measured gaps under 0.001 nats, one daemon and two
(docs/results.md): a broken data path costs far more (a stage that stops learning, +1.9)."""
LOSS_TOLERANCE_MOVED_NATS = 0.4
"""The same, for a row in which a cell or shard changed hands while it trained (the first plan
may move what the provisional assignment placed): the share in flight is dropped and trained
again on weights a step on, which moves a small model's loss as reordering batches does
(test_swarm_training.py holds a swarm with such events to 0.4 for that reason). One such
--cpu run ended +0.184 from the reference where a join handed work over at update 4."""


@dataclass(frozen=True)
class Setup:
    """The model, batch and budgets of one mode."""

    spec: dict[str, Any]
    tokenizer_vocab: int
    shard_tokens: int
    steps: int
    warmup: int
    start_s: float
    """Most seconds from a row's start to its ``warmup``-th update (start, join, build, first steps)."""
    budget_s: float
    """Most seconds for the timed updates; a row past it is timed on the updates it made."""
    device: str
    dtype: str
    threads: int
    """torch threads of the reference and of each daemon (0: the cores, shared among a row's daemons)."""


def _spec(model: dict[str, Any], batch: int, micro: int, lr: float, warmup_steps: int) -> dict[str, Any]:
    return {
        "name": "gpu-check",
        "model": model,
        "data": {},
        "batch": {"sequences": batch, "micro_batch": micro},
        "optimizer": {
            "name": "adamw",
            "lr": lr,
            "weight_decay": 0.1,
            "max_staleness": 4,
            "warmup_steps": warmup_steps,
        },
        "stages": 1,
        # Synchronous (H = 1) and the mean, as the reference steps (test_swarm_training.py).
        "exchange": {"local_steps": 1, "outer_lr": 0.0, "outer_momentum": 0.9, "aggregation": "mean"},
        # No held-out scoring: it would take the timed daemons' compute.
        "eval": {"every": 0, "sequences": 1},
    }


GPU = Setup(
    # 24 x (attention 2.6M with 4 KV heads + SwiGLU 8.7M) + embedding and head of 32.8M each: 336M.
    spec=_spec(
        {
            "family": "llama",
            "layers": 24,
            "hidden": 1024,
            "heads": 16,
            "kv_heads": 4,
            "intermediate": 2816,
            "vocab": 32000,
            "seq_len": 2048,
        },
        batch=32,
        micro=8,
        lr=6e-4,
        warmup_steps=5,
    ),
    tokenizer_vocab=32000,  # the built-in corpus gives about 6,700 ids: the model's vocab stays 32,000
    shard_tokens=65536,
    steps=20,
    warmup=4,
    start_s=120,
    budget_s=90,
    device="cuda",
    dtype="bf16",
    threads=0,
)
CPU = Setup(
    spec=_spec(
        {"family": "llama", "layers": 4, "hidden": 64, "heads": 4, "kv_heads": 2, "vocab": 512, "seq_len": 128},
        batch=16,
        micro=4,
        lr=2e-3,
        warmup_steps=5,
    ),
    tokenizer_vocab=512,
    shard_tokens=16384,
    steps=20,
    warmup=4,
    start_s=240,
    budget_s=240,
    device="cpu",
    dtype="fp32",
    # One each: more threads than free cores make torch's threads wait on each other (a tiny
    # model's micro-batch took 10x longer with 2 threads on 2 busy cores than with one).
    threads=1,
)


def prepare(setup: Setup, out: Path) -> tuple[Path, dict[str, Any], list[str]]:
    """The data, the two run specs and their run IDs (one stage, two stages)."""
    spec_path = materialize(
        # A held-out split, though nothing scores it: a daemon refuses prepared data without one.
        Preset(setup.spec, "the GPU check's model", setup.tokenizer_vocab, setup.shard_tokens, 0.05),
        out / "files",
        lambda line: print("  " + line, flush=True),
    )
    spec = json.loads(spec_path.read_text())
    run_ids = []
    for stages, name in ((1, "one"), (2, "two")):
        path = out / f"{name}.json"
        path.write_text(json.dumps({**copy.deepcopy(spec), "name": f"gpu-check-{name}", "stages": stages}))
        run_ids.append(create_run(out / name / "d0", path))
    return out / "one.json", spec, run_ids


def reference(setup: Setup, spec_path: Path, seeds: list[int], threads: int, out: Path) -> dict[str, Any]:
    result = out / "reference.json"
    command = [sys.executable, "-m", "tests.gpu.reference", "--spec", str(spec_path), "--out", str(result)]
    command += [f"--seed={s}" for s in seeds]
    command += ["--steps", str(setup.steps), "--warmup", str(setup.warmup), "--device", setup.device]
    command += ["--dtype", setup.dtype, "--threads", str(threads)]
    subprocess.run(command, check=True, timeout=600, cwd=Path(__file__).parents[2])
    return dict(json.loads(result.read_text()))


class Check:
    """The steps of one check, their rows and check lines; ``failures`` says what failed."""

    def __init__(self, setup: Setup, out: Path, rated_override: float | None) -> None:
        self.setup, self.out = setup, out
        self.rated_override = rated_override
        self.cuda = setup.device.startswith("cuda")
        self.cores = setup.threads or len(os.sched_getaffinity(0))
        self.rows: list[Row] = []
        self.lines: list[checks.CheckLine] = []
        self.failures: list[str] = []
        self.facts: dict[str, Any] = {}
        shape = ModelShape.from_dict(setup.spec["model"])
        self.shape = shape
        self.per_step = setup.spec["batch"]["sequences"] // setup.spec["batch"]["micro_batch"]
        self.tokens_per_update = setup.spec["batch"]["sequences"] * shape.seq_len

    def run(self) -> None:
        started = time.monotonic()
        print(f"[1/4] data and runs in {self.out}", flush=True)
        spec_path, _, run_ids = prepare(self.setup, self.out)
        seeds = [run_seed(r) for r in run_ids]
        print(f"[2/4] reference: {self.setup.steps} steps from each run's seed {seeds}", flush=True)
        ref = reference(self.setup, spec_path, seeds, self.cores, self.out)
        self._reference_row(ref)
        print(f"      {ref['runs'][0]['tokens_per_s']:,.0f} tokens/s on {ref['device_name']}", flush=True)
        config = d.config_toml(device=self.setup.device, precision=self.setup.dtype)
        print("[3/4] one daemon, the one-stage run", flush=True)
        one = [d.make_daemon(self.out / "one", "d0", run_ids[0], config=config, threads=self.cores)]
        self._daemon_row("one daemon", one, ref["runs"][0]["losses"], doctor=True)
        total = int(ref.get("total_bytes", 0))  # CUDA only
        cap = total / 2 / 2**30
        config = d.config_toml(device=self.setup.device, gpu_memory_gib=cap, precision=self.setup.dtype)
        print("[4/4] two daemons, the two-stage run" + (f", {cap:.1f} GiB each" if self.cuda else ""), flush=True)
        data = self.out / "files" / "data"
        half = self.setup.threads or max(1, self.cores // 2)
        two = [
            d.make_daemon(self.out / "two", f"d{i}", run_ids[1], config=config, threads=half, data_dir=data)
            for i in range(2)
        ]
        self._daemon_row("two daemons, 2 stages", two, ref["runs"][1]["losses"], cap_gib=cap, total=total)
        self.facts["wall_s"] = round(time.monotonic() - started, 1)

    def _rated_flops(self, ref: dict[str, Any]) -> tuple[float | None, str]:
        if self.rated_override:
            return self.rated_override * 1e12, f"{self.rated_override:g} TFLOPS (given)"
        if not self.cuda:
            gflops = float(ref["measured_gflops"])
            return gflops * 1e9, (
                f"{gflops:.1f} GFLOP/s, the CPU's fp32 matmul throughput measured on {ref['threads']} thread(s), "
                "not a rating"
            )
        tflops = rated_tflops(ref["device_name"])
        if tflops is None:
            return None, f"{ref['device_name']} is not in the table of ratings: pass --rated-tflops"
        return tflops * 1e12, f"{tflops:g} TFLOPS, {ref['device_name']}'s rated dense bf16"

    def _reference_row(self, ref: dict[str, Any]) -> None:
        first = ref["runs"][0]
        self.flops_token = flops_per_token(
            params=first["params"],
            embedding_params=first["embedding_params"],
            layers=self.shape.layers,
            hidden=self.shape.hidden,
            seq_len=self.shape.seq_len,
        )
        self.rated, rated_text = self._rated_flops(ref)
        self.facts.update(
            device=ref["device_name"],
            dtype=ref["dtype"],
            params=first["params"],
            embedding_params=first["embedding_params"],
            flops_per_token=self.flops_token,
            rated=rated_text,
            steps=self.setup.steps,
            warmup=self.setup.warmup,
            tokens_per_update=self.tokens_per_update,
            threads=ref["threads"],
        )
        losses = first["losses"]
        if not all(math.isfinite(x) for x in losses):
            self.failures.append(f"the reference's losses are not all finite: {losses}")
        steps = dict(enumerate(losses))
        loss = compare_losses(steps, losses, window=LOSS_WINDOW, tolerance=LOSS_TOLERANCE_NATS)
        tps = first["tokens_per_s"]
        self.rows.append(
            Row("reference", tps, self._mfu(tps), [ref["peak_bytes"]], loss, f"{first['measured_steps']} timed steps")
        )

    def _mfu(self, tps: float | None) -> float | None:
        return None if tps is None or self.rated is None else mfu(tps, self.flops_token, self.rated)

    def _daemon_row(
        self,
        name: str,
        daemons: list[Any],
        reference_losses: list[float],
        *,
        doctor: bool = False,
        cap_gib: float = 0.0,
        total: int = 0,
    ) -> None:
        watch = d.TrainingWatch(daemons, tokens_per_update=self.tokens_per_update, cuda=self.cuda)
        try:
            d.start_all(daemons)
            setup = self.setup
            found = watch.measure(
                warmup=setup.warmup, steps=setup.steps, start_s=setup.start_s, budget_s=setup.budget_s
            )
            if len(daemons) > 1:
                if self.cuda:
                    self.lines += checks.gpu_memory_cap(found.statuses, cap_gib, total)
                    self.lines += checks.nvml_sees(daemons)
                else:
                    self.lines += checks.skipped_without_cuda()
            if doctor:
                self.lines.append(checks.doctor(daemons[0], d.config_path(daemons[0])))
        except Exception as e:  # a daemon that does not start or dies: the row fails, the check goes on
            found = d.Measured(problem=f"{type(e).__name__}: {e}")
        finally:
            codes = d.stop(daemons)
        note = f"{found.timed_updates} timed updates; {d.layout(found.statuses)}" if found.statuses else ""
        if found.problem:
            self.failures.append(f"{name}: {found.problem}")
            note = found.problem.splitlines()[0]
        if any(c not in (0, None) for c in codes):
            note += f"; exit codes {codes}"
        tolerance = LOSS_TOLERANCE_NATS
        if found.moved_at:
            tolerance = LOSS_TOLERANCE_MOVED_NATS
            note += f"; cells or shards changed hands at update(s) {found.moved_at}: loss tolerance {tolerance}"
        steps = by_step(found.losses, self.per_step)
        last = self.setup.steps - 1
        loss = compare_losses(steps, reference_losses, window=LOSS_WINDOW, tolerance=tolerance, upto=last)
        if not found.problem:
            if loss is None:
                self.failures.append(f"{name}: no step's losses to compare (losses seen: {len(found.losses)})")
            elif not loss.within:
                self.failures.append(
                    f"{name}: mean loss {loss.loss:.4f} over steps {loss.first_step}-{loss.last_step} is "
                    f"{loss.gap:+.4f} from the reference's {loss.reference:.4f} (tolerance {loss.tolerance})"
                )
        self.rows.append(Row(name, found.tokens_per_s, self._mfu(found.tokens_per_s), found.peak_bytes, loss, note))

    def report(self) -> str:
        f = self.facts
        lines = [
            f"device {f.get('device')}, {f.get('dtype')}; {f.get('params', 0) / 1e6:.1f}M parameters "
            f"({f.get('embedding_params', 0) / 1e6:.1f}M embedding), {f.get('flops_per_token', 0) / 1e9:.3f} GFLOP "
            f"a token (6 x non-embedding parameters + 12 x layers x hidden x seq); MFU against {f.get('rated')}",
            f"{f.get('steps')} steps of {f.get('tokens_per_update')} tokens, timed after step {f.get('warmup')}; "
            f"loss: mean of the last {LOSS_WINDOW} steps both reached, tolerance {LOSS_TOLERANCE_NATS} nats",
            "",
            markdown_table(self.rows),
            "",
            *(g.line() for g in goals(self.rows)),
            *(c.line() for c in self.lines),
        ]
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {
            **self.facts,
            "rows": [r.to_json() for r in self.rows],
            "goals": [{"what": g.what, "value": g.value, "target": g.target, "met": g.met} for g in goals(self.rows)],
            "checks": [{"name": c.name, "outcome": c.outcome, "found": c.found} for c in self.lines],
            "failures": self.failures,
        }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tests/gpu/check.sh", description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", action="store_true", help="the dry run: a tiny Llama in fp32 on the CPU")
    parser.add_argument("--out", type=Path, help="where the table, the runs and the logs go (default: a temp dir)")
    parser.add_argument("--steps", type=int, help="optimizer steps of each row (default: the mode's)")
    parser.add_argument("--rated-tflops", type=float, help="the device's rated bf16 TFLOPS (one not in the table)")
    parser.add_argument(
        "--precision", choices=("bf16", "fp32"), help="what every row computes in (default: bf16 on a GPU, fp32 --cpu)"
    )
    args = parser.parse_args(argv)
    setup = CPU if args.cpu else GPU
    if args.precision:
        setup = Setup(**{**setup.__dict__, "dtype": args.precision})
    if args.steps:
        setup = Setup(**{**setup.__dict__, "steps": args.steps, "warmup": min(setup.warmup, args.steps - 1)})
    if setup.steps < 2:
        parser.error(f"--steps {setup.steps}: at least 2 (one warm-up step, one timed)")
    if not args.cpu:
        import torch

        if not torch.cuda.is_available():
            print(
                f"no CUDA device: torch {torch.__version__} sees none. Run with --cpu for the dry run, or install "
                "a CUDA build of torch into .venv (rm -rf .venv; bash packaging/dev-env.sh).",
                file=sys.stderr,
            )
            return 2
    out = args.out or Path(tempfile.mkdtemp(prefix="swarmd-gpu-check-"))
    out.mkdir(parents=True, exist_ok=True)
    check = Check(setup, out, args.rated_tflops)
    try:
        check.run()
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
        check.failures.append(f"a step's process failed: {e}")
    text = check.report()
    (out / "gpu-check.md").write_text(text + "\n")
    (out / "gpu-check.json").write_text(json.dumps(check.to_json(), indent=1) + "\n")
    print("\n" + text)
    print(f"\nwall time {check.facts.get('wall_s', '-')} s; written to {out}/gpu-check.md and .json")
    for failure in check.failures:
        print(f"FAILED: {failure}")
    failed_checks = [c.name for c in check.lines if c.outcome == "fail"]
    if failed_checks:
        print(f"FAILED checks: {', '.join(failed_checks)}")
    return 1 if check.failures or failed_checks else 0


if __name__ == "__main__":
    raise SystemExit(main())
