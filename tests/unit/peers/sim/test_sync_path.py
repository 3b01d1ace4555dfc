"""peers/sim/sync_path.py and allreduce.py: the baselines' own synchronous data paths (DT-FM,
SWARM, DiLoCo) and the ring all-reduce, on small swarms whose timing can be worked out by hand."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from swarmd.peers.planning.plan_cost import Plan, stage_parameters
from swarmd.peers.planning.scenario import Scenario, parse_scenario
from swarmd.peers.sim.allreduce import all_reduce, ring_order, ring_seconds
from swarmd.peers.sim.churn import ChurnEvent
from swarmd.peers.sim.simulator import SimConfig, Simulation, Strategy
from swarmd.peers.sim.strategies import diloco_plan
from swarmd.peers.sim.timing import pipeline_timing
from swarmd.peers.sim.workload import Workload
from swarmd.peers.sim.world import World
from swarmd.peers.taskpool.exchange import share_seconds
from swarmd.peers.wire.sizes import message_bytes

pytestmark = pytest.mark.timeout(120)


def scenario(n: int, memory: list[float] | None = None, regions: list[str] | None = None) -> Scenario:
    lat = np.full((n, n), 0.001)
    np.fill_diagonal(lat, 0.0)
    devices: list[dict[str, Any]] = [
        {"id": f"d{i}", "tflops": 0.002, "memory_gib": (memory or [16] * n)[i], "region": (regions or ["r"] * n)[i]}
        for i in range(n)
    ]
    return parse_scenario(
        {
            "name": "tiny",
            "devices": devices,
            "latency_s": lat.tolist(),
            "bandwidth_Bps": [[None if i == j else 1e8 for j in range(n)] for i in range(n)],
            "model": {"layers": 4, "hidden": 128, "seq_len": 128, "vocab": 256, "params": 1_000_000, "dtype_bytes": 2},
            "batch": {"sequences": 8, "micro_batch": 1},
        }
    )


def fixed(rows: tuple[tuple[int, ...], ...], layers: tuple[int, ...], path: str) -> Strategy:
    """A hand-made plan, re-planned on every change as the live devices in order, row by row."""
    first = Plan(pipelines=rows, layers_per_stage=layers, parameter_servers=rows[0])

    def again(view: Scenario) -> Plan:
        if view.n == len(first.devices()):
            return first
        stages = len(layers)
        grid = tuple(tuple(range(p * stages, (p + 1) * stages)) for p in range(view.n // stages))
        return Plan(pipelines=grid, layers_per_stage=layers, parameter_servers=grid[0])

    return Strategy(path, again, None, relays=False, data_path=path)


def simulation(
    sc: Scenario, strategy: Strategy, hours: float, events: list[ChurnEvent] | None = None, **settings: Any
) -> Simulation:
    return Simulation(sc, strategy, SimConfig(hours=hours, **settings), (np.ones(sc.n, dtype=bool), events or []))


def test_a_ring_all_reduce_sends_two_n_minus_one_over_n_of_the_bytes_and_waits_for_its_slowest_hop() -> None:
    sc = scenario(3, regions=["b", "a", "a"])
    world = World(sc, SimConfig(hours=0.1), np.ones(sc.n, dtype=bool))
    assert ring_order(world, [0, 1, 2]) == [1, 2, 0]  # by region, then ID
    done: list[float] = []
    all_reduce(world, 0.0, [0, 1, 2], 3e8, lambda t, _: done.append(t), None)
    world.engine.run_until(100.0, 1000)
    # Each member sends 2 * 2 / 3 of 300 MB (400 MB, 4 s at 100 MB/s) and the four chunk steps
    # each wait for a hop's 1 ms; the flows' own latency is one more.
    assert ring_seconds(world, [1, 2, 0]) == pytest.approx(0.004)
    assert done == [pytest.approx(4.0 + 0.001 + 0.004)]


def test_dtfm_steps_are_the_slowest_pipelines_1f1b_then_each_stages_all_reduce() -> None:
    # Two pipelines of two stages; a batch of 8 micro-batches is 4 a pipeline a step.
    sc = scenario(4)
    sim = simulation(sc, fixed(((0, 1), (2, 3)), (2, 2), "dtfm"), 0.5)
    r = sim.run()
    t = pipeline_timing(sim.world, Workload.of(sc, (2, 2), (1, 1)), (0, 1))
    compute = share_seconds(t.forward_s, t.backward_s, t.send_s, 4)
    params = stage_parameters(sc, (2, 2))
    # Two members a ring: each sends the whole stage (2 (N-1) / N = 1) to the other, in fp16.
    reduce = max(message_bytes(p, "fp16") / 1e8 + 0.001 + 0.002 for p in params)
    step = compute + reduce
    assert r.updates == pytest.approx(1800 / step, abs=1.5)
    assert r.tokens == r.updates * 8 * 128 and r.shares_recomputed == 0 and r.staleness == {0: r.updates}


def test_dtfm_loses_the_step_a_departure_interrupts_and_waits_for_its_new_plan() -> None:
    sc = scenario(5)
    sim = simulation(sc, fixed(((0, 1), (2, 3)), (2, 2), "dtfm"), 0.5, [ChurnEvent(600.0, 3, False)], detect_s=30.0)
    sim.advance(599.0)
    assert sim.plane.phase != "idle"  # type: ignore[attr-defined]
    r = sim.run()
    assert r.shares_recomputed == 1 and r.micro_batches_recomputed == 8  # the aborted step
    assert [e.kind for e in r.plan_events] == ["full", "replan"]  # from scratch, once it is noticed
    assert r.phases["weights"]["n"] >= 1  # the new member fetched its stage
    assert sum(r.timeline[12:]) > 0  # and the steps go on


def test_swarm_reroutes_a_departed_peers_work_and_its_step_goes_on() -> None:
    sc = scenario(4)
    sim = simulation(sc, fixed(((0, 1), (2, 3)), (2, 2), "swarm"), 0.5, [ChurnEvent(600.0, 3, False)], detect_s=30.0)
    r = sim.run()
    assert sim.world.counts["rerouted"] + r.shares_recomputed >= 1
    assert sum(r.timeline[11:]) > 0 and r.updates_lost == 0


def test_diloco_replicas_are_the_devices_that_hold_the_model_and_a_departed_one_loses_its_round() -> None:
    sc = scenario(3, memory=[16, 16, 0.01])  # d2 cannot hold the model alone
    assert diloco_plan(sc).pipelines == ((0,), (1,))
    strategy = Strategy("diloco", diloco_plan, None, relays=False, data_path="diloco")
    sim = simulation(sc, strategy, 3.0, [ChurnEvent(600.0, 1, False)], detect_s=30.0)
    r = sim.run()
    # H = 500 inner steps of 4 micro-batches (the batch of 8 over two replicas): 2,000 a replica
    # a round, 0.43 s each. d1 leaves in the first round: only d0's 2,000 count; re-planned
    # alone, d0 takes the whole batch an inner step from the next round on (4,000 a round).
    assert r.local_steps == 500 and r.share_micro_batches == 8 and r.final_pipelines == 1
    assert r.micro_batches_recomputed == 2000 and r.updates >= 2
    assert r.tokens == (2000 + (r.updates - 1) * 4000) * 128
