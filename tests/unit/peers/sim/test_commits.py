"""peers/sim/commits.py: a shard's steps, committed once the standby can replay them (at once
without one); only shard (0, 0)'s commits count what is trained, and a failover's lost
versions are taken off again."""

from __future__ import annotations

import pytest

from swarmd.peers.sim.shard_records import Shard
from swarmd.peers.sim.shards import ShardServers
from tests.unit.peers.sim.small_world import Clients, contribution, pipeline, shard_servers, world

pytestmark = pytest.mark.timeout(10)


def step(shards: ShardServers, shard: Shard, now: float, share_ids: tuple[int, ...]) -> None:
    cell = pipeline(9, [1]).cells[0]
    shard.buffer = [contribution(shards.next_cid(), cell, share_ids)]
    shards.commits.step(now, shard)


def test_with_nobody_to_stand_by_a_step_is_committed_at_once_and_trains_its_micro_batches() -> None:
    w = world(1)
    shards = shard_servers(w, Clients())
    shard = shards.ledger_shard
    assert shard.standby is None
    step(shards, shard, 0.0, (0, 1, 2, 3))
    assert (shard.version, shard.committed) == (1, 1) and (w.updates, w.trained_mb) == (1, 8)
    assert {0, 1, 2, 3} <= shard.done


def test_a_step_is_committed_when_its_delta_is_logged_at_the_standby() -> None:
    w = world(3)
    clients = Clients()
    shards = shard_servers(w, clients)
    shard = shards.ledger_shard
    assert shard.standby is not None and shard.standby_ready  # seeded: every peer has the weights
    step(shards, shard, 0.0, (0, 1, 2, 3))
    assert (shard.version, shard.committed, w.updates) == (1, 0, 0)
    w.engine.run_until(5.0, 1000)
    assert (shard.committed, w.updates, w.trained_mb) == (1, 1, 8)
    assert shard.replicas[shard.standby] == 1 and w.phases.status()["commit_lag"]["n"] == 1


def test_only_shares_not_committed_before_count_as_trained_and_only_at_shard_0_0() -> None:
    w = world(1)
    shards = shard_servers(w, Clients(), holders=((0, 0),))
    first, second = shards.stages[0]
    first.remember((0,))
    step(shards, first, 0.0, (0, 1, 2, 3))
    assert w.trained_mb == 6  # share 0 was in already: k = 2 micro-batches each for 1, 2, 3
    step(shards, second, 0.0, (0, 1, 2, 3))
    assert (w.trained_mb, w.updates, second.committed) == (6, 1, 1)


def test_a_failover_below_the_committed_version_loses_those_updates_and_their_tokens() -> None:
    w = world(1)
    shards = shard_servers(w, Clients())
    shard = shards.ledger_shard
    for v in range(3):
        step(shards, shard, float(v), (4 * v, 4 * v + 1, 4 * v + 2, 4 * v + 3))
    assert (shard.committed, w.trained_mb) == (3, 24)
    shards.commits.lose(shard, restored=1)
    assert w.counts["updates_lost"] == 2 and w.trained_mb == 8
