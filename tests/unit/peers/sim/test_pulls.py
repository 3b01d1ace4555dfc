"""peers/sim/pulls.py: the cells' long polls of committed versions (a delta a version, or the
whole slice when too far behind), a new cell's whole slices before it starts, and the pulls
again from a shard's new holder after a failover."""

from __future__ import annotations

import pytest

from swarmd.peers.sim.shard_records import Shard
from swarmd.peers.sim.shards import ShardServers
from tests.unit.peers.sim.small_world import Clients, pipeline, shard_servers, world

pytestmark = pytest.mark.timeout(10)


def committed(shards: ShardServers, shard: Shard, version: int) -> None:
    shard.version = shard.committed = version
    shards.pulls.committed(0.0, shard)


def test_a_commit_is_pulled_by_every_cell_of_its_stage_as_deltas() -> None:
    w = world(3)
    cells = [pipeline(1, [1]).cells[0], pipeline(2, [2]).cells[0]]
    clients = Clients(cells)
    shards = shard_servers(w, clients)
    shard = shards.ledger_shard
    committed(shards, shard, 3)
    assert all(c.pulling[0] for c in cells)
    w.engine.run_until(5.0, 1000)
    assert [c.arrived[0] for c in cells] == [3, 3] and clients.named("pulled") == cells
    delta = shards.pulls.workload.delta_bytes(0, 0)
    sent, _ = w.engine.carried(5.0)
    assert sent[0] == pytest.approx(2 * 3 * delta)  # three deltas to each


def test_a_cell_further_behind_than_the_kept_deltas_gets_the_whole_slice() -> None:
    w = world(2, keep_versions=2)
    cell = pipeline(1, [1]).cells[0]
    shards = shard_servers(w, Clients([cell]))
    committed(shards, shards.ledger_shard, 5)
    w.engine.run_until(5.0, 1000)
    sent, _ = w.engine.carried(5.0)
    assert cell.arrived[0] == 5 and sent[0] == pytest.approx(shards.pulls.workload.slice_bytes(0, 0))


def test_a_new_cell_fetches_every_slice_of_its_stage_whole_before_it_is_ready() -> None:
    w = world(3)
    cell = pipeline(1, [2], shards=2).cells[0]
    cell.ready = False
    clients = Clients([cell])
    shards = shard_servers(w, clients, holders=((0, 1),))
    shards.stages[0][1].committed = 4
    shards.load(0.0, cell)
    assert cell.missing == {0, 1}
    w.engine.run_until(5.0, 1000)
    assert cell.ready and cell.arrived == [0, 4] and clients.named("cell_ready") == [cell]
    assert w.phases.status()["weights"]["n"] == 1


def test_after_a_failover_a_cell_holding_lost_updates_takes_the_slice_whole_from_the_new_holder() -> None:
    w = world(3)
    cell = pipeline(1, [2]).cells[0]
    cell.arrived = [6]
    shards = shard_servers(w, Clients([cell]))
    shard = shards.ledger_shard
    shard.hand_over(1, restored=4)
    shards.pulls.rejoin(0.0, shard, 4)
    w.engine.run_until(5.0, 1000)
    sent, _ = w.engine.carried(5.0)
    assert cell.arrived == [4] and sent[1] == pytest.approx(shards.pulls.workload.slice_bytes(0, 0))


def test_a_pull_waits_while_its_source_is_down() -> None:
    w = world(2)
    cell = pipeline(1, [1]).cells[0]
    shards = shard_servers(w, Clients([cell]))
    w.changed(0, False)
    committed(shards, shards.ledger_shard, 1)
    w.engine.run_until(5.0, 1000)
    assert cell.arrived == [0] and not cell.pulling[0]
