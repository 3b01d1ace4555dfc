"""peers/sim/shard_holders.py: a shard's standby by the daemon's rule, the failover when its
holder's departure is noticed (to the standby, else the newest copy, else from the seed), the
ledger rebuilt with shard (0, 0), and a move to the server a new plan names."""

from __future__ import annotations

import pytest

from swarmd.peers.sim.world import World
from tests.unit.peers.sim.small_world import Clients, contribution, pipeline, shard_servers, world

pytestmark = pytest.mark.timeout(10)

RELIABLE = [0.9, 0.5, 0.7, 0.99]
"""Device 3 is the likeliest to stay: every shard's standby."""


def leave(w: World, device: int, now: float) -> None:
    w.changed(device, False)
    w.noticed(now, device, False)


def test_the_standby_is_the_most_reliable_member_and_gets_a_checkpoint_first() -> None:
    w = world(4, RELIABLE)
    shards = shard_servers(w, Clients())
    shard = shards.ledger_shard
    assert shard.standby == 3 and shard.standby_ready  # seeded: no copy needed
    shards.holders.elect_standby(0.0, shard)
    assert shard.standby == 3 and not shard.standby_ready  # a checkpoint on its way
    w.engine.run_until(5.0, 1000)
    assert shard.standby_ready and shard.replicas[3] == 0


def test_a_noticed_departure_of_the_holder_fails_over_to_its_standby_and_resends_what_was_not_committed() -> None:
    w = world(4, RELIABLE)
    clients = Clients()
    shards = shard_servers(w, clients, holders=((0,), (1,)))
    cell = pipeline(1, [2, 2]).cells[0]
    first = shards.ledger_shard
    first.committed = first.version = 3
    first.buffer = [contribution(shards.next_cid(), cell, (0, 1))]
    leave(w, 0, 100.0)
    shards.noticed_departure(100.0, 0)
    assert (first.holder, first.committed, first.epoch) == (3, 3, 1)
    assert w.counts["failovers"] == 1 and w.counts["updates_lost"] == 0
    assert first.standby not in (None, 0, 3) and len(first.in_flight) == 1  # a new standby; the cell resent
    assert clients.named("ledger_restarted") == [100.0]  # the ledger lives with shard (0, 0)
    assert shards.stages[1][0].holder == 1  # the other stage's shard stays


def test_with_no_copy_left_the_shard_starts_again_from_the_seed_where_the_path_says() -> None:
    w = world(4, RELIABLE)
    clients = Clients(server=2)
    shards = shard_servers(w, clients, holders=((0,), (1,)))
    second = shards.stages[1][0]
    second.committed = second.version = 5
    leave(w, 3, 50.0)
    shards.noticed_departure(50.0, 3)  # the standby goes first: another is elected
    assert second.standby not in (None, 3)
    leave(w, second.standby, 60.0)
    leave(w, 1, 60.0)
    shards.noticed_departure(60.0, 1)
    assert (second.holder, second.committed) == (2, 0) and w.counts["updates_lost"] == 5
    assert clients.named("ledger_restarted") == []  # not shard (0, 0)


def test_a_new_plan_moves_a_shard_with_a_checkpoint_and_loses_nothing() -> None:
    w = world(4, RELIABLE)
    shards = shard_servers(w, Clients())
    shard = shards.ledger_shard
    shard.committed = shard.version = 2
    shards.follow_plan(0.0, ((0, 1),))  # another shard count: not followed
    assert shard.moving_to is None
    shards.follow_plan(0.0, ((2,),))
    assert shard.moving_to == 2 and shard.holder == 0
    w.engine.run_until(5.0, 1000)
    assert (shard.holder, shard.committed, shard.moving_to) == (2, 2, None)
    assert w.counts["shard_moves"] == 1 and w.counts["updates_lost"] == 0
