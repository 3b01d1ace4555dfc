"""peers/sim/engine.py: messages as flows, through relays, and cut when an end leaves."""

from __future__ import annotations

import numpy as np
import pytest

from swarmd.peers.sim.engine import RETRY_S, Engine, Handler, Overheads

pytestmark = pytest.mark.timeout(30)


NO_OVERHEADS = Overheads()


def engine(n: int = 4, overheads: Overheads = NO_OVERHEADS) -> tuple[Engine, list[tuple[float, str]]]:
    bw = np.full((n, n), 1e8)
    lat = np.full((n, n), 0.001)
    np.fill_diagonal(lat, 0.0)
    e = Engine(lat, bw, [f"d{i}" for i in range(n)], np.ones(n, dtype=bool), overheads, "auto")
    return e, []


def landed(log: list[tuple[float, str]]) -> Handler[str]:
    def handler(now: float, name: str) -> None:
        log.append((now, name))

    return handler


def test_a_senders_messages_share_its_uplink_and_arrive_after_the_latency() -> None:
    e, log = engine(3)
    e.bandwidth_Bps[0, 2] = 10.0
    for dst, nbytes, name in ((1, 1e8, "a"), (1, 1e8, "b"), (2, 100.0, "slow")):
        e.send(0.0, 0, dst, nbytes, landed(log), name)
    e.run_until(100.0, 1000)
    # The two 1e8 B messages share the uplink (1e8 B/s) but for the 10 B/s the slow one
    # takes: both take two seconds, then the 1 ms latency; the slow one 10 s.
    assert dict((n, t) for t, n in log) == pytest.approx({"a": 2.001, "b": 2.001, "slow": 10.001}, rel=1e-6)
    assert e.sent[0] == pytest.approx(2e8 + 100.0) and e.received[1] == pytest.approx(2e8)


def test_a_message_at_a_relay_that_leaves_goes_again_on_the_direct_path() -> None:
    e, log = engine()
    e.send(0.0, 0, 1, 1e6, landed(log), "landed", via=2)
    e.run_until(0.005, 1000)  # half-way to the relay
    e.up[2] = False
    e.cut(0.005, 2)
    e.run_until(1.0, 1000)
    # Sent again from the start at 5 ms: 10 ms of bytes and 1 ms of latency.
    assert log == [(pytest.approx(0.016), "landed")] and e.counts["relay_gone"] == 1


def test_a_stream_through_a_relay_runs_both_hops_at_once() -> None:
    e, log = engine()
    e.stream(0.0, 0, 1, 1e8, landed(log), "through", via=2)
    e.run_until(10.0, 1000)
    assert log == [(pytest.approx(1.001), "through")]  # not 2 s: each message is forwarded as it comes
    assert e.received[2] == pytest.approx(1e8) and e.sent[2] == pytest.approx(1e8)


def test_a_departed_end_stops_its_flows_and_the_others_speed_up() -> None:
    e, log = engine()
    e.send(0.0, 0, 1, 1e8, landed(log), "kept")
    e.send(0.0, 0, 2, 1e8, landed(log), "cut")
    e.run_until(0.5, 1000)  # each a quarter through, at half the uplink
    e.up[2] = False
    e.cut(0.5, 2)
    e.send(0.6, 0, 2, 1e3, landed(log), "to a departed peer")  # nothing is sent
    e.run_until(10.0, 1000)
    # The rest of "kept" (75 MB) at the whole uplink: 0.75 s more, then the latency.
    assert log == [(pytest.approx(1.251), "kept")] and len(e.links) == 0
    assert e.sent[0] == pytest.approx(1e8 + 2.5e7) and e.received[2] == pytest.approx(2.5e7)  # what crossed


def test_the_bytes_carried_leave_out_what_flows_in_flight_have_not_sent_yet() -> None:
    e, log = engine()
    e.send(0.0, 0, 1, 1e8, landed(log), "half")
    e.run_until(0.5, 1000)
    sent, received = e.carried(0.5)
    assert sent[0] == pytest.approx(5e7) and received[1] == pytest.approx(5e7) and e.sent[0] == 1e8


def test_a_request_pays_the_stacks_overhead_each_way_and_a_busy_interface_its_queue() -> None:
    e, _ = engine(overheads=Overheads(request_overhead_s=0.004, standing_queue_s=0.05))
    assert e.rtt(0, 1) == pytest.approx(2 * (0.001 + 0.004)) and e.rtt(2, 2) == 0.0
    e.send(0.0, 0, 1, 1e8)
    assert e.one_way(0, 2) == pytest.approx(0.051) and e.one_way(0, 1) == pytest.approx(0.101)
    assert e.one_way(2, 3) == pytest.approx(0.001)


def cut_half_way() -> tuple[Engine, list[tuple[float, str]]]:
    """d0 sends d1 a 10 ms message, and d1 drops off half-way through it."""
    e, log = engine()
    e.send(0.0, 0, 1, 1e6, landed(log), "landed")
    e.run_until(0.005, 1000)
    e.up[1] = False
    e.cut(0.005, 1)
    return e, log


def test_a_message_cut_by_a_blip_goes_again_once_its_end_is_back() -> None:
    # d1 is back at 50 ms, before anyone noticed: the sender's retry gets through RETRY_S
    # later, the whole message again.
    e, log = cut_half_way()
    e.send(0.01, 2, 1, 1e6, landed(log), "sent while away")  # nothing goes to a peer that is away
    e.run_until(0.05, 1000)
    assert log == []
    e.up[1] = True
    e.returned(0.05, 1)
    e.run_until(5.0, 1000)
    # Both go again at 0.05 + RETRY_S, sharing d1's downlink: 20 ms of bytes, then 1 ms.
    at = 0.05 + RETRY_S + 0.021
    assert sorted(log) == [(pytest.approx(at), "landed"), (pytest.approx(at), "sent while away")]
    assert e.counts["retried"] == 2


def test_a_message_to_a_departure_that_is_noticed_is_not_sent_again() -> None:
    # Once d1's departure is noticed its leases lapse and the protocol's take-over resends what
    # matters (to the new holder): the engine forgets what it parked, even if d1 comes back.
    e, log = cut_half_way()
    e.forget(1)
    e.up[1] = True
    e.returned(100.0, 1)
    e.run_until(200.0, 1000)
    assert log == [] and e.counts["retried"] == 0


def test_the_exchange_takes_the_relay_only_when_told_to_always() -> None:
    # d0 -> d1 is slow, through d2 both hops are fast: an activation (for speed) takes d2, a
    # contribution goes direct unless the operator set data_via_relay = always.
    e, _ = engine()
    e.bandwidth_Bps[0, 1] = 1e6
    e.relays = [2]
    assert e.route(0, 1, 1e7) == 2 and e.route(0, 1, 1e7, for_speed=False) is None
    e.relay_mode = "always"
    assert e.route(0, 1, 1e7, for_speed=False) == 2
