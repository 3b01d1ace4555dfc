"""What a token teaches: M replicas of H local steps on the swarm's own exchange, against
synchronous training of the same global batch, at equal tokens.

    .venv/bin/python tests/benchmarks/bench_token_efficiency.py [--replicas 1 2 4 8]
        [--local-steps 4 16] [--share 1] [--staleness 0] [--outer-steps 200] [--threads 2]
        [--outer 0.7:0.9 1:0] [--codec fp16 int8] [--pull-after 0 0.25] [--device cpu|cuda]
        [--corpus PATH] [--json out.json] [--plot out.png]
    .venv/bin/python tests/benchmarks/bench_token_efficiency.py --plot-from A.json B.json --plot out.png

The model is the default run's (``tiny-bytes``: a 4-layer byte-level GPT-2), its optimizer and
exchange settings the run's (inner AdamW at the run's rate, the outer Nesterov step the run's
rule gives each H, ``exchange.outer_step_for``, or ``--outer LR:MOMENTUM``; a rate of 0 is the
rule). The data is byte tokens of a corpus far larger than the
tokens a run reads (by default the Python standard library's source, which every machine with
swarmd has), so that no run sees a sequence twice; the last 1% is held out.

Every replica is the daemon's own ``CellCompute`` in local mode (one stage: the whole model):
each inner step is one share of ``--share`` micro-batches and one AdamW step, and after H of
them its pseudo-gradient (``round_base - local``) goes to one ``ParameterShard`` in local mode,
weighted by ``staleness_weight`` as the swarm's servers weigh it; the shard steps once every
replica's round is in (``M x H x k`` micro-batches, as ``step_micro_batches`` makes it for this
shape), and each replica adds the shard's fp16 deltas and rebases, as a cell does. Each
pseudo-gradient travels as ``--codec`` (fp16 by default, what a fast link takes; int8 on a
slow one) with each replica's rounding repaid in its next one, as a cell's are.
``--staleness S``: every replica pulls S outer steps late (its round starts from weights S
versions old, and its contribution counts ``staleness_weight(S)``); a fractional S makes that
share of the replicas one step later than the rest (0.5 with two replicas: one on time, one a
step late), the mix of lags a swarm's mean staleness stands for.
``--pull-after F``: the step a replica's round went into arrives F of the way through its next
round, as a cell's does in the swarm (it goes on at once from its own weights, and rebases on
the step when its deltas come, ``CellCompute.rebase``); 0 is DiLoCo's synchronous round.

Inner step ``h`` of round ``t`` reads, across the replicas, exactly the micro-batches that the
synchronous run's step ``t x H + h`` reads (M x k consecutive micro-batches): the same data in
the same order, the same global batch per step. The synchronous run is AdamW on the mean
gradient of those micro-batches (what the swarm's gradient mode computes); its held-out loss is
recorded along the way, and each local run's final loss is placed on that curve: the
**efficiency** is the tokens the synchronous run needed to reach it over the tokens the local
run used (">= 1": the local run ended below the whole synchronous curve).

H = 1 is gradient mode in the swarm: that is the synchronous run itself (efficiency 1 but for
rounding; ``tests/integration/test_swarm_training.py`` measures it through real daemons).
Figures only; nothing is asserted. ``swarmd.peers.planning.learning.token_efficiency`` is the
model these measurements are set against.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
import sysconfig
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from swarmd.models.build import build_model
from swarmd.models.cell_compute import CellCompute, flatten_parameters, unflatten_parameters
from swarmd.models.data.corpus import load_corpus, train_eval_split
from swarmd.models.data.windows import Dataset
from swarmd.models.parameter_shard import ParameterShard
from swarmd.models.presets import DEFAULT_RUN
from swarmd.models.reference import held_out_loss
from swarmd.models.shape import ModelShape
from swarmd.models.shard_config import ShardConfig
from swarmd.models.stages import StageModule, merge_stage_state_dicts
from swarmd.peers.planning.learning import token_efficiency
from swarmd.peers.taskpool.exchange import ExchangeConfig, outer_step_for, staleness_weight
from swarmd.peers.wire.codecs import ErrorFeedback, decode_vector

SEED = 1234
CORPUS_BYTES = 32 * 1024**2
"""The default corpus's size: 256K sequences of 128 bytes, more than any run here reads."""
HELD_OUT_SEQUENCES = 128


