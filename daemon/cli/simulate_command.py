"""``swarmd simulate``: a scenario played out over hours, strategy against strategy.

Every strategy (``swarmd.peers.sim.strategies``) meets the same churn on the same seed; each is
also run without churn for ``FAILURE_FREE_HOURS`` at most (its steady state), which gives the
failure-free figure its throughput is held against. Each run's trained tokens are priced by
what they teach (``swarmd.peers.sim.time_to_target``: efficiency, effective tokens/s) and the
headline is the time each strategy takes to reach a target loss (``--target-loss``; default,
the loss Chinchilla's fit gives the model at its compute-optimal budget). The report is a
markdown table on stdout and in ``OUT/report.md``, the numbers in ``OUT/results.json``, and
PNG plots (matplotlib, the ``sim`` extra) of effective tokens/s over time, the staleness
distribution and the planners' runtimes.
"""

from __future__ import annotations

import json
import statistics
import sys
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from swarmd.cli.progress import ProgressLine
from swarmd.errors import SwarmdError
from swarmd.peers.planning.loss_curve import tokens_to_loss
from swarmd.peers.planning.planner import PlannerConfig, plan
from swarmd.peers.planning.scenario import Scenario, ScenarioError, load_scenario
from swarmd.peers.sim.churn import churn_schedule
from swarmd.peers.sim.results import SimResult, single_device
from swarmd.peers.sim.simulator import SimConfig, Simulation, simulate
from swarmd.peers.sim.strategies import NAMES, make_strategies
from swarmd.peers.sim.time_to_target import Learning, hours_text, learning_figures

FAILURE_FREE_HOURS = 2.0
"""The failure-free run of a strategy stops here: without churn its throughput is steady."""
SMOOTH_BUCKETS = 10
MAX_HOURS = 24.0 * 30
PHASES = (
    "share",
    "share_compute",
    "round",
    "contribution",
    "pull",
    "commit_lag",
    "weights",
    "wait_cells",
    "wait_ledger",
    "wait_backpressure",
)
"""Where the time goes, in the report's order (``SimResult.phases``)."""


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summary(result: SimResult, failure_free: SimResult, learning: Learning) -> dict[str, Any]:
    kinds = [e.kind for e in result.plan_events]
    runtimes = [e.runtime_s for e in result.plan_events if not e.kind.startswith("failed")]
    bound = result.compute_bound_tokens_per_s
    return {
        "strategy": result.strategy,
        "tokens_per_s": round(result.tokens_per_s, 1),
        "efficiency": round(learning.efficiency, 4),
        "effective_tokens_per_s": round(learning.effective_tokens_per_s, 1),
        "target_loss": round(learning.target_loss, 4),
        "target_tokens": learning.tokens_to_target,
        "time_to_target_s": None if learning.time_to_target_s is None else round(learning.time_to_target_s, 1),
        "time_to_target_extrapolated": learning.extrapolated,
        "loss_at_end": None if learning.loss_at_end is None else round(learning.loss_at_end, 4),
        "failure_free_tokens_per_s": round(failure_free.tokens_per_s, 1),
        "kept": round(result.tokens_per_s / failure_free.tokens_per_s, 3) if failure_free.tokens_per_s else None,
        "compute_bound_tokens_per_s": round(bound, 1),
        "of_compute_bound": round(result.tokens_per_s / bound, 5) if bound else None,
        "updates": result.updates,
        "updates_lost": result.updates_lost,
        "shares_recomputed": result.shares_recomputed,
        "contributions_lost": result.contributions_lost,
        "stale_dropped": result.stale_dropped,
        "duplicates": result.duplicates,
        "failovers": result.failovers,
        "spare_claims": result.spare_claims,
        "coordinator_changes": result.coordinator_changes,
        "plans_lost": result.plans_lost,
        "relays": result.relays,
        "relayed_transfers": result.relayed_transfers,
        "recovery_median_s": _percentile(result.recovery_s, 0.5),
        "recovery_p90_s": _percentile(result.recovery_s, 0.9),
        "plans": {k: kinds.count(k) for k in ("full", "repair", "replan")},
        "plans_failed": sum(k.startswith("failed") for k in kinds),
        "plan_runtime_median_ms": round(statistics.median(runtimes) * 1e3, 2) if runtimes else None,
        "plan_runtime_max_ms": round(max(runtimes) * 1e3, 2) if runtimes else None,
        "shape": list(result.shape),
        "shards": list(result.shards),
        "local_steps": result.local_steps,
        "share_micro_batches": result.share_micro_batches,
        "phases": result.phases,
        "bytes_sent_max": max(result.sent_bytes, default=0.0),
        "bytes_received_max": max(result.received_bytes, default=0.0),
        "wall_s": round(result.wall_s, 1),
        "events": result.events,
    }


