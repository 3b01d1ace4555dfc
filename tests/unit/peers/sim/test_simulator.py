"""peers/sim/simulator.py and its data plane: small swarms on hand-made plans and hand-made
departures, where the outcome can be worked out by hand (one device alone, two pipelines, a
killed cell recomputed, a killed server failed over, contributions dropped as stale, relays)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from swarmd.peers.planning.plan_cost import Plan
from swarmd.peers.planning.planner import PlannerConfig, plan
from swarmd.peers.planning.scenario import Scenario, parse_scenario
from swarmd.peers.sim.churn import ChurnEvent
from swarmd.peers.sim.results import SimResult, flops_per_token, single_device
from swarmd.peers.sim.simulator import SimConfig, Simulation, Strategy, simulate
from swarmd.peers.sim.swarmd_path import SwarmdPath
from swarmd.peers.sim.workload import Workload
from swarmd.peers.taskpool.exchange import share_seconds
from swarmd.peers.taskpool.reduction import group_size
from swarmd.peers.wire.sizes import message_bytes

pytestmark = pytest.mark.timeout(120)

TFLOPS = 0.002
"""Slow devices: a micro-batch of the tiny model below takes 0.43 s, a share seconds."""


def scenario(n: int, bw: np.ndarray | None = None, availability: list[float] | None = None, batch: int = 8) -> Scenario:
    bw = np.full((n, n), 1e9) if bw is None else bw
    lat = np.full((n, n), 0.001)
    np.fill_diagonal(lat, 0.0)
    devices: list[dict[str, Any]] = []
    for i in range(n):
        device: dict[str, Any] = {"id": f"d{i}", "tflops": TFLOPS, "memory_gib": 16}
        if availability is not None:  # reliability for the elections only: churn is given by hand
            device["mean_uptime_h"] = availability[i]
            device["mean_downtime_h"] = 1.0 - availability[i]
        devices.append(device)
    return parse_scenario(
        {
            "name": "tiny",
            "devices": devices,
            "latency_s": lat.tolist(),
            "bandwidth_Bps": [[None if i == j else float(bw[i, j]) for j in range(n)] for i in range(n)],
            "model": {"layers": 4, "hidden": 128, "seq_len": 128, "vocab": 256, "params": 1_000_000, "dtype_bytes": 2},
            "batch": {"sequences": batch, "micro_batch": 1},
        }
    )


def fixed(
    rows: tuple[tuple[int, ...], ...],
    layers: tuple[int, ...],
    servers: tuple[int, ...],
    k: int,
    local_steps: int = 1,
    groups: tuple[int, ...] = (),
) -> Strategy:
    """A hand-made plan (device indices of the scenario, all up at the start); a repair keeps
    every live holder and fills a hole with the first live device that holds nothing."""
    first = Plan(
        pipelines=rows,
        layers_per_stage=layers,
        parameter_servers=servers,
        local_steps=local_steps,
        share_micro_batches=k,
        reduce_groups=groups,
    )

    def mend(view: Scenario, previous: Plan, ids: list[str]) -> Plan:
        index = view.index()
        grid = [[index.get(ids[d], -1) for d in row] for row in previous.pipelines]
        free = [d for d in range(view.n) if all(d not in row for row in grid)]
        for row in grid:
            for s, d in enumerate(row):
                if d < 0:
                    if not free:
                        raise ValueError("no device to fill the hole")  # as the planner's PlanError
                    row[s] = free.pop(0)
        ps = tuple(index.get(ids[d], grid[0][s]) for s, d in enumerate(previous.parameter_servers))
        return Plan(
            pipelines=tuple(tuple(r) for r in grid),
            layers_per_stage=layers,
            parameter_servers=ps,
            local_steps=local_steps,
            share_micro_batches=k,
            reduce_groups=groups,
        )

    return Strategy("fixed", lambda view: first, mend)


def path(sim: Simulation) -> SwarmdPath:
    """The run's data path: swarmd's, whose parts the tests look into."""
    assert isinstance(sim.plane, SwarmdPath)
    return sim.plane


def run(
    sc: Scenario, strategy: Strategy, hours: float, events: list[ChurnEvent] | None = None, **settings: Any
) -> SimResult:
    return simulate(sc, strategy, SimConfig(hours=hours, **settings), (np.ones(sc.n, dtype=bool), events or []))


def micro_batch_s(sc: Scenario, layers: int) -> tuple[float, float]:
    """Forward and backward seconds of one micro-batch of ``layers`` layers (and the head)."""
    w = Workload.of(sc, (layers,), (1,))
    return w.forward_flops[0] / (TFLOPS * 1e12), w.backward_flops[0] / (TFLOPS * 1e12)


def test_one_device_alone_trains_at_its_compute_bound() -> None:
    # One device holds the only cell and the only shard, with nobody to be its standby: each
    # share of 8 micro-batches is a batch, contributed, stepped and committed at once, and the
    # next share starts at once. Every second of compute is trained.
    sc = scenario(1)
    r = run(sc, fixed(((0,),), (4,), (0,), k=8), hours=0.5)
    forward, backward = micro_batch_s(sc, 4)
    period = share_seconds([forward], [backward], [], 8)
    assert period == pytest.approx(8 * (forward + backward))
    rounds = int(1800 // period)
    assert (r.updates, r.tokens) == (rounds, rounds * 8 * 128)
    bound = TFLOPS * 1e12 / flops_per_token(sc)
    assert r.compute_bound_tokens_per_s == pytest.approx(bound)
    assert r.tokens_per_s == pytest.approx(bound * rounds * period / 1800, rel=1e-9)
    assert single_device(sc).tokens_per_s == pytest.approx(bound)  # the model fits its 16 GiB
    assert r.updates_lost == r.shares_recomputed == r.stale_dropped == r.failovers == 0
    # Gradient mode is synchronous: the next round starts on the step its contribution made
    # (here at once, the shard is on the same device), so no contribution is stale.
    assert r.staleness == {0: rounds} and sum(r.sent_bytes) == 0  # nothing crossed a link


def test_two_pipelines_train_twice_as_fast_and_pay_exactly_their_contributions() -> None:
    # Two devices, a replica each (one stage), four micro-batches a share: one share of each
    # makes a batch of eight. d0 serves the shard and d1 is its standby: d1's contributions
    # cross the 1 GB/s link (2 ms), d0's steps are logged at d1, d1 pulls each delta.
    sc = scenario(2)
    r = run(sc, fixed(((0,), (1,)), (4,), (0,), k=4), hours=0.5)
    forward, backward = micro_batch_s(sc, 4)
    alone = TFLOPS * 1e12 / flops_per_token(sc)
    assert r.tokens_per_s == pytest.approx(2 * alone, rel=0.01)
    # Synchronous rounds: each waits for the step of the last (d1's contribution over the link,
    # the delta back), a few ms next to a share's compute.
    computed = 1800 / (4 * (forward + backward))
    assert 0.97 * computed <= r.updates <= computed + 2
    assert r.stale_dropped == r.updates_lost == r.shares_recomputed == 0 and max(r.staleness) <= 1
    shard = 1_000_000  # the one stage's parameters, embedding included
    contribution, delta = message_bytes(shard, "fp16"), message_bytes(shard, "fp16")
    checkpoint = message_bytes(4 * shard, "fp32")  # weights, two moments, residual
    # d1 sent one contribution a round, one an update (the last one may still be on its way) ...
    assert r.sent_bytes[1] == pytest.approx(r.updates * contribution, abs=contribution)
    # ... and d0 a delta a step to its standby and one to d1's pull, and every 10 a checkpoint.
    assert r.sent_bytes[0] == pytest.approx(2 * r.updates * delta + r.updates // 10 * checkpoint, abs=2 * delta)


def test_a_reduction_group_sends_the_server_one_sum_a_round_and_relays_its_deltas() -> None:
    # Four one-stage pipelines (d0-d3) in groups of two, d4 the server: d0 heads (d0, d1), d2
    # heads (d2, d3). Each round the server takes two sums instead of four slices and sends
    # two deltas instead of four, and the swarm trains as fast as without the groups (the links
    # are fast: the extra hop costs ms).
    sc = scenario(5)
    rows = ((0,), (1,), (2,), (3,))
    plain = run(sc, fixed(rows, (4,), (4,), k=2), hours=0.25)
    sim = Simulation(sc, fixed(rows, (4,), (4,), k=2, groups=(2,)), SimConfig(hours=0.25), (np.ones(5, dtype=bool), []))
    r = sim.run()
    assert r.tokens_per_s == pytest.approx(plain.tokens_per_s, rel=0.05)
    assert sim.world.counts["reduced_parts"] == 2 * sim.world.counts["reduced_sums"]
    assert sim.world.counts["reduced_sums"] >= 2 * (r.updates - 2)  # two groups, one round an update
    assert r.updates_lost == r.stale_dropped == 0
    # The members' slices go to their heads and only the heads' sums to the server; the deltas
    # come back the same way: the server sends each step to the two heads (and its standby's
    # log), not to four cells, and each head passes it on to its member.
    assert r.sent_bytes[1] == pytest.approx(r.sent_bytes[3], rel=0.05)
    assert r.sent_bytes[4] < 0.7 * plain.sent_bytes[4]
    assert r.sent_bytes[0] > 1.5 * r.sent_bytes[1]


def test_the_planner_groups_a_synchronous_swarm_whose_server_binds_and_it_trains_faster() -> None:
    # 64 replicas of a small model on 30 MB/s links, gradient mode (H = 1): one shard, so every
    # round the server would take 64 slices and send 64 deltas in a burst while every pipeline
    # waits. The planner groups the pipelines by about sqrt(N), and the simulator agrees that
    # the groups train faster, by more than half, and within 30% of what the planner predicted.
    n = 65
    sc = scenario(n, bw=np.full((n, n), 3e7), batch=4 * (n - 1))
    grouped = plan(sc, PlannerConfig(time_budget_s=0.5, seed=0, local_steps=1))
    assert grouped.reduce_groups == (group_size(len(grouped.pipelines), 1),) and grouped.local_steps == 1
    assert grouped.reduce_groups[0] >= 8
    flat = replace(grouped, reduce_groups=())
    with_groups = simulate(
        sc, Strategy("grouped", lambda view: grouped, None), SimConfig(hours=0.05), (np.ones(n, dtype=bool), [])
    )
    without = simulate(
        sc, Strategy("flat", lambda view: flat, None), SimConfig(hours=0.05), (np.ones(n, dtype=bool), [])
    )
    assert with_groups.tokens_per_s > 1.5 * without.tokens_per_s
    predicted = grouped.meta["prediction"].tokens_per_s  # type: ignore[attr-defined]
    assert with_groups.tokens_per_s == pytest.approx(predicted, rel=0.3)


def test_a_head_that_leaves_mid_reduction_has_its_members_send_to_the_server() -> None:
    # d0 heads its group and leaves at 600 s: the slices at it or on their way go straight to
    # the server once its departure is noticed, nothing committed is lost, and training goes on.
    sc = scenario(5)
    strategy = fixed(((0,), (1,), (2,), (3,)), (4,), (4,), k=2, groups=(2,))
    sim = Simulation(
        sc, strategy, SimConfig(hours=0.5, detect_s=30.0), (np.ones(5, dtype=bool), [ChurnEvent(600.0, 0, False)])
    )
    r = sim.run()
    assert r.updates_lost == 0
    assert sum(r.timeline[12:]) > 0.5 * sum(r.timeline[:10])  # trains on after the departure


def two_by_two(availability: list[float] | None = None) -> tuple[Scenario, Strategy]:
    """Pipelines (d0, d1) and (d2, d3) of two stages, d0 and d1 the servers, d4 spare."""
    sc = scenario(5, availability=availability)
    return sc, fixed(((0, 1), (2, 3)), (2, 2), (0, 1), k=4)


def test_a_departed_cell_breaks_its_share_which_is_recomputed_and_a_spare_takes_the_cell() -> None:
    sc, strategy = two_by_two()
    sim = Simulation(
        sc, strategy, SimConfig(hours=0.5, detect_s=30.0), (np.ones(5, dtype=bool), [ChurnEvent(600.3, 3, False)])
    )
    sim.advance(600.2)
    assert path(sim).pipelines.pipelines[1].segment  # d3 leaves in the middle of a share
    r = sim.run()
    assert (r.departures, r.failovers, r.updates_lost) == (1, 0, 0)
    assert r.shares_recomputed == 1  # the share in flight, issued again
    assert r.contributions_lost == 0  # its round had nothing else in it (H = 1)
    assert r.spare_claims == 1 and [c.device for c in path(sim).pipelines.pipelines[1].cells] == [2, 4]
    assert r.phases["weights"]["n"] == 1  # d4 fetched stage 1 whole before the pipeline went on
    assert r.received_bytes[4] >= message_bytes(path(sim).sizes.workload.shard_elements[1][0], "fp32")
    assert r.phases["wait_cells"]["mean_ms"] >= 30_000  # until the lease lapsed and d4 was in
    assert [e.kind for e in r.plan_events] == ["full", "repair"]  # the repair found no hole left
    assert sum(r.timeline[12:]) > 0.9 * sum(r.timeline[:10]) * len(r.timeline[12:]) / 10


def test_a_departure_in_the_middle_of_a_round_keeps_its_shares_done_and_recomputes_the_one_in_flight() -> None:
    # H = 4 shares of one micro-batch a round. d3 (stage 1 of pipeline 1) leaves while the
    # round's third share runs: the first two stay done (stage 0 contributes them at the
    # round's end), the third is issued again, the fourth was never begun (no recompute), and
    # d3's own part of the round is lost with it (counted).
    sc = scenario(5)
    sim = Simulation(
        sc,
        fixed(((0, 1), (2, 3)), (2, 2), (0, 1), k=1, local_steps=4),
        SimConfig(hours=0.5),
        (np.ones(5, dtype=bool), []),
    )
    sim.advance(300.0)
    p = path(sim).pipelines.pipelines[1]
    while not (p.segment and p.started > 0 and len(p.segment) == 4):
        sim.advance(sim.world.engine.now + 0.01)
    leave = p.started + 2.5 * p.per_share_s
    sim.world.engine.at(leave, sim._churn, ChurnEvent(leave, 3, False))
    sim.advance(leave)
    assert p.shares_done == 2 and [len(c.round_shares) for c in p.cells] == [2, 0]
    r = sim.run()
    assert r.shares_recomputed == 1 and r.contributions_lost == 1 and r.updates_lost == 0


def test_a_departed_server_fails_over_to_its_standby_and_no_committed_update_is_lost() -> None:
    # d4, the most reliable, is every shard's standby; d0 (stage 0's server, the ledger's
    # keeper, and a cell) leaves. d4 takes the shard over at the last committed version and,
    # holding no cell, takes d0's open cell as a spare.
    sc, strategy = two_by_two(availability=[0.9, 0.9, 0.9, 0.9, 0.99])
    sim = Simulation(
        sc, strategy, SimConfig(hours=0.5, detect_s=30.0), (np.ones(5, dtype=bool), [ChurnEvent(600.0, 0, False)])
    )
    sim.advance(599.0)
    assert [shard.standby for shard in path(sim).shards.all()] == [4, 4]
    committed = path(sim).shards.stages[0][0].committed
    r = sim.run()
    assert r.failovers == 1 and r.updates_lost == 0
    assert path(sim).shards.stages[0][0].holder == 4 and path(sim).shards.stages[0][0].committed > committed
    assert r.shares_recomputed >= 1  # the shares open at the failover are issued again
    assert sum(r.timeline[12:]) > 0


def test_a_server_that_drops_off_and_is_back_before_anyone_notices_gets_its_contributions_again() -> None:
    # d1 (stage 1's server, and a cell) is away for 10 s, under the 30 s it takes to notice:
    # no failover. The contributions cut on their way to it, and those sent while it was
    # away, go again once it is back (the daemon's cells retry): its shard steps on, and
    # training does not stall on a round that never arrives.
    sc, strategy = two_by_two()
    events = [ChurnEvent(600.0, 1, False), ChurnEvent(610.0, 1, True)]
    sim = Simulation(sc, strategy, SimConfig(hours=0.5, detect_s=30.0), (np.ones(5, dtype=bool), events))
    sim.advance(599.0)
    version = path(sim).shards.stages[1][0].version
    r = sim.run()
    assert r.failovers == 0 and sim.world.engine.counts["retried"] >= 1
    assert path(sim).shards.stages[1][0].version > version + 10
    # Every minute after the blip trains at least 90% of what a minute before it did (without
    # the retry, pipeline 1 waited forever on its cut contribution: 5%).
    before = np.mean(r.timeline[1:10])
    assert min(r.timeline[12:29]) >= 0.9 * before


def test_a_server_and_its_standby_leaving_together_lose_the_committed_updates_and_count_them() -> None:
    sc, strategy = two_by_two(availability=[0.9, 0.9, 0.9, 0.9, 0.99])
    events = [ChurnEvent(600.0, 0, False), ChurnEvent(600.0, 4, False)]
    sim = Simulation(sc, strategy, SimConfig(hours=0.5, detect_s=30.0), (np.ones(5, dtype=bool), events))
    sim.advance(599.0)
    committed = path(sim).shards.stages[0][0].committed
    r = sim.run()
    assert committed > 0 and r.updates_lost >= committed  # no live copy of stage 0's shard
    batch = path(sim).sizes.exchange.batch_micro_batches
    assert r.tokens < r.updates * batch * 128  # lost updates' tokens are taken off


def test_a_contribution_that_arrives_too_many_versions_late_is_dropped_and_its_shares_settled() -> None:
    # Three replicas of one stage; a share of 4 is a batch, so every contribution steps alone.
    # d2's uplink to the server is 10 kB/s: its 2 MB contribution takes minutes, while the
    # others step every two seconds. With max_staleness 4 it is dropped, and its shares are
    # settled as the daemon's shard settles them (not trained again: with K shards, one that
    # finds a round stale would otherwise cost the whole round for 1/K of the model); with a
    # bound past the horizon's steps it is applied.
    bw = np.full((3, 3), 1e9)
    bw[2, 0] = 1e4
    sc = scenario(3, bw=bw, batch=4)
    strategy = fixed(((0,), (1,), (2,)), (4,), (0,), k=4)
    r = run(sc, strategy, hours=0.5)
    assert r.stale_dropped >= 1 and r.shares_recomputed == 0
    assert r.phases["wait_backpressure"]["n"] >= 1  # d2's pipeline waits for its last contribution
    lenient = run(sc, strategy, hours=0.5, max_staleness=100_000)
    assert lenient.stale_dropped == 0 and max(lenient.staleness) > 4


def test_a_boundary_goes_through_the_relay_when_the_daemons_rule_says_it_is_faster() -> None:
    # Pipelines (d0, d1) and (d2, d3); d4 holds no cell and has the best links: it is elected
    # the relay (one for five). d2 and d3 reach each other at 100 kB/s only: their
    # activations go through d4, and the run trains more than with relays off.
    bw = np.full((5, 5), 1e8)
    bw[2, 3] = bw[3, 2] = 1e5
    bw[4, :] = bw[:, 4] = 1e9
    sc = scenario(5, bw=bw)
    strategy = fixed(((0, 1), (2, 3)), (2, 2), (0, 1), k=4)
    sim = Simulation(sc, strategy, SimConfig(hours=0.2), (np.ones(5, dtype=bool), []))
    r = sim.run()
    direct = run(sc, strategy, hours=0.2, data_via_relay="never")
    assert sim.control.relays == [4] and r.relayed_transfers > 0 and direct.relayed_transfers == 0
    assert r.sent_bytes[4] > 0 and r.received_bytes[4] > 0  # it carried the bytes
    assert r.tokens > direct.tokens


def test_only_the_coordinator_plans_and_one_that_left_unnoticed_holds_the_repair_back() -> None:
    # Availability grows with the index: d5 coordinates (it holds no cell). d3 leaves first;
    # the coordinator leaves before that is noticed. Nobody repairs until the coordinator's
    # own departure is noticed and d4 elected: one repair covers both.
    sc = scenario(6, availability=[0.80, 0.81, 0.82, 0.83, 0.84, 0.85])
    strategy = fixed(((0, 1), (2, 3)), (2, 2), (0, 1), k=4)
    events = [ChurnEvent(590.0, 3, False), ChurnEvent(600.0, 5, False)]
    sim = Simulation(sc, strategy, SimConfig(hours=0.5, detect_s=30.0), (np.ones(6, dtype=bool), events))
    r = sim.run()
    assert r.coordinator_changes == 1 and sim.control.coordinator == 4
    assert [e.kind for e in r.plan_events] == ["full", "repair"]
    assert 630 <= r.plan_events[1].at_s < 640  # d4's first round after d5's departure was noticed
    assert r.plan_events[1].devices == 4 and r.updates_lost == 0
    assert r.spare_claims == 1  # d4 took d3's cell when its lease lapsed, before any repair


def test_a_plan_whose_coordinator_leaves_while_computing_it_is_lost_and_the_next_one_plans(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Planning takes 25 s here: every reading of the planner's clock is 25 s after the last.
    clock = iter(range(0, 10**6, 25))
    monkeypatch.setattr("swarmd.peers.sim.control.time.perf_counter", lambda: float(next(clock)))
    sc = scenario(6, availability=[0.80, 0.81, 0.82, 0.83, 0.84, 0.85])
    strategy = fixed(((0, 1), (2, 3)), (2, 2), (0, 1), k=4)
    events = [ChurnEvent(590.0, 3, False), ChurnEvent(630.0, 5, False)]
    sim = Simulation(
        sc, strategy, SimConfig(hours=0.5, detect_s=30.0, coordinate_s=0.0), (np.ones(6, dtype=bool), events)
    )
    r = sim.run()
    # d5 plans at 620 (ready at 645) and leaves at 630: its plan is lost. Nobody plans until its
    # departure is noticed, at 660, and d4 elected.
    assert r.plans_lost == 1 and sim.control.coordinator == 4
    assert [(e.kind, e.at_s) for e in r.plan_events[1:]] == [("repair", 620.0), ("repair", 660.0)]


def test_a_device_measured_slower_than_rated_simulates_at_its_measured_speed() -> None:
    measured = scenario(1)
    measured = replace(measured, devices=(replace(measured.devices[0], tflops=10 * TFLOPS, achieved_tflops=TFLOPS),))
    as_rated = run(scenario(1), fixed(((0,),), (4,), (0,), k=8), hours=0.25)
    as_measured = run(measured, fixed(((0,),), (4,), (0,), k=8), hours=0.25)
    assert (as_measured.updates, as_measured.tokens) == (as_rated.updates, as_rated.tokens) and as_rated.updates > 0
    assert as_measured.compute_bound_tokens_per_s == pytest.approx(as_rated.compute_bound_tokens_per_s)
