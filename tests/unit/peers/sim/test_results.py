"""peers/sim/results.py, workload.py, churn.py and control.py's helpers: the bounds a run is
held against, what a run's messages weigh, churn drawn from a scenario, recovery times."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from swarmd.peers.planning.plan_cost import stage_parameters
from swarmd.peers.planning.scenario import Scenario, interface_rates, parse_scenario
from swarmd.peers.sim.churn import ChurnEvent, churn_schedule, expected_departures
from swarmd.peers.sim.control import median_rates
from swarmd.peers.sim.results import compute_bound_tokens_per_s, flops_per_token, recovery_times, single_device
from swarmd.peers.sim.workload import Workload
from swarmd.peers.wire.sizes import message_bytes

pytestmark = pytest.mark.timeout(30)


def scenario(devices: list[dict[str, Any]], params: float = 1_000_000) -> Scenario:
    n = len(devices)
    return parse_scenario(
        {
            "name": "t",
            "devices": devices,
            "latency_s": [[0.0 if i == j else 0.001 for j in range(n)] for i in range(n)],
            "bandwidth_Bps": [[None if i == j else 1e6 * (1 + i) for j in range(n)] for i in range(n)],
            "model": {"layers": 4, "hidden": 128, "seq_len": 128, "vocab": 256, "params": params, "dtype_bytes": 2},
            "batch": {"sequences": 8, "micro_batch": 1},
        }
    )


def test_the_compute_bound_counts_each_device_while_it_is_up() -> None:
    sc = scenario([{"id": "a", "tflops": 10.0, "memory_gib": 8}, {"id": "b", "tflops": 30.0, "memory_gib": 8}])
    # b is down for the middle half of the run: on average 10 + 30 / 2 TFLOPS.
    churn = [ChurnEvent(250.0, 1, False), ChurnEvent(750.0, 1, True)]
    bound = compute_bound_tokens_per_s(sc, np.ones(2, dtype=bool), churn, 1000.0)
    assert bound == pytest.approx(25e12 / flops_per_token(sc))


def test_the_single_device_is_the_fastest_that_holds_the_model_with_its_optimizer_state() -> None:
    big = {"id": "big", "tflops": 50.0, "memory_gib": 32}
    small = {"id": "small", "tflops": 200.0, "memory_gib": 16}
    sc = scenario([big, small], params=1.3e9)  # 16 B a parameter: 19 GiB and more, over 16 GiB
    alone = single_device(sc)
    assert alone.device == "big" and alone.tokens_per_s == pytest.approx(50e12 / flops_per_token(sc))
    assert single_device(scenario([small], params=1.3e9)).tokens_per_s is None


def test_a_stages_parameters_are_its_layers_and_the_embedding_first_and_head_last() -> None:
    sc = scenario([{"id": "a", "tflops": 1.0, "memory_gib": 8}])
    layer = sc.model.layer_params
    assert stage_parameters(sc, (4,)) == [round(4 * layer + 256 * 128)]
    assert stage_parameters(sc, (1, 2, 1)) == [round(layer + 256 * 128), round(2 * layer), round(layer + 256 * 128)]
    w = Workload.of(sc, (2, 2), (3, 1))
    assert sum(w.shard_elements[0]) == stage_parameters(sc, (2, 2))[0] and len(w.shard_elements[0]) == 3
    # Activations: fp16 on a fast link, int8 with its scales on a slow one; deltas fp16, slices fp32.
    assert w.activation_bytes(1e9) == message_bytes(128 * 128, "fp16", ndim=3)
    assert w.activation_bytes(1e6) == message_bytes(128 * 128, "int8", ndim=3)
    elements = w.shard_elements[1][0]
    assert w.pull_bytes(1, 0, 3, keep_versions=8) == 3 * message_bytes(elements, "fp16")
    assert w.pull_bytes(1, 0, 9, keep_versions=8) == message_bytes(elements, "fp32")
    assert w.checkpoint_bytes(1, 0) == message_bytes(4 * elements, "fp32")


def test_a_checkpointed_stages_backward_runs_its_layers_forward_again() -> None:
    sc = scenario([{"id": "a", "tflops": 1.0, "memory_gib": 8}])
    plain = Workload.of(sc, (2, 3), (1, 1))
    checkpointed = Workload.of(sc, (2, 3), (1, 1), (False, True))
    assert checkpointed.forward_flops == plain.forward_flops
    assert checkpointed.backward_flops[0] == plain.backward_flops[0]
    again = checkpointed.backward_flops[1] - plain.backward_flops[1]
    # The planner's price: a third of the stage's layers' flops (not the head's), per micro-batch.
    assert again == pytest.approx(3 * sc.model.layer_flops_per_sequence() * sc.micro_batch / 3)


def test_churn_is_drawn_once_per_seed_and_alternates() -> None:
    devices = [
        {"id": f"d{i}", "tflops": 1.0, "memory_gib": 8, "mean_uptime_h": 2.0 + i, "mean_downtime_h": 0.5}
        for i in range(6)
    ]
    sc = scenario(devices)
    up0, events = churn_schedule(sc, 200 * 3600.0, seed=3)
    again = churn_schedule(sc, 200 * 3600.0, seed=3)
    assert np.array_equal(up0, again[0]) and events == again[1]
    assert events == sorted(events) and all(0 < e.at_s < 200 * 3600 for e in events)
    for d in range(sc.n):
        states = [bool(up0[d])] + [e.up for e in events if e.device == d]
        assert all(a != b for a, b in zip(states, states[1:], strict=False))  # up, down, up, ...
    departures = sum(not e.up for e in events)
    assert 0.8 < departures / expected_departures(sc, 200 * 3600.0) < 1.2
    steady = scenario([{"id": "a", "tflops": 1.0, "memory_gib": 8}])
    assert churn_schedule(steady, 3600.0, seed=0)[1] == []  # devices that never leave


def test_recovery_is_the_time_until_throughput_is_back() -> None:
    timeline = [10] * 10 + [2, 3, 9, 10, 10]
    assert recovery_times(timeline, 60.0, [610.0]) == [13 * 60.0 - 610.0]
    assert recovery_times(timeline, 60.0, [30.0]) == []  # no window before it
    assert recovery_times([10] * 10 + [1, 1], 60.0, [600.0]) == []  # never back before the end


def test_connectivity_is_the_median_link_leaving_out_the_diagonal() -> None:
    bw = np.array([[np.inf, 1.0, 2.0, 9.0], [5.0, np.inf, 6.0, 7.0], [1.0, 1.0, 0.0, 3.0], [4.0, 4.0, 4.0, 4.0]])
    assert median_rates(bw, block=3).tolist() == [2.0, 6.0, 1.0, 4.0]  # blocks of 3 rows, then 1
    assert median_rates(np.zeros((1, 1))).tolist() == [0.0]


def test_interfaces_run_at_the_fastest_link_and_ignore_the_diagonal() -> None:
    # The planner's function, which the simulator's links take each device's interfaces from.
    bw = np.array([[1e12, 5.0, 2.0], [1.0, 0.0, 3.0], [7.0, 4.0, 1e12]])
    up, down = interface_rates(bw)
    assert up.tolist() == [5.0, 3.0, 7.0] and down.tolist() == [7.0, 5.0, 3.0]
