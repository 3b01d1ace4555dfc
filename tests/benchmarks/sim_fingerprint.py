"""A fingerprint of fixed-seed simulations, to show a change to the simulator kept its behaviour.

Usage:
    PYTHONHASHSEED=0 .venv/bin/python tests/benchmarks/sim_fingerprint.py [--out FILE.json]

Run it before and after a change that must not change what the simulator computes (issue 29
moved its state into a ``World``, 88 simulations byte-identical before and after): the last
line, a SHA-256 of every number of every run, must be the same; ``--out`` keeps the runs
themselves, to ``diff`` where they part. It covers the example scenarios in docs/scenarios,
three generated ones (one of volunteers who come and go every few minutes), every strategy
with churn and without, and hand-made swarms for the paths churn rarely takes: reduction
groups and their head leaving, a cell leaving mid-round, a shard server's failover (the
ledger rebuilt), a blip, a server and its standby leaving together. About a minute on a core.

The planner's time budget and the control plane's measured runtimes read
``time.perf_counter``: it is replaced by a clock that moves a fixed step per call, so that a
run depends on the code alone.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
_clock = [0.0]


def _fake_perf_counter() -> float:
    _clock[0] += 2.0**-8  # dyadic: a difference of two readings is exact wherever the clock stands
    return _clock[0]


time.perf_counter = _fake_perf_counter  # before swarmd is imported
sys.path.insert(0, str(ROOT))  # the tests' hand-made plans

from swarmd.peers.planning.planner import PlannerConfig, plan  # noqa: E402
from swarmd.peers.planning.scenario import Scenario, ScenarioError, load_scenario, parse_scenario  # noqa: E402
from swarmd.peers.planning.scenario_gen import synthetic_scenario, synthetic_scenario_dict  # noqa: E402
from swarmd.peers.sim.churn import ChurnEvent  # noqa: E402
from swarmd.peers.sim.simulator import SimConfig, Simulation  # noqa: E402
from swarmd.peers.sim.strategies import NAMES, make_strategies  # noqa: E402
from tests.unit.peers.sim.test_simulator import fixed  # noqa: E402  (a hand-made plan, as the tests use)


def tiny(n: int, availability: list[float] | None = None) -> Scenario:
    bw = np.full((n, n), 1e9)
    lat = np.full((n, n), 0.001)
    np.fill_diagonal(lat, 0.0)
    devices: list[dict[str, Any]] = []
    for i in range(n):
        d: dict[str, Any] = {"id": f"d{i}", "tflops": 0.002 * (1 + i % 3), "memory_gib": 16}
        if availability is not None:
            d["mean_uptime_h"] = availability[i]
            d["mean_downtime_h"] = 1.0 - availability[i]
        devices.append(d)
    return parse_scenario(
        {
            "name": "tiny",
            "devices": devices,
            "latency_s": lat.tolist(),
            "bandwidth_Bps": [[None if i == j else float(bw[i, j]) for j in range(n)] for i in range(n)],
            "model": {"layers": 4, "hidden": 128, "seq_len": 128, "vocab": 256, "params": 1_000_000, "dtype_bytes": 2},
            "batch": {"sequences": 8, "micro_batch": 1},
        }
    )


def dump(sim: Simulation) -> dict[str, Any]:
    r = sim.run()
    out = dataclasses.asdict(r)
    out["wall_s"] = 0.0
    world = sim.world
    out["_counts"] = dict(sorted(world.counts.items()))
    out["_engine_counts"] = dict(sorted(world.engine.counts.items()))
    out["_now"] = world.engine.now
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="write every run's results here as JSON")
    args = parser.parse_args()
    results: dict[str, Any] = {}
    scenarios: list[tuple[str, Scenario, float]] = [
        (p.stem, load_scenario(p), 0.5) for p in sorted((ROOT / "docs" / "scenarios").glob("*.json"))
    ]
    scenarios.append(("synthetic-16", synthetic_scenario(16, seed=3, churn=True), 0.5))
    scenarios.append(("synthetic-24-2r", synthetic_scenario(24, seed=7, regions=2, churn=True), 0.3))
    churny = synthetic_scenario_dict(20, seed=5, churn=True)
    for i, d in enumerate(churny["devices"]):  # volunteers who come and go every few minutes
        d["mean_uptime_h"], d["mean_downtime_h"] = 0.15 + 0.05 * (i % 4), 0.05
    scenarios.append(("churny-20", parse_scenario(churny), 0.5))
    for name, sc, hours in scenarios:
        shape = plan(sc, PlannerConfig(time_budget_s=0.5, seed=1)).shape
        for strategy in make_strategies(list(NAMES), shape, 0.5, 1):
            for churn in (True, False):
                key = f"{name}/{strategy.name}/churn={churn}"
                started = time.process_time()
                try:
                    results[key] = dump(Simulation(sc, strategy, SimConfig(hours=hours, seed=1, churn=churn)))
                except ScenarioError as e:
                    results[key] = {"error": str(e)}
                print(f"{key}: {time.process_time() - started:.1f}s", file=sys.stderr)
    # Hand-made swarms: reduction groups, a head leaving, server failovers (the ledger rebuilt),
    # a server and its standby leaving together, a blip, a departure mid-share.
    hand = {
        "groups": (tiny(5), fixed(((0,), (1,), (2,), (3,)), (4,), (4,), k=2, groups=(2,)), []),
        "head-leaves": (
            tiny(5),
            fixed(((0,), (1,), (2,), (3,)), (4,), (4,), k=2, groups=(2,)),
            [ChurnEvent(600.0, 0, False)],
        ),
        "cell-leaves": (tiny(5), fixed(((0, 1), (2, 3)), (2, 2), (0, 1), k=4), [ChurnEvent(600.3, 3, False)]),
        "mid-round": (
            tiny(5),
            fixed(((0, 1), (2, 3)), (2, 2), (0, 1), k=1, local_steps=4),
            [ChurnEvent(611.7, 3, False)],
        ),
        "failover": (
            tiny(5, [0.9, 0.9, 0.9, 0.9, 0.99]),
            fixed(((0, 1), (2, 3)), (2, 2), (0, 1), k=4),
            [ChurnEvent(600.0, 0, False)],
        ),
        "blip": (
            tiny(5),
            fixed(((0, 1), (2, 3)), (2, 2), (0, 1), k=4),
            [ChurnEvent(600.0, 1, False), ChurnEvent(610.0, 1, True)],
        ),
        "both-leave": (
            tiny(5, [0.9, 0.9, 0.9, 0.9, 0.99]),
            fixed(((0, 1), (2, 3)), (2, 2), (0, 1), k=4),
            [ChurnEvent(600.0, 0, False), ChurnEvent(600.0, 4, False)],
        ),
        "shards2": (
            tiny(6, [0.9, 0.95, 0.9, 0.9, 0.99, 0.97]),
            fixed(((0, 1), (2, 3)), (2, 2), (0, 1), k=2, local_steps=2),
            [ChurnEvent(400.0, 1, False), ChurnEvent(900.0, 1, True), ChurnEvent(1200.0, 4, False)],
        ),
    }
    for key, (sc, strategy, events) in hand.items():
        up = np.ones(sc.n, dtype=bool)
        results[f"hand/{key}"] = dump(Simulation(sc, strategy, SimConfig(hours=0.5, detect_s=30.0), (up, events)))
    text = json.dumps(results, indent=1, sort_keys=True, default=repr)
    if args.out is not None:
        args.out.write_text(text)
    print(f"{len(results)} simulations, sha256 {hashlib.sha256(text.encode()).hexdigest()}")


if __name__ == "__main__":
    main()
