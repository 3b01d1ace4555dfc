"""peers/sim/churn.py and peers/sim/simulator.py: the churn drawn from a scenario, and a simulated run
on hand-made plans and hand-made departures, where the right outcome is known."""

from __future__ import annotations

import heapq
from typing import Any

import numpy as np
import pytest

from swarmd.peers.planning.plan_cost import Plan
from swarmd.peers.planning.scenario import Scenario, parse_scenario
from swarmd.peers.sim.churn import ChurnEvent, churn_schedule, expected_departures
from swarmd.peers.sim.simulator import (
    _FLOW,
    _FREE,
    _HOP,
    SimSettings,
    Simulation,
    Strategy,
    interface_rates,
    median_rates,
    recovery_times,
    simulate,
)

pytestmark = pytest.mark.timeout(120)


def scenario(n: int = 4, slow: tuple[int, int] | None = None, churn: bool = False,
             bw: np.ndarray | None = None, uptime_h: list[float] | None = None) -> Scenario:  # fmt: skip
    bw = np.full((n, n), 1e8) if bw is None else bw
    if slow is not None:
        bw[slow] = 10.0
    lat = np.full((n, n), 0.001)
    np.fill_diagonal(lat, 0.0)
    devices: list[dict[str, Any]] = [
        {
            "id": f"d{i}",
            "tflops": 0.002,
            "memory_gib": 16,
            **({"mean_uptime_h": 2.0 + i, "mean_downtime_h": 0.5} if churn else {}),
            **({"mean_uptime_h": uptime_h[i], "mean_downtime_h": 0.5} if uptime_h else {}),
        }  # fmt: skip
        for i in range(n)
    ]
    return parse_scenario({
        "name": "tiny", "devices": devices, "latency_s": lat.tolist(),
        "bandwidth_Bps": [[None if i == j else float(bw[i, j]) for j in range(n)] for i in range(n)],
        "model": {"layers": 4, "hidden": 128, "seq_len": 128, "vocab": 256, "params": 1_000_000, "dtype_bytes": 2},
        "batch": {"sequences": 8, "micro_batch": 1},
    })  # fmt: skip


def pairs(view: Scenario) -> Plan:
    """Two-stage pipelines of the live devices in order (the first pipeline's are the servers)."""
    rows = tuple((i, i + 1) for i in range(0, view.n - 1, 2))
    return Plan(pipelines=rows, layers_per_stage=(2, 2), parameter_servers=rows[0])


FIXED = Strategy("fixed", pairs, lambda view, previous, ids: pairs(view))


def run(sc: Scenario, hours: float, events: list[ChurnEvent] = (), **settings: Any) -> Any:  # type: ignore[assignment]
    return simulate(sc, FIXED, SimSettings(hours=hours, **settings), (np.ones(sc.n, dtype=bool), list(events)))


def test_churn_is_drawn_once_per_seed_and_alternates() -> None:
    sc = scenario(6, churn=True)
    up0, events = churn_schedule(sc, 200 * 3600.0, seed=3)
    again = churn_schedule(sc, 200 * 3600.0, seed=3)
    assert np.array_equal(up0, again[0]) and events == again[1]
    assert events == sorted(events) and all(0 < e.at_s < 200 * 3600 for e in events)
    for d in range(sc.n):
        states = [bool(up0[d])] + [e.up for e in events if e.device == d]
        assert all(a != b for a, b in zip(states, states[1:], strict=False))  # up, down, up, ...
    departures = sum(not e.up for e in events)
    assert 0.8 < departures / expected_departures(sc, 200 * 3600.0) < 1.2
    assert churn_schedule(scenario(3), 3600.0, seed=0)[1] == []  # devices that never leave


