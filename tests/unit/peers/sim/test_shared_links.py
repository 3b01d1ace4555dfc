"""Max-min fair sharing of links among concurrent flows, as the simulator's transfers use it."""

from __future__ import annotations

import heapq

import numpy as np
import pytest

from swarmd.peers.sim.shared_links import SharedLinks, max_min_rates

pytestmark = pytest.mark.timeout(30)


class Clock:
    """Runs the flows' completion events in time order, as the simulator's event queue does."""

    def __init__(self, path: np.ndarray, up: np.ndarray, down: np.ndarray) -> None:
        self.events: list[tuple[float, int, int]] = []
        self.links = SharedLinks(path, up, down, lambda t, fid, serial: heapq.heappush(self.events, (t, fid, serial)))
        self.done: dict[str, float] = {}
        self.pending: list[tuple[float, int, int, float, str]] = []

    def at(self, t: float, src: int, dst: int, nbytes: float, name: str) -> None:
        self.pending.append((t, src, dst, nbytes, name))

    def run(self) -> dict[str, float]:
        self.pending.sort()
        while self.events or self.pending:
            if self.pending and (not self.events or self.pending[0][0] <= self.events[0][0]):
                t, src, dst, nbytes, name = self.pending.pop(0)
                self.links.start(t, src, dst, nbytes, name)
                continue
            t, fid, serial = heapq.heappop(self.events)
            name = self.links.due(t, fid, serial)
            if name is not None:
                self.done[name] = t
        assert len(self.links) == 0
        return self.done


