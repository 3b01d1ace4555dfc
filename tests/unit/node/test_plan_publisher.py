"""daemon/node/plan_publisher.py: the round trip between a published plan and the planner's Plan,
which the coordinator repairs and compares with a fresh one."""

from __future__ import annotations

import asyncio

import pytest

from swarmd.models.presets import DEFAULT_RUN
from swarmd.node.plan_publisher import PlanPublisher, record_plan
from swarmd.node.swarm_view import read_view
from swarmd.peers.membership.election import ElectionConfig
from swarmd.peers.planning.plan_cost import Plan
from swarmd.peers.planning.planner import plan
from swarmd.peers.planning.snapshot import Member
from swarmd.peers.records.identity import Identity
from swarmd.peers.records.plan_record import PlanRecord
from swarmd.peers.records.run_spec import parse_spec_body, sign_run_spec
from swarmd.peers.taskpool.assignment import provisional

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


def test_a_repair_far_slower_than_a_full_plan_gives_way_to_it() -> None:
    """A repair keeps cells in place, worth a little speed, not half of it: one that puts stage 0
    on a device a thousand times slower than the rest is replaced by a full plan; the planner's
    own plan is kept as the repair it is."""
    me = Identity.generate()
    spec = sign_run_spec(me, parse_spec_body(dict(DEFAULT_RUN)))
    device = {"memory_bytes": 16 << 30}
    members = {f"p{i}": {"peer_id": f"p{i}", "device": device, "throughput_gflops": 1000.0} for i in range(7)}
    members["p6"]["throughput_gflops"] = 1.0
    snap = read_view(spec, Member(me.peer_id, 16.0, 1.0), members, {}, []).snapshot
    assert snap is not None
    publisher = PlanPublisher(spec, me, None, ElectionConfig())
    settings = publisher._settings()
    full = plan(snap.scenario, settings)
    slow = snap.scenario.ids.index("p6")
    mended = Plan(
        ((slow, full.pipelines[0][1]),),
        full.layers_per_stage,
        full.parameter_servers,
        shard_servers=full.shard_servers,
        local_steps=full.local_steps,
        share_micro_batches=full.share_micro_batches,
    )
    chosen, kind = asyncio.run(publisher._repair_or_full(snap, mended, settings))
    assert kind == "full" and slow not in {d for row in chosen.pipelines for d in row}
    assert asyncio.run(publisher._repair_or_full(snap, full, settings)) == (full, "repair")


class _Board:
    """The DHT as far as the publisher writes to it: the records it published."""

    def __init__(self) -> None:
        self.published: list[bytes] = []

    async def publish_peer_record(self, kind: str, peer: str, signed: bytes, expires_at: float) -> None:
        self.published.append(signed)


@pytest.mark.parametrize("others", [1, 2])
def test_the_first_full_plan_keeps_equal_members_where_the_provisional_rule_put_them(others: int) -> None:
    """Equal CPU daemons (same memory, no benchmark, links alike both ways) are placed by peer ID
    before the first plan; the planner, to which both orders predict the same, put the higher
    ID at stage 0 and so moved every cell and shard (a 6 s hand-over, unpriced). The first full
    plan keeps them where they are."""
    me = Identity.generate()
    spec = sign_run_spec(me, parse_spec_body({**DEFAULT_RUN, "stages": 2}))
    device = {"kind": "cpu", "name": "AMD EPYC", "memory_bytes": 16 << 30}
    members = {f"p{i}": {"peer_id": f"p{i}", "device": device, "throughput_gflops": 0.0} for i in range(others)}
    view = read_view(spec, Member(me.peer_id, 16.0, 0.0), members, {}, [])
    assert view.snapshot is not None
    ids = view.snapshot.scenario.ids
    held = provisional(ids, 2, 1)
    board = _Board()
    publisher = PlanPublisher(spec, me, board, ElectionConfig())
    asyncio.run(publisher.round(view, None, 1_800_000_000.0))
    record = publisher.published
    assert record is not None and record.version == 1 and record.kind == "full" and board.published
    assert [record.devices[d] for d in record.pipelines[0]] == list(held.cells[0])
    assert [[record.devices[d] for d in row] for row in record.shard_servers] == [list(r) for r in held.servers]
    # the planner's own choice here is the other order: without the swap back, every cell moves
    fresh = plan(view.snapshot.scenario, publisher._settings())
    assert [ids[d] for d in fresh.pipelines[0]] != list(held.cells[0])