def test_a_run_without_churn_trains_steadily_and_loses_nothing() -> None:
    r = run(scenario(), 0.5)
    assert r.updates >= 10 and r.updates_lost == 0 and r.micro_batches_recomputed == 0 and r.failovers == 0
    assert r.tokens == sum(r.timeline) * 128 and r.tokens_per_s > 0
    # A sum held while its worker works on the other stage can fall behind the bound, as in the
    # daemon (which pushes every two micro-batches of a stage): rarely.
    assert max(r.staleness) <= 4 and r.stale_dropped <= 0.01 * sum(r.staleness.values())
    busy = r.timeline[2:29]
    assert min(busy) > 0.5 * max(busy)  # steady once started
    assert [e.kind for e in r.plan_events] == ["full"]


def test_a_departed_worker_is_repaired_around_and_nothing_is_lost() -> None:
    events = [ChurnEvent(600.0, 2, False), ChurnEvent(1500.0, 2, True)]
    r = run(scenario(), 0.75, events, detect_s=30.0, join_s=10.0)
    assert (r.departures, r.returns, r.failovers, r.updates_lost) == (1, 1, 0, 0)
    assert [e.kind for e in r.plan_events] == ["full", "repair", "repair"]
    # At the coordinator's first round (every 10 s) after each change was noticed (630, 1510 s).
    first, second = (e.at_s for e in r.plan_events[1:])
    assert 630 <= first < 640 and 1510 <= second < 1520
    assert (second - first) % 10 == pytest.approx(0.0, abs=1e-6) or (second - first) % 10 == pytest.approx(10.0)
    assert r.plan_events[1].pipelines == 1 and r.plan_events[2].pipelines == 2


def test_a_host_that_dies_with_its_standby_following_loses_no_update() -> None:
    r = run(scenario(), 0.75, [ChurnEvent(900.0, 0, False)], detect_s=30.0)
    assert r.failovers == 1 and r.updates_lost == 0
    assert r.micro_batches_recomputed > 0  # what was in flight is redone from stage 0
    assert sum(r.timeline[20:]) > 0  # and training goes on under the standby


def test_a_host_that_dies_before_any_copy_landed_loses_its_updates_and_they_are_counted() -> None:
    # The link from stage 0's host (d0) to its standby carries 10 B/s: the copy never lands. The
    # standby is d1, as the daemon picks it: the most reliable (available 98% of the time, the
    # others 80%) before the best linked.
    sc = scenario(slow=(0, 1), uptime_h=[2.0, 20.0, 2.0, 2.0])
    r = run(sc, 0.75, [ChurnEvent(1200.0, 0, False)], detect_s=30.0, lease_s=120.0)
    assert r.failovers == 1 and r.updates_lost > 0


def test_recovery_is_the_time_until_throughput_is_back() -> None:
    timeline = [10] * 10 + [2, 3, 9, 10, 10]
    assert recovery_times(timeline, 60.0, [610.0]) == [13 * 60.0 - 610.0]
    assert recovery_times(timeline, 60.0, [30.0]) == []  # no window before it
    assert recovery_times([10] * 10 + [1, 1], 60.0, [600.0]) == []  # never back before the end


def test_interfaces_run_at_the_fastest_link_and_ignore_the_diagonal() -> None:
    bw = np.array([[1e12, 5.0, 2.0], [1.0, 0.0, 3.0], [7.0, 4.0, 1e12]])
    up, down = interface_rates(bw, block=2)  # blocks smaller than the matrix: rows two at a time
    assert up.tolist() == [5.0, 3.0, 7.0] and down.tolist() == [7.0, 5.0, 3.0]


def test_a_senders_flows_share_its_uplink_and_arrive_after_the_latency() -> None:
    sim = Simulation(scenario(3, slow=(0, 2)), FIXED, SimSettings(hours=0.1), (np.ones(3, dtype=bool), []))
    for dst, nbytes in ((1, 1e8), (1, 1e8), (2, 100.0)):  # the slow path's flow takes 10 s at 10 B/s
        sim._send(0, dst, nbytes, 0.0, _FREE, (dst, int(nbytes)))
    arrivals = {}
    while sim.events:
        t, _, kind, args = heapq.heappop(sim.events)
        if kind == _FLOW:
            sim._flow_due(t, *args)
        else:
            arrivals.setdefault(args, []).append(t)
    # The two 1e8 B flows share the uplink (1e8 B/s) but for the 10 B/s the slow one takes:
    # both take two seconds, then the 1 ms latency.
    assert arrivals[(1, 100_000_000)] == pytest.approx([2.001, 2.001], rel=1e-6)
    assert arrivals[(2, 100)] == pytest.approx([10.001])
    assert sim.sent[0] == pytest.approx(2e8 + 100.0) and sim.received[1] == pytest.approx(2e8)


