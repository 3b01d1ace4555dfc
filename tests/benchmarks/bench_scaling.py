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
``--predict`` prints only the plans and the planner's predictions (seconds, not hours).

On the same scenarios, seed and churn, the peer strategies (``--strategies``; by default
DT-FM, SWARM and DiLoCo's data parallelism, ``swarmd.peers.sim.strategies``) are simulated too,
and the headline table gives each one's trained tokens/s, efficiency, effective tokens/s and
its time to a target loss (``swarmd.peers.sim.time_to_target``: the loss Chinchilla's fit gives
the model at 20 tokens a parameter; ``*`` marks a time past the simulated hours, at the run's
mean rate). A PNG of effective tokens/s against devices goes to ``--out`` when matplotlib is
installed.
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

from swarmd.peers.planning.planner import PlanError, PlannerConfig, plan
from swarmd.peers.planning.scenario import Scenario, ScenarioError, interface_rates
from swarmd.peers.planning.scenario_gen import SMALL_MODEL, synthetic_scenario
from swarmd.peers.planning.throughput import ThroughputModel
from swarmd.peers.sim.results import SimResult, single_device
from swarmd.peers.sim.simulator import SimConfig, simulate
from swarmd.peers.sim.strategies import NAMES, make_strategies
from swarmd.peers.sim.time_to_target import Learning, hours_text, learning_figures

PIPELINED_MODEL = {"layers": 24, "hidden": 2048, "seq_len": 2048, "vocab": 50257, "params": 1.3e9, "dtype_bytes": 2}
MODELS = {"200M": SMALL_MODEL, "1.3B": PIPELINED_MODEL}
COMPARED = ("swarmd", "dtfm-static", "swarm-wiring", "diloco")
"""swarmd and the peer strategies issue 27 names: DT-FM, SWARM and DiLoCo's data parallelism."""
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
    learning: Learning
    """What the trained tokens teach, and the time to the target (``sim.time_to_target``)."""

    @property
    def strategy(self) -> str:
        return self.result.strategy

    @property
    def efficiency(self) -> float:
        return self.learning.efficiency

    @property
    def effective_tokens_per_s(self) -> float:
        return self.learning.effective_tokens_per_s

    @property
    def hours_to_target(self) -> str:
        return hours_text(self.learning.time_to_target_s, self.learning.extrapolated, self.result.hours)


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


def run_one(
    model: str, n: int, churn: bool, hours: float, seed: int, time_budget_s: float, strategies: list[str]
) -> list[Row]:
    """Each of ``strategies`` on the same scenario, seed and churn (the run's stage count and the
    baselines' pipeline ceiling from swarmd's plan); one that cannot place the swarm at all
    (DiLoCo where no device holds the model) is left out with a note on stderr."""
    scenario = synthetic_scenario(n, regions=3, seed=seed, churn=churn, model=MODELS[model])
    started = time.perf_counter()
    shape = plan(scenario, PlannerConfig(time_budget_s=time_budget_s, seed=seed)).shape
    plan_s = time.perf_counter() - started
    rows = []
    for strategy in make_strategies(strategies, shape, time_budget_s, seed):
        try:
            result = simulate(scenario, strategy, SimConfig(hours=hours, seed=seed, churn=churn))
        except (ScenarioError, PlanError) as e:
            print(f"{model} {n} devices churn={churn}: {strategy.name} cannot run: {e}", file=sys.stderr)
            continue
        rows.append(
            Row(
                model,
                n,
                churn,
                plan_s,
                result,
                single_device(scenario).tokens_per_s,
                busiest_interface(scenario, result),
                learning_figures(scenario, result),
            )
        )
    return rows


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


def learning_table(rows: list[Row]) -> str:
    """The headline: every strategy's trained and effective tokens/s and its time to the target
    loss (``*``: past the simulated hours, at the run's mean rate)."""
    lines = [
        "| model | devices | churn | strategy | trained tokens/s | efficiency | effective tokens/s "
        "| loss at the end | target loss | hours to target |",
        "|---|---:|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {row.model} | {row.devices:,} | {'yes' if row.churn else 'no'} | {row.strategy} "
            f"| {row.result.tokens_per_s:,.0f} | {row.efficiency:.3f} | {row.effective_tokens_per_s:,.0f} "
            f"| {'-' if row.learning.loss_at_end is None else f'{row.learning.loss_at_end:.3f}'} "
            f"| {row.learning.target_loss:.3f} | {row.hours_to_target} |"
        )
    return "\n".join(lines)


def table(rows: list[Row]) -> str:
    lines = [
        "| model | devices | churn | strategy | shape S x N | K per stage (G) | H | k | plan s | trained tokens/s "
        "| efficiency | effective tokens/s | compute bound | of bound | single device | x single | updates | lost "
        "| shares recomputed | stale dropped | sim s |",
        "|---|---:|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        r = row.result
        alone = f"{row.alone:,.0f}" if row.alone is not None else "cannot hold it"
        times = f"{r.tokens_per_s / row.alone:.2f}" if row.alone else "-"
        lines.append(
            f"| {row.model} | {row.devices:,} | {'yes' if row.churn else 'no'} | {row.strategy} "
            f"| {r.shape[0]} x {r.shape[1]} "
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
        "| model | devices | churn | strategy | "
        + " | ".join(p.replace("_", " ") for p in PHASES)
        + " | busiest interface |",
        "|---|---:|---|---|" + "---:|" * len(PHASES) + "---|",
    ]
    for row in rows:
        cells = []
        for p in PHASES:
            f = row.result.phases.get(p)
            cells.append(f"{f['mean_ms'] / 1e3:,.1f} ({f['n']:,})" if f else "-")
        lines.append(
            f"| {row.model} | {row.devices:,} | {'yes' if row.churn else 'no'} | {row.strategy} | "
            + " | ".join(cells)
            + f" | {row.busiest} |"
        )
    return "\n".join(lines)


def verdict(rows: list[Row]) -> list[str]:
    """Issue 14's targets, and issue 27's (effective tokens/s rises too; at 1,000 devices with
    churn swarmd reaches the target first), read off the tables."""
    out = []
    for row in rows:
        if row.strategy != "swarmd" or row.devices < 1000 or not row.churn:
            continue
        rivals = [r for r in rows if (r.model, r.devices, r.churn) == (row.model, row.devices, True) and r is not row]
        mine = row.learning.time_to_target_s
        beaten = [
            r.strategy
            for r in rivals
            if r.learning.time_to_target_s is not None and (mine is None or r.learning.time_to_target_s <= mine)
        ]
        out.append(
            f"{row.model} at {row.devices:,} with churn: swarmd reaches the target in {row.hours_to_target} h, "
            + (f"not first ({', '.join(beaten)} as fast or faster)" if beaten else f"first of {len(rivals) + 1}")
        )
    rows = [r for r in rows if r.strategy == "swarmd"]
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
    """Effective tokens/s against devices, a panel per model present, a line per strategy and
    churn setting (swarmd's trained tokens/s and the compute bound beside them), from
    ``records``' dictionaries (a run's, or those of several runs' ``scaling.json``:
    ``--plot-from``; rows written before strategies were compared are swarmd's)."""
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
    strategies = list(dict.fromkeys(r.get("strategy", "swarmd") for r in records))
    colours = {name: f"C{i}" for i, name in enumerate(strategies)}
    fig, axes = plt.subplots(1, len(models), figsize=(6.5 * len(models), 4.8), sharey=True)
    for ax, model in zip(np.atleast_1d(axes), models, strict=True):
        for churn, style in ((False, "-o"), (True, "--s")):
            label = "churn" if churn else "no churn"
            for name in strategies:
                series = sorted(
                    (
                        r
                        for r in records
                        if r["model"] == model and r["churn"] == churn and r.get("strategy", "swarmd") == name
                    ),
                    key=lambda r: r["devices"],
                )
                if not series:
                    continue
                # A log scale has no zero: a run that trained nothing is left out of its line.
                shown = [r for r in series if r.get("effective_tokens_per_s", r["tokens_per_s"]) > 0]
                effective = [r.get("effective_tokens_per_s", r["tokens_per_s"]) for r in shown]
                ax.plot(
                    [r["devices"] for r in shown],
                    effective,
                    style,
                    color=colours[name],
                    label=f"{name} effective, {label}",
                )
                xs = [r["devices"] for r in series]
                if name == "swarmd":
                    trained = [r["tokens_per_s"] for r in series]
                    ax.plot(xs, trained, style, color=colours[name], alpha=0.3, label=f"swarmd trained, {label}")
                    bound = [r["compute_bound_tokens_per_s"] for r in series]
                    ax.plot(xs, bound, style, color="grey", alpha=0.3, label=f"compute bound, {label}")
        alone = [r["single_device"] for r in records if r["model"] == model and r["single_device"]]
        if alone:
            ax.axhline(max(alone), color="grey", linestyle=":", label="fastest single device")
        ax.set(xscale="log", yscale="log", xlabel="devices", title=f"{model} model")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=6)
    np.atleast_1d(axes)[0].set_ylabel("tokens/s (effective: what synchronous training would need)")
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
        "--strategies",
        nargs="+",
        default=list(COMPARED),
        choices=list(NAMES),
        help="what to simulate on each scenario (swarmd's rows give the scaling table)",
    )
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
    strategies = list(dict.fromkeys(["swarmd", *args.strategies]))
    rows: list[Row] = []
    for model in args.models:
        for n in args.sizes:
            for churn in {"both": (False, True), "on": (True,), "off": (False,)}[args.churn]:
                started = time.perf_counter()
                found = run_one(model, n, churn, args.hours, args.seed, args.time_budget, strategies)
                rows += found
                print(
                    f"{model} {n} devices churn={churn}: "
                    + ", ".join(f"{r.strategy} {r.effective_tokens_per_s:,.0f} effective tokens/s" for r in found)
                    + f" ({time.perf_counter() - started:.0f} s)",
                    file=sys.stderr,
                    flush=True,
                )
    print(learning_table(rows))
    print()
    print(table(rows))
    print()
    print("\n".join(verdict(rows)))
    records: list[dict[str, Any]] = [
        {
            "model": r.model,
            "strategy": r.strategy,
            "devices": r.devices,
            "churn": r.churn,
            "hours": r.result.hours,
            "plan_s": r.plan_s,
            "single_device": r.alone,
            "busiest": r.busiest,
            "tokens_per_s": r.result.tokens_per_s,
            "efficiency": r.efficiency,
            "effective_tokens_per_s": r.effective_tokens_per_s,
            "target_loss": r.learning.target_loss,
            "loss_at_end": r.learning.loss_at_end,
            "time_to_target_s": r.learning.time_to_target_s,
            "time_to_target_extrapolated": r.learning.extrapolated,
            "compute_bound_tokens_per_s": r.result.compute_bound_tokens_per_s,
            "shape": r.result.shape,
            "shards": r.result.shards,
            "reduce_groups": r.result.reduce_groups,
            "local_steps": r.result.local_steps,
            "share_micro_batches": r.result.share_micro_batches,
            # Applied contributions by how many versions late: what prices them, kept so that
            # a later quality model can price the same runs again.
            "staleness": {str(s): n for s, n in sorted(r.result.staleness.items())},
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