def star(n: int, rate: float = 100.0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    path = np.full((n, n), rate)
    return path, np.full(n, rate), np.full(n, rate)


def test_two_flows_from_one_uplink_share_it_evenly_and_one_alone_runs_at_full_rate() -> None:
    clock = Clock(*star(3))
    clock.at(0.0, 0, 1, 100.0, "a")
    clock.at(0.0, 0, 2, 100.0, "b")
    done = clock.run()
    assert done["a"] == pytest.approx(2.0) and done["b"] == pytest.approx(2.0)
    alone = Clock(*star(3))
    alone.at(0.0, 0, 1, 100.0, "a")
    assert alone.run()["a"] == pytest.approx(1.0)


def test_a_flow_that_starts_later_slows_the_first_and_the_first_speeds_up_when_it_ends() -> None:
    clock = Clock(*star(3))
    clock.at(0.0, 0, 1, 150.0, "long")  # 100 B alone in the first second, then half the uplink
    clock.at(1.0, 0, 2, 20.0, "short")  # 20 B at 50 B/s: done at 1.4 s
    done = clock.run()
    assert done["short"] == pytest.approx(1.4)
    assert done["long"] == pytest.approx(1.4 + (150.0 - 100.0 - 20.0) / 100.0)


def test_what_a_slow_path_cannot_use_goes_to_the_other_flow_on_the_uplink() -> None:
    path, up, down = star(3)
    path[0, 2] = 10.0  # 0 -> 2 is held to 10 B/s by its path: 0 -> 1 gets the other 90
    clock = Clock(path, up, down)
    clock.at(0.0, 0, 1, 90.0, "fast")
    clock.at(0.0, 0, 2, 20.0, "slow")
    done = clock.run()
    assert done["fast"] == pytest.approx(1.0) and done["slow"] == pytest.approx(2.0)


def test_a_receivers_downlink_is_shared_by_flows_from_different_senders() -> None:
    clock = Clock(*star(4))
    for sender in (1, 2, 3):
        clock.at(0.0, sender, 0, 100.0, f"from{sender}")
    done = clock.run()
    assert all(t == pytest.approx(3.0) for t in done.values())


def test_no_resource_carries_more_than_its_capacity_in_a_random_mix() -> None:
    rng = np.random.default_rng(3)
    n = 6
    path = rng.uniform(10.0, 200.0, (n, n))
    up, down = rng.uniform(50.0, 300.0, n), rng.uniform(50.0, 300.0, n)
    events: list[tuple[float, int, int]] = []
    links = SharedLinks(path, up, down, lambda t, fid, serial: heapq.heappush(events, (t, fid, serial)))
    for _ in range(40):
        a, b = rng.choice(n, 2, replace=False)
        links.start(0.0, int(a), int(b), float(rng.uniform(1.0, 500.0)), None)
        live = np.array(sorted(set(range(len(links.payload))) - set(links.free)))
        src, dst, rate = links.src[live], links.dst[live], links.rate[live]
        assert (np.bincount(src, weights=rate, minlength=n) <= up * (1 + 1e-9)).all()
        assert (np.bincount(dst, weights=rate, minlength=n) <= down * (1 + 1e-9)).all()
        assert (rate > 0).all() and (rate <= path[src, dst] * (1 + 1e-9)).all()
    while events:  # every flow ends
        t, fid, serial = heapq.heappop(events)
        links.due(t, fid, serial)
    assert len(links) == 0


def test_the_links_know_which_pairs_carry_a_flow_until_the_last_one_between_them_ends() -> None:
    events: list[tuple[float, int, int]] = []
    links = SharedLinks(*star(3), lambda t, fid, serial: heapq.heappush(events, (t, fid, serial)))
    links.start(0.0, 0, 1, 100.0, "a")
    links.start(0.0, 0, 1, 300.0, "b")
    assert links.carrying(0, 1) and not links.carrying(1, 0) and not links.carrying(0, 2)
    finished = []
    while events:
        t, fid, serial = heapq.heappop(events)
        name = links.due(t, fid, serial)
        if name is not None:
            finished.append(name)
            assert links.carrying(0, 1) == (name == "a")  # "b" still runs after "a" ends
    assert finished == ["a", "b"] and links.pairs == {}


def test_a_flow_needs_two_ends_and_bytes() -> None:
    links = SharedLinks(*star(2), lambda t, fid, serial: None)
    with pytest.raises(ValueError, match="two ends"):
        links.start(0.0, 1, 1, 10.0, None)


def test_max_min_rates_fill_the_tightest_resource_first_and_give_the_rest_to_the_others() -> None:
    # Resource 0 (capacity 10) carries flows a, b, c; resource 1 (capacity 4) carries c and d;
    # each flow also crosses a roomy resource of its own (2-5). Resource 1 fills first, at 2
    # each for c and d; then a and b split what c left of resource 0.
    capacity = np.array([10.0, 4.0, 100.0, 100.0, 100.0, 100.0])
    rates = max_min_rates(capacity, np.array([[0, 2], [0, 3], [0, 1], [1, 5]]))
    assert rates.tolist() == pytest.approx([4.0, 4.0, 2.0, 2.0])


def test_a_flow_cannot_start_before_the_last_flow_event() -> None:
    links = SharedLinks(*star(3), lambda t, fid, serial: None)
    links.start(5.0, 0, 1, 10.0, None)
    with pytest.raises(ValueError, match="before the last one"):
        links.start(4.0, 0, 2, 10.0, None)


def test_a_cancelled_flow_stops_and_its_share_goes_to_the_others() -> None:
    clock = Clock(np.full((3, 3), 100.0), np.full(3, 100.0), np.full(3, 100.0))
    clock.links.start(0.0, 0, 1, 100.0, "kept")
    cut = clock.links.start(0.0, 0, 2, 100.0, "cut")
    assert clock.links.flows_of(0) == sorted([cut, *clock.links.sending[0] - {cut}])
    clock.links.cancel(1.0, cut)  # each has 50 B left at 50 B/s
    assert clock.run() == {"kept": pytest.approx(1.5)}
    with pytest.raises(ValueError, match="not in flight"):
        clock.links.cancel(2.0, cut)


def test_past_its_levels_the_filling_gives_each_flow_its_tightest_even_share_within_capacity() -> None:
    # Four flows into one downlink of 100, each from its own uplink of 5, 10, 20 and 100.
    capacity = np.array([100.0, 5.0, 10.0, 20.0, 100.0])
    uses = np.array([[0, 1], [0, 2], [0, 3], [0, 4]])
    assert max_min_rates(capacity, uses).tolist() == pytest.approx([5.0, 10.0, 20.0, 65.0])  # four levels
    capped = max_min_rates(capacity, uses, max_levels=1)
    # One level (5 for the first); each of the rest gets at most a third of the 95 left.
    assert capped.tolist() == pytest.approx([5.0, 10.0, 20.0, 95.0 / 3])
    assert capped.sum() <= 100.0 + 1e-9


def test_flows_started_at_one_instant_are_re_divided_once_at_its_flush_and_end_as_if_at_once() -> None:
    events: list[tuple[float, int, int]] = []
    flushes: list[float] = []
    links = SharedLinks(
        np.full((3, 3), 100.0),
        np.full(3, 100.0),
        np.full(3, 100.0),
        lambda t, slot, serial: heapq.heappush(events, (t, slot, serial)),
        flushes.append,
    )
    a = links.start(0.0, 0, 1, 100.0, "a")
    b = links.start(0.0, 0, 2, 100.0, "b")
    assert flushes == [0.0] and links.rate[a] == links.rate[b] == 0.0  # not yet re-divided
    links.flush(0.0)
    assert links.rate[a] == links.rate[b] == pytest.approx(50.0)
    t, slot, serial = heapq.heappop(events)
    assert t == pytest.approx(2.0) and links.due(t, slot, serial) in ("a", "b")