def test_every_host_picks_the_standby_the_daemon_would_the_likeliest_to_stay() -> None:
    # Available 80%, 80%, 91% and 98% of the time (to one decimal, as the daemon rounds the
    # reliability it measures: 0.8, 0.8, 0.9, 1.0): d3 first, then d2.
    sc = scenario(4, uptime_h=[2.0, 2.0, 5.0, 20.0])
    sim = Simulation(sc, FIXED, SimSettings(hours=0.01), (np.ones(4, dtype=bool), []))
    sim.run()
    assert [st.host for st in sim.stages] == [0, 1]
    assert [st.standby for st in sim.stages] == [3, 3]  # both stages' logs go to the same peer
    sim._churn(100.0, 3, False)  # after the run's 36 s
    sim._notice(110.0, 3, False, int(sim.epoch[3]))
    assert [st.standby for st in sim.stages] == [2, 2]


def test_among_equally_reliable_peers_the_standby_is_the_one_on_the_fastest_link_from_the_host() -> None:
    # The host logs every push at its standby: d3's links are four times faster than d2's.
    bw = np.full((4, 4), 1e8)
    bw[:, 3] = 4e8
    sim = Simulation(scenario(4, bw=bw), FIXED, SimSettings(hours=0.01), (np.ones(4, dtype=bool), []))
    sim.run()
    assert [st.standby for st in sim.stages] == [3, 3]


def test_a_busy_interface_adds_its_standing_queue_to_every_message_through_it() -> None:
    settings = SimSettings(hours=0.1, standing_queue_s=0.05)
    sim = Simulation(scenario(4), FIXED, settings, (np.ones(4, dtype=bool), []))
    assert sim._one_way(0, 2) == pytest.approx(0.001)
    sim._send(0, 1, 1e8, 0.0)  # a bulk flow from d0 to d1
    assert sim._one_way(0, 2) == pytest.approx(0.051)  # behind d0's busy uplink
    assert sim._one_way(2, 1) == pytest.approx(0.051)  # into d1's busy downlink
    assert sim._one_way(0, 1) == pytest.approx(0.101)  # both
    assert sim._one_way(2, 3) == pytest.approx(0.001) and sim._rtt(2, 0) == pytest.approx(0.052)


def test_a_request_between_two_peers_pays_the_stacks_overhead_once_and_one_to_itself_none() -> None:
    sim = Simulation(scenario(4), FIXED, SimSettings(hours=0.1, request_overhead_s=0.004),
                     (np.ones(4, dtype=bool), []))  # fmt: skip
    assert sim._rtt(0, 1) == pytest.approx(0.002 + 0.004) and sim._back(1, 0) == pytest.approx(0.001 + 0.004)
    assert sim._rtt(2, 2) == 0.0 and sim._back(2, 2) == 0.0
    assert sim._one_way(0, 1) == pytest.approx(0.001)  # a transfer's delivery is not a request


def test_a_message_waits_behind_a_transfer_between_the_same_two_peers_and_only_that() -> None:
    settings = SimSettings(hours=0.1, connection_queue_bytes=4e6)  # 40 ms at the links' 1e8 B/s
    sim = Simulation(scenario(4), FIXED, settings, (np.ones(4, dtype=bool), []))
    sim._send(0, 1, 1e8, 0.0)  # a bulk flow from d0 to d1 on their connection
    assert sim._one_way(0, 1) == pytest.approx(0.041)  # queued behind it
    assert sim._one_way(0, 1, nbytes=1e6) == pytest.approx(0.031)  # 10 ms to send: it loses that much by sharing
    assert sim._one_way(0, 1, nbytes=1e7) == pytest.approx(0.001)  # longer than the queue: sharing says it all
    assert sim._one_way(1, 0) == pytest.approx(0.001)  # the other direction has its own buffer
    assert sim._one_way(0, 2) == pytest.approx(0.001) and sim._one_way(2, 1) == pytest.approx(0.001)


