"""swarmd's scheduler against the baselines, on every scenario file of a folder; its predictions on
synthetic swarms of 16 to 1,000 devices; then its speed at scale.

    .venv/bin/python tests/benchmarks/bench_scheduler.py [FOLDER] [--out DIR] [--repeats 3]
        [--no-scale] [--no-throughput]

1. For each ``*.json`` scenario in FOLDER (default: docs/scenarios, the shipped examples):
   swarmd's planner (and its three ablations: blind to the network, to devices, to
   reliability) and the four baselines of ``swarmd.peers.planning.baselines`` each place it; a
   table gives each placement's reference cost (FORMAT.md's yardstick, the ruler every
   scheduler is compared on), the trained tokens/s the throughput model predicts for it with
   swarmd's schedule (split, shard servers, H, k) on its grid, so that placements alone are
   compared, and the scheduler's runtime (best of ``--repeats``). When a scenario leaves the
   shape free, every baseline gets the shape swarmd chose.
2. The planner on synthetic scenarios (``scenario_gen``, three regions) of 16, 64, 256 and 1,000
   devices, for the 200M ``SMALL_MODEL`` and a 1.3B model (24 layers, hidden 2048, seq 2048),
   with and without churn: the chosen shape, K, H, k, the predicted tokens/s with its
   breakdown, the compute bound and the fastest single device alone.
3. A full plan for 1,000 devices (shape free), and repairs after one device leaves at 64 and at
   1,000 devices (median and worst over 20 departures).

Figures only; nothing is asserted. Writes ``results.json``, ``reference_cost.svg`` and
``runtime.svg`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from swarmd.peers.planning.baselines import BASELINES
from swarmd.peers.planning.builder import Planner
from swarmd.peers.planning.plan_cost import Plan, reference_cost, reference_lower_bound
from swarmd.peers.planning.planner import Awareness, PlannerConfig, plan, repair
from swarmd.peers.planning.scenario import Scenario, Shape, load_scenario
from swarmd.peers.planning.scenario_gen import SMALL_MODEL, synthetic_scenario
from swarmd.peers.planning.throughput import Throughput, compute_bound_tokens_per_s, fastest_device_tokens_per_s

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script: its chart helper
from tests.benchmarks.charts import grouped_bars  # noqa: E402

Scheduler = Callable[[Scenario, Shape], Plan]
LARGE_MODEL = {"layers": 24, "hidden": 2048, "seq_len": 2048, "vocab": 50257, "params": 1.3e9, "dtype_bytes": 2}
SIZES = (16, 64, 256, 1000)


def swarmd_scheduler(awareness: Awareness) -> Scheduler:
    def run(scenario: Scenario, shape: Shape) -> Plan:
        fixed = scenario if scenario.parallelism == shape else replace(scenario, parallelism=shape)
        return plan(fixed, PlannerConfig(awareness))

    return run


SCHEDULERS: dict[str, Scheduler] = {
    "swarmd": swarmd_scheduler(Awareness()),
    "swarmd/no-network": swarmd_scheduler(Awareness(network=False)),
    "swarmd/no-devices": swarmd_scheduler(Awareness(devices=False)),
    "swarmd/no-reliability": swarmd_scheduler(Awareness(reliability=False)),
    **BASELINES,
}


def timed(scheduler: Scheduler, scenario: Scenario, shape: Shape, repeats: int) -> tuple[Plan, float]:
    best, result = float("inf"), None
    for _ in range(repeats):
        started = time.perf_counter()
        result = scheduler(scenario, shape)
        best = min(best, time.perf_counter() - started)
    assert result is not None
    return result, best


def scheduled(scenario: Scenario, placed: Plan) -> Throughput | None:
    """The prediction for ``placed``'s grid with swarmd's schedule: trained tokens/s, what they
    teach and their product (None: its grid cannot hold the layers in local mode or in
    gradient mode)."""
    planner = Planner(scenario, PlannerConfig())
    for local in (True, False):
        found = planner.schedule(placed.grid(), local)
        if found is not None:
            return planner.finish(found, time.perf_counter()).meta["prediction"]  # type: ignore[no-any-return]
    return None


def bench_scenario(scenario: Scenario, repeats: int) -> dict[str, Any]:
    # Free: swarmd chooses the shape, and everyone is placed on that grid.
    shape = scenario.parallelism if scenario.parallelism is not None else plan(scenario).shape
    rows = {}
    for name, scheduler in SCHEDULERS.items():
        # The evolutionary search is slow: once is enough to time it.
        result, runtime = timed(scheduler, scenario, shape, 1 if name == "dtfm-evolutionary" else repeats)
        assert result.shape == shape, (name, result.shape, shape)
        pred = scheduled(scenario, result)
        rows[name] = {
            "reference_cost_s": reference_cost(scenario, result),
            "tokens_per_s": None if pred is None else pred.tokens_per_s,
            "efficiency": None if pred is None else pred.efficiency,
            "effective_tokens_per_s": None if pred is None else pred.effective_tokens_per_s,
            "runtime_s": runtime,
        }
    return {
        "scenario": scenario.name,
        "devices": scenario.n,
        "shape": [shape.stages, shape.data_parallel],
        "shape_given": scenario.parallelism is not None,
        "reference_lower_bound_s": reference_lower_bound(scenario, shape),
        "compute_bound_tokens_per_s": compute_bound_tokens_per_s(scenario),
        "schedulers": rows,
    }


def print_table(result: dict[str, Any]) -> None:
    s, n = result["shape"]
    given = "given" if result["shape_given"] else "chosen by swarmd"
    print(f"\n{result['scenario']}: {result['devices']} devices, {s} stages x {n} pipelines ({given})")
    print(f"{'scheduler':<24}{'reference cost s':>18}{'tokens/s':>14}{'effective':>14}{'runtime s':>12}{'vs dtfm':>10}")
    dtfm = result["schedulers"]["dtfm-evolutionary"]
    for name, row in result["schedulers"].items():
        speedup = dtfm["runtime_s"] / row["runtime_s"] if row["runtime_s"] > 0 else float("inf")
        tokens = "-" if row["tokens_per_s"] is None else f"{row['tokens_per_s']:,.0f}"
        effective = "-" if row["effective_tokens_per_s"] is None else f"{row['effective_tokens_per_s']:,.0f}"
        print(
            f"{name:<24}{row['reference_cost_s']:>18.3f}{tokens:>14}{effective:>14}{row['runtime_s']:>12.4f}"
            f"{speedup:>9.0f}x"
        )
    bound = f"{result['compute_bound_tokens_per_s']:,.0f}"
    print(f"{'bound':<24}{result['reference_lower_bound_s']:>18.3f}{bound:>14}  (reference: lower; tokens/s: upper)")


def describe_plan(scenario: Scenario, result: Plan, runtime_s: float) -> dict[str, Any]:
    pred: Throughput = result.meta["prediction"]  # type: ignore[assignment]
    bound, alone = compute_bound_tokens_per_s(scenario), fastest_device_tokens_per_s(scenario)
    shards = [len(row) for row in result.shard_servers]
    return {
        "devices": scenario.n,
        "stages": result.shape.stages,
        "pipelines": result.shape.data_parallel,
        "shards": shards,
        "local_steps": result.local_steps,
        "share_micro_batches": result.share_micro_batches,
        "tokens_per_s": pred.tokens_per_s,
        "efficiency": pred.efficiency,
        "effective_tokens_per_s": pred.effective_tokens_per_s,
        "breakdown": pred.to_json(),
        "compute_bound_tokens_per_s": bound,
        "fastest_device_tokens_per_s": alone,
        "of_bound": pred.tokens_per_s / bound,
        "vs_fastest": pred.tokens_per_s / alone,
        "runtime_s": runtime_s,
    }


def bench_throughput() -> list[dict[str, Any]]:
    """Step 2 of the module doc."""
    out = []
    for model_name, model in (("200M", SMALL_MODEL), ("1.3B", LARGE_MODEL)):
        for churn in (False, True):
            print(f"\n{model_name} model, three regions, {'with' if churn else 'no'} churn")
            print(
                f"{'devices':>8}{'shape':>9}{'K (first stages)':>18}{'H':>6}{'k':>5}{'tokens/s':>13}"
                f"{'of bound':>10}{'x fastest':>11}{'compute':>13}{'pipeline':>13}{'exchange':>13}{'churn':>7}"
                f"{'plan s':>8}"
            )
            for n in SIZES:
                scenario = synthetic_scenario(n, regions=3, seed=0, churn=churn, model=model)
                started = time.perf_counter()
                result = plan(scenario)
                row = describe_plan(scenario, result, time.perf_counter() - started)
                b = row["breakdown"]
                shape = f"{row['stages']}x{row['pipelines']}"
                shards = ",".join(str(k) for k in row["shards"][:3]) + ("..." if len(row["shards"]) > 3 else "")
                print(
                    f"{n:>8}{shape:>9}{shards:>18}{row['local_steps']:>6}{row['share_micro_batches']:>5}"
                    f"{row['tokens_per_s']:>13,.0f}{row['of_bound']:>10.1%}{row['vs_fastest']:>10.1f}x"
                    f"{b['compute_tokens_per_s']:>13,.0f}{b['pipeline_tokens_per_s']:>13,.0f}"
                    f"{b['exchange_tokens_per_s']:>13,.0f}{b['churn_fraction']:>7.1%}"
                    f"{row['runtime_s']:>8.2f}"
                )
                out.append({"model": model_name, "churn": churn, **row})
            bound, alone = out[-1]["compute_bound_tokens_per_s"], out[-1]["fastest_device_tokens_per_s"]
            print(f"{'':>8}(at 1,000 devices: compute bound {bound:,.0f} tokens/s, fastest device alone {alone:,.0f})")
    return out


def repairs(scenario: Scenario, before: Plan, count: int = 20) -> tuple[float, float, float]:
    """Median and worst milliseconds of a repair after one planned device leaves, and the
    median cells changed, over ``count`` departures."""
    times, changed = [], []
    for gone in before.devices()[:count]:
        now = scenario.with_devices([i for i in range(scenario.n) if i != gone])
        started = time.perf_counter()
        fixed = repair(now, before, scenario.ids)
        times.append(time.perf_counter() - started)
        changed.append(len(fixed.changed))
    return statistics.median(times) * 1000, max(times) * 1000, statistics.median(changed)


def bench_scale() -> dict[str, float]:
    big = synthetic_scenario(1000, regions=8, seed=1, churn=True)
    started = time.perf_counter()
    full = plan(big)
    full_s = time.perf_counter() - started
    pred: Throughput = full.meta["prediction"]  # type: ignore[assignment]
    print(
        f"\nfull plan, 1,000 devices in 8 regions with churn (shape free): {full_s:.2f} s -> {full.shape.stages} "
        f"stages x {full.shape.data_parallel} pipelines, predicted {pred.tokens_per_s:,.0f} tokens/s"
    )
    figures = {"full_plan_1000_s": full_s}
    small = synthetic_scenario(64, regions=4, seed=2, parallelism={"stages": 4, "data_parallel": 15})
    for label, scenario, before in (("64 (4 x 15 given)", small, plan(small)), ("1,000", big, full)):
        median_ms, worst_ms, cells = repairs(scenario, before)
        print(
            f"repair after one device leaves, {label} devices: median {median_ms:.1f} ms, worst {worst_ms:.1f} ms "
            f"over 20 departures; cells changed: median {cells:.0f} of {before.shape.devices}"
        )
        key = label.split(" ")[0].replace(",", "")
        figures |= {f"repair_{key}_median_ms": median_ms, f"repair_{key}_worst_ms": worst_ms}
    return figures


def write_plots(results: list[dict[str, Any]], out: Path) -> None:
    groups = [r["scenario"] for r in results]
    names = list(SCHEDULERS)
    (out / "reference_cost.svg").write_text(
        grouped_bars(
            "Reference cost per scheduler (lower is better)",
            groups,
            {n: [r["schedulers"][n]["reference_cost_s"] for r in results] for n in names},
            y_label="seconds per iteration (FORMAT.md reference)",
            log=True,
            markers=[r["reference_lower_bound_s"] for r in results],
            marker_label="lower bound",
        )
    )
    (out / "runtime.svg").write_text(
        grouped_bars(
            "Scheduler runtime",
            groups,
            {n: [r["schedulers"][n]["runtime_s"] for r in results] for n in names},
            y_label="seconds",
            log=True,
        )
    )


def main() -> int:
    default = Path(__file__).resolve().parents[2] / "docs" / "scenarios"
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path, nargs="?", default=default)
    parser.add_argument("--out", type=Path, default=Path("bench-scheduler"))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-scale", action="store_true", help="skip the 1,000-device and repair figures")
    parser.add_argument("--no-throughput", action="store_true", help="skip the synthetic 16-1,000 device table")
    args = parser.parse_args()
    files = sorted(args.folder.glob("*.json"))
    if not files:
        print(f"no *.json scenario in {args.folder}", file=sys.stderr)
        return 2
    results = []
    for path in files:
        result = bench_scenario(load_scenario(path), args.repeats)
        print_table(result)
        results.append(result)
    throughput = [] if args.no_throughput else bench_throughput()
    scale = {} if args.no_scale else bench_scale()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(
        json.dumps({"scenarios": results, "throughput": throughput, "scale": scale}, indent=1)
    )
    write_plots(results, args.out)
    print(f"\nwrote {args.out / 'results.json'}, {args.out / 'reference_cost.svg'}, {args.out / 'runtime.svg'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
