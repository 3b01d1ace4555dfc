"""peers/wire/routing.py: when a request goes through a relay, and how failed direct paths are
remembered."""

from __future__ import annotations

import numpy as np
import pytest

from swarmd.peers.wire.routing import BLOCKED_FIRST_S, BLOCKED_MAX_S, RELAY_GAIN, DirectPaths, Matrix, choose_route

pytestmark = pytest.mark.timeout(30)

MB = 1e6


def matrix(bandwidth: dict[tuple[str, str], float], latency_s: float = 0.01) -> Matrix:
    ids = sorted({p for pair in bandwidth for p in pair})
    index = {p: i for i, p in enumerate(ids)}
    n = len(ids)
    bw = np.full((n, n), np.inf)
    for (a, b), v in bandwidth.items():
        bw[index[a], index[b]] = bw[index[b], index[a]] = v
    lat = np.full((n, n), latency_s)
    np.fill_diagonal(lat, 0.0)
    return Matrix(index, lat, bw)


# a -> b direct is slow; through r both hops are fast; through s one hop is as slow as direct
LINKS = matrix(
    {
        ("a", "b"): 1 * MB,
        ("a", "r"): 100 * MB,
        ("r", "b"): 50 * MB,
        ("a", "s"): 100 * MB,
        ("s", "b"): 1 * MB,
        ("r", "s"): 100 * MB,
    }
)


def test_direct_unless_a_relay_is_clearly_faster() -> None:
    # 10 MB: direct 10 s, through r 0.02 + 0.2 s, through s 10 s
    assert choose_route("a", "b", ["s", "r"], LINKS, 10 * MB, direct_blocked=False) == "r"
    assert choose_route("a", "b", ["s"], LINKS, 10 * MB, direct_blocked=False) is None
    # tiny messages: latency decides, and two hops cost more than one
    assert choose_route("a", "b", ["r"], LINKS, 100, direct_blocked=False) is None
    # the gain must be clear: a relay path at 0.9 of the direct time is not taken
    near = matrix({("a", "b"): 10 * MB, ("a", "r"): 11.2 * MB, ("r", "b"): 11.2 * MB}, latency_s=0.0)
    assert RELAY_GAIN < 0.9
    assert choose_route("a", "b", ["r"], near, 10 * MB, direct_blocked=False) is None


def test_the_exchange_takes_a_relay_only_when_the_direct_path_fails() -> None:
    # Through r is 45x faster for 10 MB, but a contribution (for_speed False) goes direct:
    # every cell's exchange through the few relays would load their links with the swarm's.
    assert choose_route("a", "b", ["r"], LINKS, 10 * MB, direct_blocked=False, for_speed=False) is None
    assert choose_route("a", "b", ["r"], LINKS, 10 * MB, direct_blocked=True, for_speed=False) == "r"
    assert choose_route("a", "b", ["r"], LINKS, 100, direct_blocked=False, mode="always", for_speed=False) == "r"


def test_a_blocked_direct_path_takes_the_best_relay_measured_or_not() -> None:
    assert choose_route("a", "b", ["s", "r"], LINKS, 100, direct_blocked=True) == "r"
    assert choose_route("a", "b", ["x", "s"], LINKS, 100, direct_blocked=True) == "s"  # x unmeasured: after s
    assert choose_route("a", "b", ["x", "y"], None, 100, direct_blocked=True) == "x"  # the plan's order
    assert choose_route("a", "b", [], LINKS, 100, direct_blocked=True) is None  # nothing else to try


def test_modes_and_peers_that_cannot_relay_for_themselves() -> None:
    assert choose_route("a", "b", ["r"], LINKS, 100, direct_blocked=False, mode="always") == "r"
    assert choose_route("a", "b", ["r"], LINKS, 10 * MB, direct_blocked=True, mode="never") is None
    assert choose_route("a", "b", ["a", "b"], LINKS, 10 * MB, direct_blocked=True) is None  # only the two ends
    assert choose_route("r", "b", ["r", "s"], LINKS, 10 * MB, direct_blocked=False, mode="always") == "s"
    with pytest.raises(ValueError, match="sometimes"):
        choose_route("a", "b", ["r"], LINKS, 1, direct_blocked=False, mode="sometimes")


def test_failed_direct_paths_back_off_and_clear_on_success() -> None:
    paths = DirectPaths(max_peers=3)
    assert not paths.blocked("b", 0.0)
    assert paths.failed("b", 100.0) == BLOCKED_FIRST_S
    assert paths.blocked("b", 100.0 + BLOCKED_FIRST_S - 1) and not paths.blocked("b", 100.0 + BLOCKED_FIRST_S)
    waits = [paths.failed("b", 200.0 + i) for i in range(10)]
    assert waits[0] == 2 * BLOCKED_FIRST_S and waits[-1] == BLOCKED_MAX_S
    paths.succeeded("b")
    assert not paths.blocked("b", 201.0) and paths.failed("b", 300.0) == BLOCKED_FIRST_S
    for i, peer in enumerate(("c", "d", "e")):  # bounded: the oldest entry goes
        paths.failed(peer, 300.0 + i)
    assert paths.count(300.0 + 3) == 3 and not paths.blocked("b", 301.0)