def test_connectivity_is_the_median_link_leaving_out_the_diagonal() -> None:
    bw = np.array([[np.inf, 1.0, 2.0, 9.0], [5.0, np.inf, 6.0, 7.0], [1.0, 1.0, 0.0, 3.0], [4.0, 4.0, 4.0, 4.0]])
    assert median_rates(bw, block=3).tolist() == [2.0, 6.0, 1.0, 4.0]  # blocks of 3 rows, then 1
    assert median_rates(np.zeros((1, 1))).tolist() == [0.0]


def test_only_the_coordinator_plans_and_one_that_left_unnoticed_holds_the_repair_back() -> None:
    # Availability grows with the index (uptimes 2..7 h): d5 is elected, a worker, not a host.
    # d2 leaves first; the coordinator leaves before that is noticed. Nobody repairs until the
    # coordinator's own departure is noticed and d4 elected: one repair covers both.
    events = [ChurnEvent(590.0, 2, False), ChurnEvent(600.0, 5, False)]
    sim = Simulation(scenario(6, churn=True), FIXED, SimSettings(hours=0.5, detect_s=30.0),
                     (np.ones(6, dtype=bool), events))  # fmt: skip
    r = sim.run()
    assert r.coordinator_changes == 1 and sim.coordinator == 4
    assert [e.kind for e in r.plan_events] == ["full", "repair"]
    assert 630 <= r.plan_events[1].at_s < 640  # d4's first round after d5's departure was noticed
    assert r.plan_events[1].devices == 4 and r.plan_events[1].pipelines == 2 and r.updates_lost == 0


