"""peers/sim/shards.py: the shard servers built from a plan's servers (every shard with a
seeded standby), and the records they keep: a shard's hand-over returns what was not committed."""

from __future__ import annotations

import pytest

from tests.unit.peers.sim.small_world import Clients, contribution, pipeline, shard_servers, world

pytestmark = pytest.mark.timeout(10)


def test_every_shard_of_the_plan_is_built_on_its_server_with_a_seeded_standby() -> None:
    w = world(4)
    shards = shard_servers(w, Clients(), holders=((0, 1), (2,)))
    assert [[(s.stage, s.index, s.holder) for s in row] for row in shards.stages] == [
        [(0, 0, 0), (0, 1, 1)],
        [(1, 0, 2)],
    ]
    assert shards.ledger_shard is shards.stages[0][0] and len(list(shards.all())) == 3
    assert all(s.standby is not None and s.standby != s.holder and s.standby_ready for s in shards.all())
    assert [shards.next_cid(), shards.next_cid()] == [1, 2]


def test_a_hand_over_returns_the_buffered_stepped_and_in_flight_contributions() -> None:
    w = world(2)
    shards = shard_servers(w, Clients())
    shard = shards.ledger_shard
    cell = pipeline(1, [1]).cells[0]
    buffered, stepped, flying = (contribution(i, cell, (i,)) for i in (1, 2, 3))
    shard.buffer, shard.buffered = [buffered], 2.0
    shard.steps.append((1, [stepped], 0.0))
    shard.in_flight[3] = flying
    shard.replicas[1] = 0
    resend = shard.hand_over(1, restored=0)
    assert sorted(c.cid for c in resend) == [1, 2, 3]
    assert (shard.holder, shard.version, shard.epoch, shard.buffered) == (1, 0, 1, 0.0)
    assert not shard.steps and not shard.in_flight and 1 not in shard.replicas