@dataclass(frozen=True)
class Result:
    replicas: int
    local_steps: int
    share: int
    staleness: float
    """The replicas' mean lag in outer steps (``replica_lags``)."""
    pull_after: float
    """The share of a round trained before the previous round's step arrives."""
    outer: tuple[float, float]
    """The outer step's learning rate and momentum."""
    codec: str
    """What each pseudo-gradient travelled as (with error feedback per replica)."""
    outer_steps: int
    tokens: int
    loss: float
    """Held-out loss of the global weights at the end."""
    sync_loss: float
    """The synchronous run's at the same tokens."""
    efficiency: float
    """Tokens the synchronous run needed for ``loss``, over ``tokens`` (capped at the curve's end)."""
    beyond_curve: bool
    """``loss`` is below every point of the synchronous curve: the efficiency is at least that."""
    model_efficiency: float
    """``learning.token_efficiency`` for this configuration and model size."""
    seconds: float


def stdlib_corpus(path: Path, limit: int = CORPUS_BYTES) -> Path:
    """The Python standard library's source, in sorted path order, up to ``limit`` bytes."""
    out = bytearray()
    for source in sorted(Path(sysconfig.get_paths()["stdlib"]).rglob("*.py")):
        try:
            out += source.read_bytes()
        except OSError:
            continue
        if len(out) >= limit:
            break
    path.write_bytes(bytes(out[:limit]))
    return path


def replica_micro_batches(step: int, replicas: int, share: int, replica: int) -> range:
    """The micro-batch indices replica ``replica`` reads at its inner step ``step``: its
    ``share`` of the ``replicas x share`` consecutive ones the synchronous run's step reads."""
    first = (step * replicas + replica) * share
    return range(first, first + share)


def replica_lags(staleness: float, replicas: int) -> list[int]:
    """How many outer steps late each replica pulls, for a mean of ``staleness`` (as near as
    ``replicas`` whole lags come): the first ``frac x replicas`` one step later than the rest."""
    whole = math.floor(staleness)
    later = round((staleness - whole) * replicas)
    return [whole + (1 if r < later else 0) for r in range(replicas)]


def micro_batches(step: int, replicas: int, share: int) -> Iterator[int]:
    """Every micro-batch index the synchronous run's step ``step`` reads (all the replicas')."""
    for r in range(replicas):
        yield from replica_micro_batches(step, replicas, share, r)


def scored(model: torch.nn.Module, shape: ModelShape, held_out: Dataset) -> float:
    """The held-out loss of ``model``'s weights, scored on the CPU (the held-out batches are there)."""
    if next(model.parameters()).device.type == "cpu":
        return held_out_loss(model, held_out, sequences=HELD_OUT_SEQUENCES)
    copy = build_model(shape, SEED)
    copy.load_state_dict({k: v.detach().cpu() for k, v in model.state_dict().items()})
    return held_out_loss(copy, held_out, sequences=HELD_OUT_SEQUENCES)


def sync_curve(
    shape: ModelShape,
    train: Dataset,
    held_out: Dataset,
    replicas: int,
    share: int,
    steps: int,
    every: int,
    device: torch.device,
) -> list[tuple[int, float]]:
    """AdamW on the mean gradient of each step's ``replicas x share`` micro-batches: the held-out
    loss after every ``every`` steps, as (steps, loss), from (0, start)."""
    opt = DEFAULT_RUN["optimizer"]
    mb = DEFAULT_RUN["batch"]["micro_batch"]
    model = build_model(shape, SEED).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=opt["lr"], weight_decay=opt["weight_decay"])
    curve = [(0, scored(model, shape, held_out))]
    count = replicas * share
    for step in range(steps):
        optimizer.zero_grad(set_to_none=True)
        for m in micro_batches(step, replicas, share):
            ids = train.micro_batch(m, mb).to(device)
            (model(input_ids=ids, labels=ids).loss / count).backward()
        optimizer.step()
        if (step + 1) % every == 0 or step + 1 == steps:
            curve.append((step + 1, scored(model, shape, held_out)))
    return curve


