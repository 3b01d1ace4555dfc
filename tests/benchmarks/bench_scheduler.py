"""swarmd's scheduler against the baselines, on every scenario file of a folder; then its speed at scale.

    .venv/bin/python tests/benchmarks/bench_scheduler.py [FOLDER] [--out DIR] [--repeats 3]

For each ``*.json`` scenario in FOLDER (default: ../shared/scenarios beside the repository):
swarmd's planner (and its three ablations: blind to the network, to devices, to reliability)
and the four baselines of ``swarmd.peers.planning.baselines`` each plan it; a table gives each plan's
reference cost (FORMAT.md's yardstick), its iteration time under swarmd's own model, the
scheduler's runtime (best of ``--repeats``) and two lower bounds: on the reference cost for
that shape, and on the iteration time (every device computing with no idle time, plus the
reference bound). When a scenario leaves the shape free, every baseline gets the shape
swarmd chose, so that all are compared on the same grid. Then: a full plan for 1,000
devices (synthetic, shape free) and a repair after one device leaves at 64 devices (median
over 20 departures). Figures only; nothing is asserted. Writes ``results.json``,
``reference_cost.svg`` and ``runtime.svg`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from swarmd.charts import grouped_bars
from swarmd.peers.planning.baselines import BASELINES
from swarmd.peers.planning.plan_cost import Plan, compute_lower_bound_s, predict, reference_cost, reference_lower_bound
from swarmd.peers.planning.planner import Awareness, PlannerSettings, plan, repair
from swarmd.peers.planning.scenario import Scenario, Shape, load_scenario
from swarmd.peers.planning.scenario_gen import synthetic_scenario

Scheduler = Callable[[Scenario, Shape], Plan]


def swarmd_scheduler(awareness: Awareness) -> Scheduler:
    def run(scenario: Scenario, shape: Shape) -> Plan:
        fixed = scenario if scenario.parallelism == shape else _with_shape(scenario, shape)
        return plan(fixed, PlannerSettings(awareness))

    return run


def _with_shape(scenario: Scenario, shape: Shape) -> Scenario:
    from dataclasses import replace

    return replace(scenario, parallelism=shape)


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


def bench_scenario(scenario: Scenario, repeats: int) -> dict[str, Any]:
    # Free: swarmd chooses the shape, and everyone is measured on that grid.
    shape = scenario.parallelism if scenario.parallelism is not None else plan(scenario).shape
    rows = {}
    for name, scheduler in SCHEDULERS.items():
        # The evolutionary search is slow: once is enough to time it.
        result, runtime = timed(scheduler, scenario, shape, 1 if name == "dtfm-evolutionary" else repeats)
        assert result.shape == shape, (name, result.shape, shape)
        pred = predict(scenario, result)
        rows[name] = {
            "reference_cost_s": reference_cost(scenario, result),
            "iteration_s": pred.iteration_s,
            "runtime_s": runtime,
        }
    ref_bound = reference_lower_bound(scenario, shape)
    return {
        "scenario": scenario.name,
        "devices": scenario.n,
        "shape": [shape.stages, shape.data_parallel],
        "shape_given": scenario.parallelism is not None,
        "reference_lower_bound_s": ref_bound,
        "iteration_lower_bound_s": compute_lower_bound_s(scenario) + ref_bound,
        "schedulers": rows,
    }


def print_table(result: dict[str, Any]) -> None:
    s, n = result["shape"]
    given = "given" if result["shape_given"] else "chosen by swarmd"
    print(f"\n{result['scenario']}: {result['devices']} devices, {s} stages x {n} pipelines ({given})")
    print(f"{'scheduler':<24}{'reference cost s':>18}{'own model s':>14}{'runtime s':>12}{'vs dtfm':>10}")
    dtfm = result["schedulers"]["dtfm-evolutionary"]
    for name, row in result["schedulers"].items():
        speedup = dtfm["runtime_s"] / row["runtime_s"] if row["runtime_s"] > 0 else float("inf")
        print(f"{name:<24}{row['reference_cost_s']:>18.3f}{row['iteration_s']:>14.3f}{row['runtime_s']:>12.4f}"
              f"{speedup:>9.0f}x")  # fmt: skip
    print(f"{'lower bound':<24}{result['reference_lower_bound_s']:>18.3f}{result['iteration_lower_bound_s']:>14.3f}")


def bench_scale() -> dict[str, float]:
    big = synthetic_scenario(1000, regions=8, seed=1, churn=True)
    started = time.perf_counter()
    full = plan(big)
    full_s = time.perf_counter() - started
    predicted = predict(big, full).iteration_s
    print(f"\nfull plan, 1,000 devices (shape free): {full_s:.2f} s -> {full.shape.stages} stages x "
          f"{full.shape.data_parallel} pipelines, predicted iteration {predicted:.1f} s")  # fmt: skip
    scenario = synthetic_scenario(64, regions=4, seed=2, parallelism={"stages": 4, "data_parallel": 15})
    before = plan(scenario)
    times, changed = [], []
    for gone in before.devices()[:20]:
        now = scenario.with_devices([i for i in range(scenario.n) if i != gone])
        started = time.perf_counter()
        fixed = repair(now, before, scenario.ids)
        times.append(time.perf_counter() - started)
        changed.append(len(fixed.changed))
    repair_ms = statistics.median(times) * 1000
    worst_ms = max(times) * 1000
    print(f"repair after one device leaves, 64 devices: median {repair_ms:.1f} ms, worst {worst_ms:.1f} ms over "
          f"{len(times)} departures; cells changed: median {statistics.median(changed):.0f} "
          f"of {before.shape.devices}")  # fmt: skip
    return {"full_plan_1000_s": full_s, "repair_64_median_ms": repair_ms, "repair_64_worst_ms": worst_ms}


def write_plots(results: list[dict[str, Any]], out: Path) -> None:
    groups = [r["scenario"] for r in results]
    names = list(SCHEDULERS)
    (out / "reference_cost.svg").write_text(grouped_bars(
        "Reference cost per scheduler (lower is better)", groups,
        {n: [r["schedulers"][n]["reference_cost_s"] for r in results] for n in names},
        y_label="seconds per iteration (FORMAT.md reference)", log=True,
        markers=[r["reference_lower_bound_s"] for r in results], marker_label="lower bound"))  # fmt: skip
    (out / "runtime.svg").write_text(grouped_bars(
        "Scheduler runtime", groups, {n: [r["schedulers"][n]["runtime_s"] for r in results] for n in names},
        y_label="seconds", log=True))  # fmt: skip


def main() -> int:
    default = Path(__file__).resolve().parents[3] / "shared" / "scenarios"
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path, nargs="?", default=default)
    parser.add_argument("--out", type=Path, default=Path("bench-scheduler"))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-scale", action="store_true", help="skip the 1,000-device and repair figures")
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
    scale = {} if args.no_scale else bench_scale()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps({"scenarios": results, "scale": scale}, indent=1))
    write_plots(results, args.out)
    print(f"\nwrote {args.out / 'results.json'}, {args.out / 'reference_cost.svg'}, {args.out / 'runtime.svg'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
