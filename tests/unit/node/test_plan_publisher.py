"""daemon/node/plan_publisher.py: the round trip between a published plan and the planner's Plan,
which the coordinator repairs and compares with a fresh one."""

from __future__ import annotations

import pytest

from swarmd.node.plan_publisher import record_plan
from swarmd.peers.records.plan_record import PlanRecord

pytestmark = pytest.mark.timeout(30)


def test_a_published_plan_goes_back_to_the_planner_unchanged() -> None:
    record = PlanRecord(
        run_id="r.x",
        peer_id="a",
        issued_at=1_800_000_000.0,
        expires_at=1_800_000_300.0,
        version=7,
        kind="repair",
        devices=["a", "b", "c", "d", "e"],
        pipelines=[[0, 1], [2, 3]],
        layers_per_stage=[3, 1],
        parameter_servers=[0, 1],
        relays=[4],
        shard_servers=[[0, 2], [1, 3]],
        local_steps=4,
        share_micro_batches=2,
        spares=[4],
        reduce_groups=[2, 1],
    )
    p = record_plan(record)
    assert p.pipelines == ((0, 1), (2, 3)) and p.layers_per_stage == (3, 1)
    assert p.parameter_servers == (0, 1) and p.relays == (4,) and p.spares == (4,)
    assert p.shard_servers == ((0, 2), (1, 3)) and p.reduce_groups == (2, 1)
    assert (p.local_steps, p.share_micro_batches) == (4, 2)
    # into another scenario's indices (the live one orders its members by peer ID too)
    assert record_plan(record).remapped([4, 3, 2, 1, 0]).pipelines == ((4, 3), (2, 1))