def local_run(
    shape: ModelShape,
    train: Dataset,
    replicas: int,
    local_steps: int,
    share: int,
    staleness: float,
    rounds: int,
    outer: tuple[float, float],
    codec: str,
    device: torch.device,
    pull_after: float = 0.0,
) -> torch.nn.Module:
    """M replicas on the swarm's exchange (module doc); returns the global weights' model.
    ``outer``: the outer step's learning rate and momentum; ``codec``: what each contribution
    travels as, with each replica's rounding kept and repaid (``codecs.ErrorFeedback``, as a
    cell's contributions); ``pull_after``: the share of the next round each replica trains
    before the step arrives (module doc)."""
    opt = DEFAULT_RUN["optimizer"]
    mb = DEFAULT_RUN["batch"]["micro_batch"]
    lags = replica_lags(staleness, replicas)
    model = build_model(shape, SEED).to(device)
    whole = [(0, shape.layers)]
    cells = [
        CellCompute(
            StageModule(model, whole, 0),
            mode="local",
            window=share,
            lr=opt["lr"],
            weight_decay=opt["weight_decay"],
        )
        for _ in range(replicas)
    ]
    start = flatten_parameters(cells[0].module)
    config = ShardConfig(
        mode="local",
        lr=opt["lr"],
        outer_lr=outer[0],
        outer_momentum=outer[1],
        keep_versions=max(lags) + 2,
    )
    server = ParameterShard(0, start.numel(), start, config, step_micro_batches=replicas * local_steps * share)
    settings = ExchangeConfig(
        batch_micro_batches=replicas * share,
        share_micro_batches=share,
        local_steps=local_steps,
        max_staleness=max(max(lags), int(opt["max_staleness"])),
        pipelines=replicas,
    )
    weights = [staleness_weight(lag, settings) for lag in lags]
    feedback = ErrorFeedback(codec)
    applied = [0] * replicas
    pull_step = min(local_steps - 1, round(pull_after * local_steps))

    def pull(r: int, cell: CellCompute) -> None:
        """Replica ``r`` takes up what is its lag's steps old by now, and rebases on it."""
        wanted = max(applied[r], server.version - lags[r])
        if wanted > applied[r]:
            deltas = server.deltas_since(applied[r])
            assert deltas is not None, "keep_versions covers the staleness"
            cell.apply_deltas(0, [(v, d) for v, d in deltas if v <= wanted])
            cell.rebase()
            applied[r] = wanted

    for t in range(rounds):
        for r, cell in enumerate(cells):
            for h in range(local_steps):
                if h == pull_step and pull_step > 0:
                    pull(r, cell)
                step = t * local_steps + h
                for m in replica_micro_batches(step, replicas, share, r):
                    ids = train.micro_batch(m, mb).to(device)
                    cell.forward_backward_last(m, ids, ids)
                cell.end_share()
        for r, cell in enumerate(cells):
            vector, count = cell.contribution()
            sent = decode_vector(feedback.encode(r, vector.cpu(), codec), vector.numel(), codec).to(device)
            found = server.contribute(sent, applied[r], count, [t * replicas + r], weights[r], sender=f"r{r}")
            if found.step is not None:
                server.confirm(found.step.version)
        if pull_step == 0:
            for r, cell in enumerate(cells):
                pull(r, cell)
    found = server.weights()
    assert found is not None
    final = build_model(shape, SEED)
    weights = unflatten_parameters(cells[0].module, found[1].cpu())
    final.load_state_dict(merge_stage_state_dicts([{k: v.cpu() for k, v in weights.items()}], shape))
    return final


def nearest(curve: list[tuple[int, float]], steps: int) -> float:
    """The synchronous run's loss at the point nearest ``steps``."""
    return min(curve, key=lambda point: abs(point[0] - steps))[1]


def tokens_to_reach(curve: list[tuple[int, float]], loss: float, tokens_per_step: int) -> tuple[float, bool]:
    """Tokens the synchronous run needed to reach ``loss`` (linear between its points, on the
    running minimum), and whether ``loss`` is below the whole curve (then its end)."""
    best: list[tuple[int, float]] = []
    for step, value in curve:
        best.append((step, min(value, best[-1][1]) if best else value))
    if loss >= best[0][1]:
        return 0.0, False  # no better than the start: it learned nothing a synchronous step would not
    for (s0, l0), (s1, l1) in zip(best, best[1:], strict=False):
        if l1 <= loss:
            fraction = 1.0 if l0 == l1 else (l0 - loss) / (l0 - l1)
            return (s0 + fraction * (s1 - s0)) * tokens_per_step, False
    return best[-1][0] * tokens_per_step, True


