"""Does training get faster as the swarm grows? Issue 14's table (figures, no assertions).

    .venv/bin/python tests/benchmarks/bench_scaling.py [--hours 1] [--sizes 16 64 256 1000] [--out DIR]
    .venv/bin/python tests/benchmarks/bench_scaling.py --plot-from A/scaling.json B/scaling.json --out DIR
    .venv/bin/python tests/benchmarks/bench_scaling.py --predict [--sizes ...] [--time-budget 5]

Synthetic scenarios (``swarmd.peers.planning.scenario_gen``, three regions) of each size, with
and without churn, for two models: one that fits one large device (``SMALL_MODEL``, 200M) and
one that must be pipelined (1.3B: 24 layers, hidden 2048; with its optimizer state it needs
more than any 16-24 GiB device has). Each is planned by swarmd's planner (its shape and its
time are reported) and simulated on the new data path (``swarmd.peers.sim``) for ``--hours``.

The table: trained tokens/s (the micro-batches of the contributions applied in committed
updates, times their tokens, over the time) beside the compute bound (the live devices'
TFLOPS over the flops per token, time-averaged under churn) and the fastest single device
alone; the shape (stages x pipelines, shards per stage, H, k); then where the time went
(shares, exchanges, pulls, commits and waits) and the busiest interface, the first place to
look for the bottleneck. Issue 14's targets are judged on it: trained tokens/s rises at every
step from 16 to 1,000 devices, and at 1,000 with churn reaches 10% of the compute bound and
10x the fastest single device. Beside raw tokens/s, each row prices what those tokens teach
(``learning.token_efficiency`` of the run's plan: its pipelines as replicas, H and the applied
contributions' staleness) and their product, effective tokens/s, which the planner maximises;
``--predict`` prints only the plans and the planner's predictions (seconds, not hours). A PNG
of tokens/s against devices goes to ``--out`` when matplotlib is installed.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from swarmd.peers.planning.learning import token_efficiency
from swarmd.peers.planning.planner import PlannerConfig, plan
from swarmd.peers.planning.scenario import Scenario, interface_rates
from swarmd.peers.planning.scenario_gen import SMALL_MODEL, synthetic_scenario
from swarmd.peers.planning.throughput import ThroughputModel
from swarmd.peers.sim.results import SimResult, single_device
from swarmd.peers.sim.simulator import SimConfig, simulate
from swarmd.peers.sim.strategies import make_strategies

PIPELINED_MODEL = {"layers": 24, "hidden": 2048, "seq_len": 2048, "vocab": 50257, "params": 1.3e9, "dtype_bytes": 2}
MODELS = {"200M": SMALL_MODEL, "1.3B": PIPELINED_MODEL}
PHASES = (
    "share",
    "round",
    "contribution",
    "pull",
    "commit_lag",
    "wait_backpressure",
    "wait_ledger",
    "wait_cells",
    "wait_sync",
)


@dataclass
class Row:
    model: str
    devices: int
    churn: bool
    plan_s: float
    result: SimResult
    alone: float | None
    busiest: str
    efficiency: float
    """What a trained token teaches against synchronous training (``learning.token_efficiency``)."""

    @property
    def effective_tokens_per_s(self) -> float:
        return self.result.tokens_per_s * self.efficiency


def efficiency(scenario: Scenario, result: SimResult) -> float:
    """``token_efficiency`` of the run's first plan: its pipelines as replicas, H and, in local
    mode, the applied contributions' mean staleness (in outer steps)."""
    applied = sum(result.staleness.values())
    stale = sum(s * n for s, n in result.staleness.items()) / applied if applied and result.local_steps > 1 else 0.0
    return token_efficiency(scenario.model.params, result.shape[1], result.local_steps, stale)


def busiest_interface(scenario: Scenario, result: SimResult) -> str:
    """The device whose uplink or downlink carried the most of its capacity over the run,
    with what it did at the end: where a bottleneck shows first."""
    up, down = interface_rates(scenario.bandwidth_Bps)
    horizon = result.hours * 3600.0
    used_up = np.asarray(result.sent_bytes) / (up * horizon)
    used_down = np.asarray(result.received_bytes) / (down * horizon)
    d_up, d_down = int(np.argmax(used_up)), int(np.argmax(used_down))
    if used_up[d_up] >= used_down[d_down]:
        d, way, used = d_up, "up", float(used_up[d_up])
    else:
        d, way, used = d_down, "down", float(used_down[d_down])
    roles = result.roles.get(d, [])
    shown = ", ".join(sorted({r.split(" ")[0] for r in roles})) or "no role at the end"
    return f"{scenario.devices[d].id} {way} {used:.0%} ({shown})"


