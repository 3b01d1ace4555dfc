"""A ring all-reduce among a group of devices, as flows on the shared links.

The members form a ring ordered by region, then ID (so that only about as many hops cross
between regions as there are regions). Reduce-scatter then all-gather: each member sends
``2 (N - 1) / N`` of the bytes to the next one, all at once (the flows share the links), and
the ``2 (N - 1)`` chunk steps each wait for the ring's slowest hop's latency. A member that
leaves stops its flows and the all-reduce never finishes: its owner starts another without it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from swarmd.peers.sim.world import World
    from swarmd.peers.world.engine import Handler

P = TypeVar("P")


def ring_order(world: World, members: Sequence[int]) -> list[int]:
    devices = world.scenario.devices
    return sorted(set(members), key=lambda d: (devices[d].region or "", devices[d].id))


def ring_seconds(world: World, ring: Sequence[int]) -> float:
    """The latency part of a ring all-reduce: ``2 (N - 1)`` steps of its slowest hop."""
    n = len(ring)
    if n < 2:
        return 0.0
    slowest = max(world.engine.way(a, ring[(i + 1) % n]) for i, a in enumerate(ring))
    return 2 * (n - 1) * slowest


def all_reduce(
    world: World, now: float, members: Sequence[int], nbytes: float, then: Handler[P], payload: P
) -> list[int]:
    """Start an all-reduce of ``nbytes`` a member among ``members``; ``then(t, payload)``
    runs when it is done. Returns the ring."""
    ring = ring_order(world, members)
    n = len(ring)
    if n < 2:
        world.engine.at(now, then, payload)
        return ring
    left = [n]
    latency = ring_seconds(world, ring)

    def part(t: float, _: None) -> None:
        """A member's chunks are all at the next one (the event carries nothing)."""
        left[0] -= 1
        if left[0] == 0:
            world.engine.at(t + latency, then, payload)

    chunk = 2.0 * (n - 1) / n * nbytes
    for i, a in enumerate(ring):
        world.engine.send(now, a, ring[(i + 1) % n], chunk, part, None)
    return ring