def plot(records: list[dict[str, Any]], params: float, path: Path) -> Path | None:
    """Three panels from ``records`` (``Result`` dictionaries, from one run or several ``--json``
    files): efficiency against replicas per H, against lateness, and against the inner batch,
    each beside ``learning.token_efficiency`` as it stands (dashed). None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot", file=sys.stderr)
        return None
    tokens = DEFAULT_RUN["batch"]["micro_batch"] * DEFAULT_RUN["model"]["seq_len"]
    on_time = [r for r in records if r["staleness"] == 0 and r.get("pull_after", 0) == 0]
    fig, (by_m, by_late, by_batch) = plt.subplots(1, 3, figsize=(15, 4.4), sharey=True)
    for i, h in enumerate(sorted({r["local_steps"] for r in on_time if r["share"] == 1})):
        rows = sorted((r for r in on_time if r["local_steps"] == h and r["share"] == 1), key=lambda r: r["replicas"])
        ms = [r["replicas"] for r in rows]
        by_m.plot(ms, [r["efficiency"] for r in rows], "o-", color=f"C{i}", label=f"H = {h}, measured")
        span = range(1, max(ms) + 1)
        by_m.plot(span, [token_efficiency(params, m, h, tokens) for m in span], "--", color=f"C{i}", label="model")
    by_m.set(xscale="log", xlabel="replicas M", ylabel="efficiency (synchronous tokens / tokens)")
    late = [r for r in records if r["share"] == 1 and (r["staleness"] > 0 or r.get("pull_after", 0) > 0)]
    for i, (m, h) in enumerate(sorted({(r["replicas"], r["local_steps"]) for r in late})):
        for key, other, marker, what in (
            ("staleness", "pull_after", "s", "steps late"),
            ("pull_after", "staleness", "^", "step arrives after"),
        ):
            rows = sorted(
                (
                    r
                    for r in late
                    if (r["replicas"], r["local_steps"]) == (m, h) and r.get(key, 0) > 0 and r.get(other, 0) == 0
                ),
                key=lambda r: r[key],
            )
            base = [r for r in on_time if (r["replicas"], r["local_steps"], r["share"]) == (m, h, 1)]
            points = [(0.0, base[0]["efficiency"])] if base else []
            points += [(r[key], r["efficiency"]) for r in rows]
            if len(points) > 1:
                by_late.plot(*zip(*points, strict=True), marker + "-", color=f"C{i}", label=f"M = {m}, H = {h}, {what}")
        grid = [x / 10 for x in range(21)]
        by_late.plot(grid, [token_efficiency(params, m, h, tokens, x) for x in grid], "--", color=f"C{i}")
    by_late.set(xlabel="late, in outer steps (of a round for the step's arrival)")
    sized = sorted((r for r in on_time if (r["replicas"], r["local_steps"]) == (4, 4)), key=lambda r: r["share"])
    if sized:
        batches = [r["share"] * tokens for r in sized]
        by_batch.plot(batches, [r["efficiency"] for r in sized], "o-", label="M = 4, H = 4, measured")
        by_batch.plot(batches, [token_efficiency(params, 4, 4, b) for b in batches], "--", label="model")
    by_batch.set(xscale="log", xlabel="inner batch, tokens a replica step")
    for ax in (by_m, by_late, by_batch):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
        ax.set_ylim(0, 1.1)
    fig.suptitle("What a token teaches on the swarm's exchange (default run's model, 100 outer steps)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replicas", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--local-steps", type=int, nargs="+", default=[4, 16])
    parser.add_argument("--share", type=int, nargs="+", default=[1], help="micro-batches per inner step")
    parser.add_argument("--staleness", type=float, nargs="+", default=[0.0], help="mean lag in outer steps")
    parser.add_argument(
        "--pull-after", type=float, nargs="+", default=[0.0], help="share of a round trained before its step arrives"
    )
    parser.add_argument("--outer-steps", type=int, default=200)
    exchange = DEFAULT_RUN["exchange"]
    parser.add_argument(
        "--outer",
        nargs="+",
        default=[f"{exchange['outer_lr']}:{exchange['outer_momentum']}"],
        metavar="LR:MOMENTUM",
        help="outer steps to run (the run's by default; LR 0: the rule for each H, exchange.outer_step_for)",
    )
    parser.add_argument(
        "--codec",
        nargs="+",
        default=["fp16"],
        choices=["fp32", "fp16", "bf16", "int8"],
        help="what the pseudo-gradients travel as (fp16: a fast link's; int8: a slow one's)",
    )
    parser.add_argument("--device", default="cpu", help="where the replicas train (cuda: a GPU); scoring is on the CPU")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--corpus", default="", help="a text file (default: the Python standard library's source)")
    parser.add_argument("--json", type=Path, default=None, help="write the results here too")
    parser.add_argument("--plot", type=Path, default=None, help="draw the results (PNG) here too")
    parser.add_argument(
        "--plot-from", type=Path, nargs="+", default=[], metavar="JSON", help="only draw these --json files to --plot"
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    shape = ModelShape.from_dict(DEFAULT_RUN["model"])
    if args.plot_from:
        records = [r for f in args.plot_from for r in json.loads(f.read_text())]
        count = float(sum(p.numel() for p in build_model(shape, SEED).parameters()))
        print(plot(records, count, args.plot or Path("token_efficiency.png")) or "nothing drawn")
        return
    corpus = args.corpus or str(stdlib_corpus(Path(tempfile.mkdtemp()) / "stdlib.txt"))
    data = load_corpus(corpus)
    train, held_out = train_eval_split(data, shape.seq_len, SEED, eval_fraction=0.01)
    mb = DEFAULT_RUN["batch"]["micro_batch"]
    longest = max(args.local_steps) * args.outer_steps
    print(
        f"{shape.family} {sum(p.numel() for p in build_model(shape, SEED).parameters()):,} parameters; "
        f"corpus {len(data):,} bytes ({len(train):,} training sequences); {args.outer_steps} outer steps on "
        f"{args.device}"
    )
    params = float(sum(p.numel() for p in build_model(shape, SEED).parameters()))
    results: list[Result] = []
    print(
        "| M | H | k | staleness | pulled after | outer lr, momentum | codec | outer steps | tokens | held-out loss "
        "| synchronous at equal tokens | efficiency | model |\n"
        "|---:|---:|---:|---:|---:|---|---|---:|---:|---:|---:|---:|---:|"
    )
    device = torch.device(args.device)
    outers = [(float(a), float(b)) for a, b in (o.split(":") for o in args.outer)]
    for replicas in args.replicas:
        for share in args.share:
            tokens_per_step = replicas * share * mb * shape.seq_len
            every = max(1, longest // 100)
            curve = sync_curve(shape, train, held_out, replicas, share, longest, every, device)
            grid = itertools.product(args.local_steps, args.staleness, args.pull_after, outers, args.codec)
            for local_steps, staleness, pull_after, given, codec in grid:
                outer = given if given[0] > 0 else outer_step_for(local_steps)
                started = time.perf_counter()
                rounds = args.outer_steps
                model = local_run(
                    shape, train, replicas, local_steps, share, staleness, rounds, outer, codec, device, pull_after
                )
                late = min(local_steps - 1, round(pull_after * local_steps)) / local_steps
                loss = held_out_loss(model, held_out, sequences=HELD_OUT_SEQUENCES)
                steps = local_steps * args.outer_steps
                needed, beyond = tokens_to_reach(curve, loss, tokens_per_step)
                tokens = steps * tokens_per_step
                result = Result(
                    replicas,
                    local_steps,
                    share,
                    staleness,
                    late,
                    outer,
                    codec,
                    args.outer_steps,
                    tokens,
                    loss,
                    nearest(curve, steps),
                    needed / tokens,
                    beyond,
                    token_efficiency(params, replicas, local_steps, share * mb * shape.seq_len, staleness + late),
                    time.perf_counter() - started,
                )
                results.append(result)
                shown = f">= {result.efficiency:.2f}" if beyond else f"{result.efficiency:.2f}"
                print(
                    f"| {replicas} | {local_steps} | {share} | {staleness:g} | {late:g} "
                    f"| {outer[0]:g}, {outer[1]:g} | {codec} "
                    f"| {args.outer_steps} | {tokens:,} | {loss:.3f} | {result.sync_loss:.3f} | {shown} "
                    f"| {result.model_efficiency:.2f} |",
                    flush=True,
                )
    if args.json is not None:
        args.json.write_text(json.dumps([asdict(r) for r in results], indent=1))
    if args.plot is not None:
        print(plot([asdict(r) for r in results], params, args.plot) or "nothing drawn")
    worst = min(results, key=lambda r: r.efficiency) if results else None
    if worst is not None and math.isfinite(worst.efficiency):
        print(f"lowest efficiency: M = {worst.replicas}, H = {worst.local_steps}: {worst.efficiency:.2f}")


if __name__ == "__main__":
    main()