def run_one(model: str, n: int, churn: bool, hours: float, seed: int, time_budget_s: float) -> Row:
    scenario = synthetic_scenario(n, regions=3, seed=seed, churn=churn, model=MODELS[model])
    started = time.perf_counter()
    shape = plan(scenario, PlannerConfig(time_budget_s=time_budget_s, seed=seed)).shape
    plan_s = time.perf_counter() - started
    (strategy,) = make_strategies(["swarmd"], shape, time_budget_s, seed)
    result = simulate(scenario, strategy, SimConfig(hours=hours, seed=seed, churn=churn))
    return Row(
        model,
        n,
        churn,
        plan_s,
        result,
        single_device(scenario).tokens_per_s,
        busiest_interface(scenario, result),
        efficiency(scenario, result),
    )


def predictions(models: list[str], sizes: list[int], churn: str, seed: int, time_budget_s: float) -> str:
    """The plan of each scenario and what the planner predicts for it: raw tokens/s, what a
    token teaches (``learning.token_efficiency``), and their product, which it maximises."""
    lines = [
        "| model | devices | churn | shape S x N | H | k | raw tokens/s | efficiency | effective tokens/s | plan s |",
        "|---|---:|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for model in models:
        for n in sizes:
            for on in {"both": (False, True), "on": (True,), "off": (False,)}[churn]:
                scenario = synthetic_scenario(n, regions=3, seed=seed, churn=on, model=MODELS[model])
                started = time.perf_counter()
                found = plan(scenario, PlannerConfig(time_budget_s=time_budget_s, seed=seed))
                took = time.perf_counter() - started
                p = ThroughputModel(scenario).evaluate(found)
                lines.append(
                    f"| {model} | {n:,} | {'yes' if on else 'no'} | {found.shape.stages} x {found.shape.data_parallel} "
                    f"| {found.local_steps} | {found.micro_batches_per_share(scenario)} | {p.tokens_per_s:,.0f} "
                    f"| {p.efficiency:.2f} | {p.effective_tokens_per_s:,.0f} | {took:.1f} |"
                )
    return "\n".join(lines)


def groups(sizes: tuple[int, ...]) -> str:
    """The reduction groups after the shard counts, where a stage has them."""
    return f" (G {'/'.join(map(str, sizes))})" if max(sizes, default=1) > 1 else ""


def table(rows: list[Row]) -> str:
    lines = [
        "| model | devices | churn | shape S x N | K per stage (G) | H | k | plan s | trained tokens/s | efficiency "
        "| effective tokens/s | compute bound | of bound | single device | x single | updates | lost "
        "| shares recomputed | stale dropped | sim s |",
        "|---|---:|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        r = row.result
        alone = f"{row.alone:,.0f}" if row.alone is not None else "cannot hold it"
        times = f"{r.tokens_per_s / row.alone:.2f}" if row.alone else "-"
        lines.append(
            f"| {row.model} | {row.devices:,} | {'yes' if row.churn else 'no'} | {r.shape[0]} x {r.shape[1]} "
            f"| {'/'.join(map(str, r.shards))}{groups(r.reduce_groups)} | {r.local_steps} | {r.share_micro_batches} "
            f"| {row.plan_s:.1f} "
            f"| {r.tokens_per_s:,.0f} | {row.efficiency:.2f} | {row.effective_tokens_per_s:,.0f} "
            f"| {r.compute_bound_tokens_per_s:,.0f} "
            f"| {r.tokens_per_s / r.compute_bound_tokens_per_s:.2%} | {alone} | {times} | {r.updates:,} "
            f"| {r.updates_lost} | {r.shares_recomputed:,} | {r.stale_dropped:,} | {r.wall_s:.0f} |"
        )
    lines += [
        "",
        "Where the time went (mean seconds, count) and the busiest interface (share of its capacity used):",
        "",
        "| model | devices | churn | " + " | ".join(p.replace("_", " ") for p in PHASES) + " | busiest interface |",
        "|---|---:|---|" + "---:|" * len(PHASES) + "---|",
    ]
    for row in rows:
        cells = []
        for p in PHASES:
            f = row.result.phases.get(p)
            cells.append(f"{f['mean_ms'] / 1e3:,.1f} ({f['n']:,})" if f else "-")
        lines.append(
            f"| {row.model} | {row.devices:,} | {'yes' if row.churn else 'no'} | "
            + " | ".join(cells)
            + f" | {row.busiest} |"
        )
    return "\n".join(lines)


def verdict(rows: list[Row]) -> list[str]:
    """Issue 14's targets, and issue 27's (effective tokens/s rises too), read off the table."""
    out = []
    for model in MODELS:
        for churn in (False, True):
            series = sorted((r for r in rows if r.model == model and r.churn == churn), key=lambda r: r.devices)
            if len(series) < 2:
                continue
            for what, rates in (
                ("trained tokens/s", [r.result.tokens_per_s for r in series]),
                ("effective tokens/s", [r.effective_tokens_per_s for r in series]),
            ):
                rising = all(b > a for a, b in zip(rates, rates[1:], strict=False))
                steps = " -> ".join(f"{x:,.0f}" for x in rates)
                out.append(
                    f"{model}, churn {'on' if churn else 'off'}: {what} "
                    f"{'rises' if rising else 'does NOT rise'} at every step ({steps})"
                )
    for row in rows:
        if row.devices >= 1000 and row.churn:
            r = row.result
            share = r.tokens_per_s / r.compute_bound_tokens_per_s
            vs = r.tokens_per_s / row.alone if row.alone else None
            out.append(
                f"{row.model} at {row.devices:,} with churn: {share:.2%} of the compute bound (target 10%), "
                + (
                    f"{vs:.2f}x the fastest single device (target 10x)"
                    if vs is not None
                    else "no single device holds the model"
                )
            )
    return out


def plot(records: list[dict[str, Any]], out: Path) -> Path | None:
    """Tokens/s against devices, a panel per model present, from ``record``'s dictionaries (a
    run's, or those of several runs' ``scaling.json``: ``--plot-from``)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install 'swarmd[sim]'): no plot", file=sys.stderr)
        return None
    models = [m for m in MODELS if any(r["model"] == m for r in records)]
    if not models:
        return None
    fig, axes = plt.subplots(1, len(models), figsize=(6 * len(models), 4.5), sharey=True)
    for ax, model in zip(np.atleast_1d(axes), models, strict=True):
        for churn, style in ((False, "-o"), (True, "--s")):
            series = sorted(
                (r for r in records if r["model"] == model and r["churn"] == churn), key=lambda r: r["devices"]
            )
            if not series:
                continue
            xs = [r["devices"] for r in series]
            label = "churn" if churn else "no churn"
            ax.plot(xs, [r["tokens_per_s"] for r in series], style, label=f"trained, {label}")
            ax.plot(
                xs,
                [r["compute_bound_tokens_per_s"] for r in series],
                style,
                alpha=0.35,
                label=f"compute bound, {label}",
            )
            alone = [r["single_device"] for r in series if r["single_device"]]
            if alone:
                ax.axhline(max(alone), color="grey", linestyle=":", label="fastest single device" if churn else None)
        ax.set(xscale="log", yscale="log", xlabel="devices", title=f"{model} model")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    np.atleast_1d(axes)[0].set_ylabel("tokens/s")
    fig.tight_layout()
    out.mkdir(parents=True, exist_ok=True)
    path = out / "scaling.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hours", type=float, default=1.0)
    parser.add_argument("--sizes", type=int, nargs="+", default=[16, 64, 256, 1000])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--churn", choices=("both", "on", "off"), default="both", help="which churn settings to run")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--time-budget", type=float, default=0.5, help="the planner's search time per plan")
    parser.add_argument("--out", type=Path, default=Path("bench-scaling"))
    parser.add_argument(
        "--predict", action="store_true", help="print each plan and the planner's prediction of it; simulate nothing"
    )
    parser.add_argument(
        "--plot-from",
        type=Path,
        nargs="+",
        metavar="JSON",
        help="plot these scaling.json files' rows (several runs, one figure) to --out",
    )
    args = parser.parse_args()
    if args.plot_from:
        records = [r for f in args.plot_from for r in json.loads(f.read_text())]
        print(plot(records, args.out) or "nothing plotted")
        return
    if args.predict:
        print(predictions(args.models, args.sizes, args.churn, args.seed, args.time_budget))
        return
    rows = []
    for model in args.models:
        for n in args.sizes:
            for churn in {"both": (False, True), "on": (True,), "off": (False,)}[args.churn]:
                started = time.perf_counter()
                row = run_one(model, n, churn, args.hours, args.seed, args.time_budget)
                rows.append(row)
                print(
                    f"{model} {n} devices churn={churn}: {row.result.tokens_per_s:,.0f} tokens/s "
                    f"({time.perf_counter() - started:.0f} s)",
                    file=sys.stderr,
                    flush=True,
                )
    print(table(rows))
    print()
    print("\n".join(verdict(rows)))
    records: list[dict[str, Any]] = [
        {
            "model": r.model,
            "devices": r.devices,
            "churn": r.churn,
            "hours": r.result.hours,
            "plan_s": r.plan_s,
            "single_device": r.alone,
            "busiest": r.busiest,
            "tokens_per_s": r.result.tokens_per_s,
            "efficiency": r.efficiency,
            "effective_tokens_per_s": r.effective_tokens_per_s,
            "compute_bound_tokens_per_s": r.result.compute_bound_tokens_per_s,
            "shape": r.result.shape,
            "shards": r.result.shards,
            "reduce_groups": r.result.reduce_groups,
            "local_steps": r.result.local_steps,
            "share_micro_batches": r.result.share_micro_batches,
            "phases": r.result.phases,
        }
        for r in rows
    ]
    path = plot(records, args.out)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "scaling.json").write_text(json.dumps(records, indent=1))
    print(f"\nwrote {args.out / 'scaling.json'}" + (f", {path}" if path else ""))


if __name__ == "__main__":
    main()
