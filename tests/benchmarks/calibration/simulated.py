"""The simulated side: the same swarm simulated by ``swarmd.peers.sim`` with swarmd's planner,
from the plan the real daemons followed, over as many windows as it takes to average out the
phase a window starts at, and set against the real side's figures.
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import asdict, replace
from typing import Any

import numpy as np

from swarmd.models.presets import DEFAULT_RUN
from swarmd.peers.membership.election import coordination_round_s
from swarmd.peers.planning.plan_cost import Plan
from swarmd.peers.planning.planner import PlannerConfig, plan, repair
from swarmd.peers.planning.scenario import Scenario
from swarmd.peers.sim.churn import ChurnEvent
from swarmd.peers.sim.simulator import SimConfig, Simulation, Strategy
from swarmd.peers.sim.swarmd_path import SwarmdPath
from tests.benchmarks.calibration.scenario import HEARTBEAT_INTERVAL_S, HEARTBEAT_TTL_S, tokens_per_micro_batch
from tests.benchmarks.calibration.sides import BUCKET_S, LEDGER_COUNTS, Side, mean_side, summarize

SIM_WINDOWS = 24
"""Simulated windows per comparison, each after its own warm-up (``WARMUP_S`` and then
``WARMUP_STEP_S`` apart): the real window starts at some moment of a running swarm, and one
simulated window alone would carry the phase of its start. Their figures are averaged."""
WARMUP_S = 20.0
WARMUP_STEP_S = 2.0
SHARE_LEASE_S = 600.0  # a share's lease at the daemon's ledger (``swarmd.training.shards.ledger_host.LEASE_S``)
PLAN_BUDGET_S = 0.5  # the daemons' coordinator's planning budget (``swarmd.node.plan_publisher.PLAN_BUDGET_S``)


def swarmd_strategy(name: str, fixed: Plan | None = None) -> Strategy:
    """swarmd's planner as the daemons' coordinator runs it (the run's stages and H fixed, the
    layers cut evenly): its own full plan, or ``fixed`` to start from; its repair on changes."""
    fixed_h = DEFAULT_RUN["exchange"]["local_steps"] or None
    settings = PlannerConfig(
        time_budget_s=PLAN_BUDGET_S, seed=0, stages=DEFAULT_RUN["stages"], local_steps=fixed_h, even_layers=True
    )

    def full(view: Scenario) -> Plan:
        return fixed if fixed is not None else plan(view, settings)

    def mend(view: Scenario, previous: Plan, previous_ids: list[str]) -> Plan:
        return repair(view, previous, previous_ids, settings).plan

    def mend_live(scenario: Scenario, live: np.ndarray, previous: Plan) -> Plan:
        return repair(scenario, previous, scenario.ids, settings, live=live).plan

    return Strategy(name, full, mend, mend_live)


def recorded_plan(recorded: dict[str, Any]) -> Plan:
    """The plan the real daemons followed (``real_run``'s ``plan``, by daemon index) as a ``Plan``."""
    return Plan(
        pipelines=tuple(tuple(row) for row in recorded["pipelines"]),
        layers_per_stage=tuple(recorded["layers_per_stage"]),
        parameter_servers=tuple(recorded["parameter_servers"]),
        shard_servers=tuple(tuple(row) for row in recorded["shard_servers"]),
        local_steps=recorded["local_steps"],
        share_micro_batches=recorded["share_micro_batches"],
    )


def describe(p: Plan) -> str:
    """A plan's cells and shard servers, by daemon index."""
    stages = "; ".join(
        f"stage {s} on {', '.join(f'd{row[s]}' for row in p.pipelines)}, shards at "
        f"{', '.join(f'd{d}' for d in p.shard_servers[s])}"
        for s in range(len(p.layers_per_stage))
    )
    return f"{stages} (H = {p.local_steps}, k = {p.share_micro_batches or 'from the batch'})"


def compare(args: argparse.Namespace, scenario: Scenario, real: dict) -> tuple[dict[str, Side], dict[str, Any]]:
    """Simulate the scenario for as long, with the daemon killed in the real run leaving at the
    kill: ``SIM_WINDOWS`` windows, each after its own warm-up, averaged. The simulation starts
    from the placement the real daemons followed (their coordinator planned on the links it
    measured, which can differ from the emulated ones) and repairs it with swarmd's planner; it
    is also run from its own plan of the emulated links, and both are reported. Returns each
    side's figures and the simulation's detail (for ``report``)."""
    own = swarmd_strategy("swarmd")
    own_plan = own.full_plan(scenario)
    recorded = real.get("plan")
    if recorded:
        real_plan = recorded_plan(recorded)
        strategy = swarmd_strategy("swarmd on the real plan", real_plan)
    else:  # the daemons followed no plan the harness could read
        real_plan, strategy = own_plan, own
    victim = real.get("victim")
    if victim is None:
        workers = {d for row in real_plan.pipelines for d in row}
        victim = max(workers - {d for row in real_plan.shard_servers for d in row} or workers)
    data_path = real.get("data_path") or {}
    settings = SimConfig(
        churn=False,
        detect_s=HEARTBEAT_TTL_S,
        join_s=5.0,
        lease_s=SHARE_LEASE_S,
        bucket_s=BUCKET_S,
        max_staleness=DEFAULT_RUN["optimizer"]["max_staleness"],
        standing_queue_s=real.get("standing_queue_s", 0.0),
        # beside a transfer on its connection a request also met both ends'
        # standing queues, which the simulation adds on its own
        # (a window of bytes: longer on a slower link)
        connection_queue_bytes=max(
            0.0,
            data_path.get("loaded_rtt_s", 0.0)
            - data_path.get("idle_rtt_s", 0.0)
            - 2 * real.get("standing_queue_s", 0.0),
        )
        * float(scenario.bandwidth_Bps[0, 1]),
        request_overhead_s=max(0.0, data_path.get("idle_rtt_s", 0.0) - 2 * float(scenario.latency_s[0, 1])),
        # the daemons' coordination rounds at their heartbeat, and no relays
        coordinate_s=coordination_round_s(HEARTBEAT_INTERVAL_S),
        data_via_relay="never",
    )
    tokens = tokens_per_micro_batch()
    windows = [
        simulate_window(scenario, strategy, settings, WARMUP_S + k * WARMUP_STEP_S, args, victim)
        for k in range(SIM_WINDOWS)
    ]
    simulated = [summarize(timeline, args.kill_at, tokens) for timeline, _ in windows]
    sides = {"real": summarize(real["timeline"], args.kill_at, tokens), "simulated": mean_side(simulated)}
    if recorded:
        own_windows = [
            summarize(
                simulate_window(scenario, own, settings, WARMUP_S + k * WARMUP_STEP_S, args, victim)[0],
                args.kill_at,
                tokens,
            )
            for k in range(SIM_WINDOWS)
        ]
        sides["simulated on its own plan"] = mean_side(own_windows)
    detail = {
        "plans": {"real": describe(real_plan) if recorded else None, "own": describe(own_plan)},
        "victim": victim,
        "windows": [asdict(side) for side in simulated],
        "sent_MB": np.mean([d["sent_MB"] for _, d in windows], axis=0).round(1).tolist(),
        "received_MB": np.mean([d["received_MB"] for _, d in windows], axis=0).round(1).tolist(),
        "updates": statistics.mean(d["updates"] for _, d in windows),
        "ledger": {key: statistics.mean(d["ledger"][key] for _, d in windows) for key in LEDGER_COUNTS},
        "roles": windows[0][1]["roles"],
        "standing_queue_s": settings.standing_queue_s,
        "connection_queue_bytes": settings.connection_queue_bytes,
        "request_overhead_s": settings.request_overhead_s,
    }
    return sides, detail


def simulate_window(
    scenario: Scenario, strategy: Strategy, settings: SimConfig, warm_s: float, args: argparse.Namespace, victim: int
) -> tuple[list[int], dict[str, Any]]:
    """A window of ``args.seconds`` after ``warm_s`` of simulated training (the real window
    starts in a swarm that has trained a while, too), with ``victim`` leaving ``args.kill_at``
    into it: the window's timeline, and the bytes, updates of shard (0, 0) and ledger counts in
    it (the counters as they stood when the window began are taken off)."""
    churn = [ChurnEvent(warm_s + args.kill_at, victim, False)]
    sim = Simulation(
        scenario,
        strategy,
        replace(settings, hours=(warm_s + args.seconds) / 3600),
        (np.ones(args.devices, dtype=bool), churn),
    )
    sim.advance(warm_s)
    path = sim.plane
    assert isinstance(path, SwarmdPath)  # the calibration runs swarmd's data path
    sent, received = sim.world.engine.carried(warm_s)
    updates, ledger = sim.world.updates, asdict(path.ledger.ledger.counters)
    result = sim.run()
    first = int(round(warm_s / BUCKET_S))
    return result.timeline[first : first + int(np.ceil(args.seconds / BUCKET_S))], {
        "sent_MB": ((np.array(result.sent_bytes) - sent) / 1e6).tolist(),
        "received_MB": ((np.array(result.received_bytes) - received) / 1e6).tolist(),
        "updates": result.updates - updates,
        "ledger": {key: getattr(path.ledger.ledger.counters, key) - ledger[key] for key in LEDGER_COUNTS},
        "roles": {int(d): r for d, r in sorted(result.roles.items())},
    }