def test_a_plan_whose_coordinator_leaves_while_computing_it_is_lost_and_the_next_one_plans(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Planning takes 25 s here: every reading of the planner's clock is 25 s after the last.
    clock = iter(range(0, 10**6, 25))
    monkeypatch.setattr("swarmd.peers.sim.simulator.time.perf_counter", lambda: float(next(clock)))
    events = [ChurnEvent(590.0, 2, False), ChurnEvent(630.0, 5, False)]
    sim = Simulation(scenario(6, churn=True), FIXED, SimSettings(hours=0.5, detect_s=30.0, coordinate_s=0.0),
                     (np.ones(6, dtype=bool), events))  # fmt: skip
    r = sim.run()
    # d5 plans at 620 (ready at 645) and leaves at 630: its plan is lost. Nobody plans until its
    # departure is noticed, at 660, and d4 elected.
    assert r.plans_lost == 1 and sim.coordinator == 4
    assert [(e.kind, e.at_s) for e in r.plan_events[1:]] == [("repair", 620.0), ("repair", 660.0)]
    assert {d for row in sim.global_plan.pipelines for d in row} == {0, 1, 3, 4}


def test_a_request_goes_through_a_relay_when_the_daemons_rule_says_it_is_faster() -> None:
    # Pipelines (d0, d1) and (d2, d3); d4, outside the plan (it works all the same, as the
    # daemon's members do), has the best links, so it is elected the relay (one for five).
    # d3's links to the hosts are slow: its requests go through d4, which makes them faster
    # and the run quicker than without relays.
    bw = np.full((5, 5), 1e8)
    bw[3, :2] = bw[:2, 3] = 1e5
    bw[4, :] = bw[:, 4] = 1e9
    sc = scenario(5, bw=bw)
    relayed = Simulation(sc, FIXED, SimSettings(hours=0.2), (np.ones(5, dtype=bool), []))
    r = relayed.run()
    direct = run(sc, 0.2, data_via_relay="never")
    assert r.relays == 1 and relayed.relays == [4] and direct.relays == 1
    assert r.relayed_transfers > 0 and direct.relayed_transfers == 0
    assert relayed._route(3, 0, relayed.act_bytes) == 4 and relayed._route(2, 0, relayed.act_bytes) is None
    assert relayed.sent[4] > 0 and relayed.received[4] > 0  # it carried the bytes
    assert r.tokens > direct.tokens


def test_a_message_at_a_relay_that_left_goes_again_on_the_direct_path() -> None:
    sim = Simulation(scenario(4), FIXED, SimSettings(hours=0.1), (np.ones(4, dtype=bool), []))
    sim._send(0, 1, 1e6, 0.0, _FREE, ("landed",), via=2)
    sim.up[2] = False  # the relay leaves while the message is on its way to it
    arrivals = []
    while sim.events:
        t, _, kind, args = heapq.heappop(sim.events)
        if kind == _FLOW:
            sim._flow_due(t, *args)
        elif kind == _FREE:
            arrivals.append((t, args))
        else:
            assert kind == _HOP
            sim._hop(t, *args)
    # 10 ms to the relay and 1 ms latency; then 10 ms and 1 ms again, straight to d1.
    assert arrivals == [(pytest.approx(0.022), ("landed",))]
    assert sim.counts["relay_gone"] == 1 and sim.received[1] == pytest.approx(1e6)


def test_a_stage_left_off_the_plans_server_by_a_failover_follows_the_plan_and_loses_nothing() -> None:
    # d0 (stage 0's host) leaves: its standby d1, which hosts stage 1 too, takes stage 0 over.
    # The repair names d1 and d2 the servers; once that plan has stood HAND_OVER_SETTLED_S,
    # d1 hands stage 1 to d2, which fetches its checkpoint.
    sim = Simulation(scenario(6), FIXED, SimSettings(hours=0.5, detect_s=30.0),
                     (np.ones(6, dtype=bool), [ChurnEvent(600.0, 0, False)]))  # fmt: skip
    r = sim.run()
    assert r.failovers == 1 and r.hand_overs == 1 and r.updates_lost == 0
    assert [st.host for st in sim.stages] == [1, 2] and not any(st.opening for st in sim.stages)
    repaired = r.plan_events[1].at_s
    assert sim.stages[1].hosted_since == pytest.approx(repaired + 20.0)
    bucket = int(sim.stages[1].hosted_since // 60) + 1
    assert sum(r.timeline[bucket:]) > 0  # training goes on at the new host


def test_members_the_plan_leaves_out_work_too_spread_over_the_stages_by_rank() -> None:
    # Six devices, one pipeline planned (d0, d1, the hosts): d2..d5 host nothing and are left out
    # of the plan; the daemon's rule homes them by rank among those, over the two stages.
    one = Strategy("one pipeline", lambda view: Plan(pipelines=((0, 1),), layers_per_stage=(2, 2),
                                                     parameter_servers=(0, 1)))  # fmt: skip
    sim = Simulation(scenario(6), one, SimSettings(hours=0.05), (np.ones(6, dtype=bool), []))
    r = sim.run()
    assert sim.worker_stage == {0: 0, 1: 1, 2: 0, 3: 1, 4: 0, 5: 1}
    assert all(sim.sent[d] > 0 for d in range(6)) and r.tokens > 0


def test_a_new_host_that_restarts_while_it_opens_the_stage_fetches_it_again_and_serves() -> None:
    # As above, d1 hands stage 1 to d2 at the repair's time plus 20 s; d2 restarts a second later,
    # before anyone could notice: its fetch is void, it fetches again, and the stage serves.
    sim = Simulation(scenario(6), FIXED, SimSettings(hours=0.5, detect_s=30.0, coordinate_s=0.0),
                     (np.ones(6, dtype=bool), [ChurnEvent(600.0, 0, False)]))  # fmt: skip
    sim.advance(650.01)  # the repair at 630, the hand-over at 650; the checkpoint takes ~60 ms
    assert sim.stages[1].host == 2 and sim.stages[1].opening
    sim._churn(650.02, 2, False)
    sim._churn(650.03, 2, True)
    r = sim.run()
    assert sim.stages[1].host == 2 and not sim.stages[1].opening and r.updates_lost == 0
    assert sum(r.timeline[12:]) > 0
