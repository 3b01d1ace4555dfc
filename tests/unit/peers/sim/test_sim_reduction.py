"""peers/sim/reduction.py in a small world: four one-stage pipelines in groups of two, the
shard on d4. A group's head sums its members' slices into one contribution, sends a lone one
after its wait, and once it is known gone its members send straight to the server."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from swarmd.peers.sim.pipeline_state import Cell
from swarmd.peers.sim.reduction import Reducers
from swarmd.peers.sim.shards import ShardServers
from swarmd.peers.sim.world import World
from tests.unit.peers.sim.small_world import Clients, contribution, pipeline, shard_servers, sizes, world

pytestmark = pytest.mark.timeout(10)


def groups_of_two(size: int = 2) -> tuple[World, list[Cell], ShardServers, Reducers]:
    w = world(5)
    pipes = [pipeline(i + 1, [i]) for i in range(4)]
    cells = [p.cells[0] for p in pipes]
    shards = shard_servers(w, Clients(cells), holders=((4,),))
    holder = SimpleNamespace(pipelines=pipes)  # what Reducers reads of Pipelines: the list
    reducers = Reducers(w, sizes(w, pipelines=4), holder, shards, (size,))  # type: ignore[arg-type]
    return w, cells, shards, reducers


def test_each_group_has_a_head_per_shard_and_the_members_pull_from_it() -> None:
    _, cells, _, reducers = groups_of_two()
    assert reducers.head_cell(cells[1], 0) is cells[0] and reducers.head_cell(cells[3], 0) is cells[2]
    assert reducers.pull_head(cells[1], 0) is cells[0] and reducers.pull_head(cells[0], 0) is None
    assert reducers.members_of(cells[0], 0) == [cells[1]] and reducers.members_of(cells[1], 0) == []
    _, cells, _, alone = groups_of_two(size=1)
    assert alone.head_cell(cells[1], 0) is None and alone.members_of(cells[0], 0) == []


def test_a_head_sums_its_groups_slices_into_one_contribution_to_the_server() -> None:
    w, cells, shards, reducers = groups_of_two()
    own, member = contribution(shards.next_cid(), cells[0], (0, 1)), contribution(shards.next_cid(), cells[1], (2, 3))
    assert reducers.send(0.0, own) and reducers.send(0.0, member)
    w.engine.run_until(5.0, 10_000)
    assert (w.counts["reduced_sums"], w.counts["reduced_parts"]) == (1, 2)
    shard = shards.ledger_shard
    assert shard.version == 1 and w.staleness == {0: 1}  # the sum is the batch's 8 micro-batches
    sent, _ = w.engine.carried(5.0)
    assert sent[1] > 0 and sent[0] > 0 and sent[2] == sent[3] == 0  # d1 to its head, d0 on to d4


def test_a_lone_slice_goes_on_by_itself_after_the_heads_wait() -> None:
    w, cells, shards, reducers = groups_of_two()
    reducers.send(0.0, contribution(shards.next_cid(), cells[1], (2, 3)))
    w.engine.run_until(0.5, 10_000)
    assert reducers.buckets and shards.ledger_shard.buffered == 0
    w.engine.run_until(60.0, 10_000)
    assert not reducers.buckets and w.counts["reduced_sums"] == 0 and shards.ledger_shard.buffered == 4


def test_once_a_head_is_known_gone_its_members_send_straight_to_the_server() -> None:
    w, cells, shards, reducers = groups_of_two()
    reducers.send(0.0, contribution(shards.next_cid(), cells[1], (2, 3)))
    w.engine.run_until(0.5, 10_000)  # at the head, waiting for the group
    w.changed(0, False)
    w.noticed(0.5, 0, False)
    reducers.noticed_departure(0.5, 0)
    assert not reducers.buckets and not reducers.to_head
    w.engine.run_until(5.0, 10_000)
    assert shards.ledger_shard.buffered == 4 and w.counts["contributions_lost"] == 0