def _fmt(value: Any, digits: int = 0) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def _hours(row: dict[str, Any], simulated_hours: float) -> str:
    return hours_text(row["time_to_target_s"], row["time_to_target_extrapolated"], simulated_hours, " (extrapolated)")


def _learning_table(scenario: Scenario, rows: list[dict[str, Any]], hours: float) -> list[str]:
    if not rows:
        return []
    return [
        f"What the tokens teach, and the time to a loss of {rows[0]['target_loss']:.3f} (Chinchilla's fit: "
        f"{rows[0]['target_tokens']:.3g} tokens of synchronous training for {scenario.model.params:.3g} "
        "parameters). Efficiency: the share of the trained tokens synchronous training would need for the same "
        "loss; effective tokens/s: the trained rate times it.",
        "",
        "| strategy | trained tokens/s | efficiency | effective tokens/s | loss at the end | hours to target |",
        "|---|---:|---:|---:|---:|---:|",
        *(
            f"| {r['strategy']} | {_fmt(r['tokens_per_s'])} | {_fmt(r['efficiency'], 3)} "
            f"| {_fmt(r['effective_tokens_per_s'])} | {_fmt(r['loss_at_end'], 3)} | {_hours(r, hours)} |"
            for r in rows
        ),
        "",
    ]


def markdown(scenario: Scenario, settings: SimConfig, rows: list[dict[str, Any]], churn: tuple[int, int]) -> str:
    alone = single_device(scenario)
    alone_text = (
        f"the fastest device that holds the model alone ({alone.device}) trains {alone.tokens_per_s:,.0f} tokens/s"
        if alone.tokens_per_s is not None
        else f"no device holds the model alone (it needs {alone.needed_gib:.1f} GiB with its optimizer state)"
    )
    lines = [
        f"# swarmd simulate: {scenario.name}",
        "",
        f"{scenario.n} devices, {settings.hours:g} simulated hours, seed {settings.seed}: {churn[0]} departures and "
        f"{churn[1]} returns, the same for every strategy. Failure-free: the same strategy without churn "
        f"(at most {FAILURE_FREE_HOURS:g} h). Trained tokens/s: the micro-batches of the contributions applied in "
        f"committed updates; {alone_text}.",
        "",
        *_learning_table(scenario, rows, settings.hours),
        "| strategy | tokens/s | failure-free | kept | of compute bound | shape S x N, K, H, k | updates | lost "
        "| shares recomputed | contributions lost | stale dropped | failovers | recovery median / p90 s "
        "| plans full/repair/replan | plan runtime median / max ms | wall s |",
        "|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        plans = r["plans"]
        shape = (
            f"{r['shape'][0]} x {r['shape'][1]}, K {'/'.join(map(str, r['shards']))}, H {r['local_steps']}, "
            f"k {r['share_micro_batches']}"
        )
        lines.append(
            f"| {r['strategy']} | {_fmt(r['tokens_per_s'])} | {_fmt(r['failure_free_tokens_per_s'])} "
            f"| {_fmt(r['kept'], 2)} | {_fmt(r['of_compute_bound'], 4)} | {shape} | {_fmt(r['updates'])} "
            f"| {_fmt(r['updates_lost'])} | {_fmt(r['shares_recomputed'])} | {_fmt(r['contributions_lost'])} "
            f"| {_fmt(r['stale_dropped'])} | {_fmt(r['failovers'])} "
            f"| {_fmt(r['recovery_median_s'])} / {_fmt(r['recovery_p90_s'])} "
            f"| {plans['full']}/{plans['repair']}/{plans['replan']} "
            f"| {_fmt(r['plan_runtime_median_ms'], 1)} / {_fmt(r['plan_runtime_max_ms'], 1)} | {_fmt(r['wall_s'], 1)} |"
        )
    lines += [
        "",
        "Where the time goes: mean seconds (and count) of a share (and its compute alone), a pipeline's round, a "
        "contribution's way to its shard, a pull, a step's wait for its standby (commit lag), a new cell's weights, "
        "and the pipelines' waits for a cell, for the ledger and for their last contribution (backpressure).",
        "",
        "| strategy | " + " | ".join(p.replace("_", " ") for p in PHASES) + " |",
        "|---|" + "---:|" * len(PHASES),
    ]
    for r in rows:
        lines.append(f"| {r['strategy']} | " + " | ".join(_phase_cell(r["phases"], p) for p in PHASES) + " |")
    lines += [
        "",
        "Elections and faults: how often the coordinator changed; plans lost because their coordinator left while "
        "computing them; the relays the last plan elected and the transfers that went through one (the baselines "
        "send everything direct); cells spares took before a repair; recomputes acknowledged and not applied twice.",
        "",
        "| strategy | coordinator changes | plans lost | relays | transfers relayed | spare claims | duplicates |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['strategy']} | {_fmt(r['coordinator_changes'])} | {_fmt(r['plans_lost'])} | {_fmt(r['relays'])} "
            f"| {_fmt(r['relayed_transfers'])} | {_fmt(r['spare_claims'])} | {_fmt(r['duplicates'])} |"
        )
    return "\n".join(lines) + "\n"


def _phase_cell(phases: dict[str, dict[str, float]], name: str) -> str:
    figures = phases.get(name)
    return f"{figures['mean_ms'] / 1e3:,.1f} ({figures['n']:,})" if figures else "-"


def plot(results: list[SimResult], efficiencies: list[float], out: Path) -> list[Path]:
    """PNG plots; none (with a note on stderr) when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install 'swarmd[sim]'): no PNG plots", file=sys.stderr)
        return []
    written = []
    fig, ax = plt.subplots(figsize=(10, 4.5))
    for r, efficiency in zip(results, efficiencies, strict=True):
        series = [x * efficiency for x in r.tokens_per_s_series()]
        smooth = [statistics.fmean(series[max(0, i - SMOOTH_BUCKETS + 1) : i + 1]) for i in range(len(series))]
        ax.plot([i * r.bucket_s / 3600 for i in range(len(smooth))], smooth, label=r.strategy, linewidth=1.2)
    ax.set(
        xlabel="simulated hours",
        ylabel=f"effective tokens/s ({SMOOTH_BUCKETS}-bucket mean)",
        title="What the swarm learns per second: trained tokens/s times their efficiency",
    )
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    written.append(_save(fig, out / "effective_tokens_per_s.png"))
    fig, ax = plt.subplots(figsize=(10, 4))
    width = 0.8 / max(1, len(results))
    for k, r in enumerate(results):
        total = sum(r.staleness.values()) or 1
        xs = sorted(r.staleness)
        ax.bar([x + k * width for x in xs], [r.staleness[x] / total for x in xs], width=width, label=r.strategy)
    ax.set(xlabel="staleness (versions behind)", ylabel="share of applied contributions", title="Staleness")
    ax.legend(fontsize=8)
    written.append(_save(fig, out / "staleness.png"))
    fig, ax = plt.subplots(figsize=(10, 4))
    for r in results:
        events = [e for e in r.plan_events if not e.kind.startswith("failed")]
        ax.scatter(
            [e.at_s / 3600 for e in events], [max(e.runtime_s, 1e-5) * 1e3 for e in events], s=8, label=r.strategy
        )
    ax.set_yscale("log")
    ax.set(xlabel="simulated hours", ylabel="runtime, ms", title="Planner runtime per plan or repair")
    ax.legend(fontsize=8)
    written.append(_save(fig, out / "plan_runtimes.png"))
    return written


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


PROGRESS_STEPS = 100
"""A simulation is advanced in this many slices of its horizon, its progress shown between them."""


def _simulated(sim: Simulation, progress: ProgressLine) -> SimResult:
    for k in range(1, PROGRESS_STEPS + 1):
        sim.advance(sim.horizon * k / PROGRESS_STEPS)
        progress.update(k / PROGRESS_STEPS)
    return sim.run()


def run_simulate(
    scenario_path: Path,
    *,
    hours: float,
    seed: int,
    strategies: list[str],
    out: Path,
    time_budget_s: float,
    target_loss: float | None = None,
) -> int:
    if not 0 < hours <= MAX_HOURS:
        raise SwarmdError(f"--hours {hours:g} is out of range: give more than 0 and at most {MAX_HOURS:g}")
    unknown = [n for n in strategies if n not in NAMES]
    if unknown:
        raise SwarmdError(f"unknown strategy {', '.join(unknown)}; choose from {', '.join(NAMES)}")
    scenario = load_scenario(scenario_path)
    if target_loss is not None:
        try:
            tokens_to_loss(scenario.model.params, target_loss)
        except ValueError as e:
            raise SwarmdError(f"--target-loss {target_loss:g}: {e}") from None
    settings = SimConfig(hours=hours, seed=seed)
    # The run's shape: swarmd's plan for the whole scenario (the stage count stays fixed).
    shape = plan(scenario, PlannerConfig(time_budget_s=time_budget_s, seed=seed)).shape
    up0, churn = churn_schedule(scenario, hours * 3600.0, seed)
    departures = sum(not e.up for e in churn)
    print(
        f"{scenario.name}: {scenario.n} devices ({int(up0.sum())} up at the start), {departures} departures in "
        f"{hours:g} h; run shape {shape.stages} stages x up to {shape.data_parallel} pipelines",
        file=sys.stderr,
    )
    results, rows = [], []
    skipped: list[str] = []
    chosen = make_strategies(strategies, shape, time_budget_s, seed)
    for i, strategy in enumerate(chosen, 1):
        progress = ProgressLine(f"  {strategy.name} ({i} of {len(chosen)}), {hours:g} h simulated")
        try:
            result = _simulated(Simulation(scenario, strategy, settings), progress)
        except ScenarioError as e:  # the strategy cannot place this swarm at all (DiLoCo, no device holds it)
            print(f"  {strategy.name} cannot run: {e}", file=sys.stderr)
            skipped.append(f"{strategy.name}: cannot run ({e})")
            continue
        free = simulate(scenario, strategy, replace(settings, hours=min(hours, FAILURE_FREE_HOURS), churn=False))
        progress.done("and its failure-free run")
        results.append(result)
        rows.append(summary(result, free, learning_figures(scenario, result, target_loss)))
    out.mkdir(parents=True, exist_ok=True)
    report = markdown(scenario, settings, rows, (departures, sum(e.up for e in churn)))
    if skipped:
        report += "\n" + "\n".join(f"- {line}" for line in skipped) + "\n"
    (out / "report.md").write_text(report)
    data = {
        "scenario": scenario.name,
        "devices": scenario.n,
        "hours": hours,
        "seed": seed,
        "rows": rows,
        "runs": [{**asdict(r), "plan_events": [asdict(e) for e in r.plan_events]} for r in results],
    }
    (out / "results.json").write_text(json.dumps(data))
    print(report)
    written = plot(results, [r["efficiency"] for r in rows], out)
    print(f"wrote {out / 'report.md'}, {out / 'results.json'}" + "".join(f", {p}" for p in written))
    return 0
