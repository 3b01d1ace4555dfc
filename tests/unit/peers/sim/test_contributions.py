"""peers/sim/contributions.py: a shard's intake, on real shard servers in a small world: a
contribution arrives as a flow, is buffered at its weight and steps the shard; a recompute's
is acknowledged, a stale one dropped and settled; a departed cell's in flight are cut."""

from __future__ import annotations

import pytest

from swarmd.peers.sim.pipeline_state import Cell
from swarmd.peers.sim.shard_records import RoundGroup
from swarmd.peers.sim.shards import ShardServers
from swarmd.peers.sim.world import World
from tests.unit.peers.sim.small_world import Clients, contribution, pipeline, shard_servers, world

pytestmark = pytest.mark.timeout(10)


def one_cell() -> tuple[World, Cell, Clients, ShardServers]:
    """Three devices, shard (0, 0) on d0, the one cell of its stage on d1."""
    w = world(3)
    cell = pipeline(1, [1]).cells[0]
    clients = Clients([cell])
    return w, cell, clients, shard_servers(w, clients)


def test_a_batch_of_contributions_arrives_steps_the_shard_and_is_delivered() -> None:
    w, cell, clients, shards = one_cell()
    shard = shards.stages[0][0]
    shards.contribute(0.0, contribution(shards.next_cid(), cell, (0, 1)))  # 4 of the batch's 8
    assert cell.in_flight and shard.in_flight
    w.engine.run_until(5.0, 1000)
    assert clients.named("delivered") == [cell] and not cell.in_flight
    assert shard.version == 0 and shard.buffered == 4
    shards.contribute(5.0, contribution(shards.next_cid(), cell, (2, 3)))
    w.engine.run_until(10.0, 1000)
    assert shard.version == 1 and shard.buffer == [] and w.staleness[0] == 2
    assert w.phases.status()["contribution"]["n"] == 2


def test_a_recomputed_contribution_is_acknowledged_not_applied_again() -> None:
    w, cell, clients, shards = one_cell()
    shard = shards.stages[0][0]
    shard.remember((0, 1, 2, 3))  # committed before
    group = RoundGroup("d1", (0, 1, 2, 3), left=1)
    shards.contribute(0.0, contribution(shards.next_cid(), cell, (0, 1, 2, 3), group=group))
    w.engine.run_until(5.0, 1000)
    assert w.counts["duplicates"] == 1 and shard.version == 0 and shard.buffer == []
    assert clients.named("round_settled") == [group] and group.left == 0


def test_a_contribution_further_behind_than_the_bound_is_dropped_and_its_shares_settled() -> None:
    w = world(3)  # max_staleness 4
    cell = pipeline(1, [1]).cells[0]
    clients = Clients([cell])
    shards = shard_servers(w, clients)
    shard = shards.stages[0][0]
    shard.version = shard.committed = 5
    group = RoundGroup("d1", (7, 8), left=1)
    shards.contribute(0.0, contribution(shards.next_cid(), cell, (7, 8), base=0, group=group))
    shards.contribute(0.0, contribution(shards.next_cid(), cell, (9,), base=1))  # 4 behind: counts
    w.engine.run_until(5.0, 1000)
    assert w.counts["stale_dropped"] == 1 and {7, 8} <= shard.done and 9 not in shard.done
    assert clients.named("round_settled") == [group]
    assert w.staleness == {4: 1} and shard.buffered == 2


def test_a_departed_cells_contributions_in_flight_are_cut_and_never_arrive() -> None:
    w, cell, clients, shards = one_cell()
    shards.contribute(0.0, contribution(shards.next_cid(), cell, (0, 1)))
    shards.contribute(0.0, contribution(shards.next_cid(), cell, (2, 3)))
    assert shards.cut(cell) == 2
    w.engine.run_until(5.0, 1000)
    assert clients.named("delivered") == [] and shards.stages[0][0].buffered == 0
