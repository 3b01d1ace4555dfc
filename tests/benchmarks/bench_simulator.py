"""How long the simulator takes at scale, and how much memory it holds (figures, no assertions).

    .venv/bin/python tests/benchmarks/bench_simulator.py --devices 1000 --hours 2

A synthetic scenario (``swarmd.peers.planning.scenario_gen``, three regions, devices that come and go)
of the given size, simulated with swarmd's strategy; prints the setup (building the scenario
and the first plan, which fixes the run's stages), the wall time of the simulation, the events,
the peak resident memory, and the run's figures.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time

from swarmd.peers.planning.planner import PlannerConfig, plan
from swarmd.peers.planning.scenario_gen import synthetic_scenario
from swarmd.peers.sim.simulator import SimConfig, simulate
from swarmd.peers.sim.strategies import make_strategies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--devices", type=int, nargs="+", default=[1000])
    parser.add_argument("--hours", type=float, default=2.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    for n in args.devices:
        started = time.perf_counter()
        scenario = synthetic_scenario(n, churn=True, seed=args.seed)
        scenario_s = time.perf_counter() - started
        started = time.perf_counter()
        shape = plan(scenario, PlannerConfig(time_budget_s=1.0, seed=args.seed)).shape
        plan_s = time.perf_counter() - started
        (strategy,) = make_strategies(["swarmd"], shape, 0.5, args.seed)
        result = simulate(scenario, strategy, SimConfig(hours=args.hours, seed=args.seed))
        repairs = [e.runtime_s for e in result.plan_events if e.kind == "repair"]
        rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(
            f"{n} devices, {args.hours:g} h: setup {scenario_s + plan_s:.1f} s (scenario {scenario_s:.1f} s, "
            f"first plan {plan_s:.1f} s), simulated in {result.wall_s:.0f} s (its own first plan "
            f"{result.plan_events[0].runtime_s:.1f} s), {result.events:,} events, "
            f"peak RSS {rss_mib:.0f} MiB"
        )
        print(
            f"  shape {result.shape[0]} x {result.shape[1]}, K {result.shards}, H {result.local_steps}, "
            f"k {result.share_micro_batches}: {result.tokens_per_s:,.0f} trained tokens/s "
            f"({result.tokens_per_s / result.compute_bound_tokens_per_s:.2%} of the compute bound), "
            f"{result.updates} updates, {result.updates_lost} lost, {result.shares_recomputed} shares recomputed, "
            f"{result.stale_dropped} contributions stale, {result.departures} departures, "
            f"{result.failovers} failovers, {len(repairs)} repairs "
            f"(median {statistics.median(repairs) * 1e3 if repairs else 0:.1f} ms, "
            f"max {max(repairs, default=0) * 1e3:.0f} ms)"
        )
        print(
            f"  elections: {result.coordinator_changes} coordinator changes, {result.plans_lost} plans lost with "
            f"their coordinator, {result.relays} relays, {result.relayed_transfers:,} transfers relayed, "
            f"{result.spare_claims} cells taken by spares"
        )


if __name__ == "__main__":
    main()
