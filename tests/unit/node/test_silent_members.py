"""daemon/node/silent_members.py: a planned member that takes up neither its cell nor its shard
is found within one lease interval and planned out, for longer at each offence; a member at
work is believed for a while before it is looked at again; scans stay bounded."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from swarmd.node.silent_members import MAX_CHECKS, PENALTY_LEASES, SilentWatch, named_tasks
from swarmd.peers.records.plan_record import PlanRecord
from swarmd.peers.taskpool.cells import CellLease
from swarmd.peers.taskpool.servers import ShardLease

pytestmark = pytest.mark.timeout(30)

T0 = 1_800_000_000.0


def plan(devices: list[str], pipelines: list[list[int]], servers: list[int]) -> PlanRecord:
    return PlanRecord(
        run_id="r.x",
        peer_id=devices[0],
        issued_at=T0,
        expires_at=T0 + 600,
        version=1,
        kind="full",
        devices=devices,
        pipelines=pipelines,
        layers_per_stage=[2, 2],
        parameter_servers=servers,
        relays=[],
    )


class LeasesDHT:
    """The pool's leases as the coordinator scans them; counts the scans."""

    def __init__(self) -> None:
        self.cells: dict[tuple[int, int], list[CellLease]] = {}
        self.shards: dict[int, list[ShardLease]] = {}
        self.scans = 0

    async def scan_cell(self, pipeline: int, stage: int, now: float) -> list[CellLease]:
        self.scans += 1
        return self.cells.get((pipeline, stage), [])

    async def scan_shards(self, stage: int, now: float) -> list[tuple[ShardLease, bytes]]:
        self.scans += 1
        return [(lease, b"") for lease in self.shards.get(stage, [])]


def cell_lease(peer: str, pipeline: int, stage: int, now: float) -> CellLease:
    return CellLease(
        run_id="r.x", peer_id=peer, issued_at=now, expires_at=now + 60, claimed_at=now, pipeline=pipeline, stage=stage
    )


def shard_lease(peer: str, stage: int, now: float) -> ShardLease:
    return ShardLease(
        run_id="r.x",
        peer_id=peer,
        issued_at=now,
        expires_at=now + 60,
        claimed_at=now,
        stage=stage,
        shard=0,
        shards=1,
        version=0,
    )


def check(watch: SilentWatch, dht: Any, p: PlanRecord, now: float) -> list[str]:
    return asyncio.run(watch.check(dht, p, set(p.devices), now))


def test_a_member_that_takes_no_task_is_planned_out_within_a_lease_interval() -> None:
    # coordinator c serves stage 0; w works pipeline 0's stage 1; m holds pipeline 1's stage 1 and
    # serves stage 1, and takes up neither
    p = plan(["c", "w", "m", "x"], [[0, 1], [3, 2]], [0, 2])
    assert named_tasks(p)["m"] == [("cell", 1, 1), ("shard", 1, 0)]
    dht = LeasesDHT()
    dht.cells = {(0, 1): [cell_lease("w", 0, 1, T0)], (1, 0): [cell_lease("x", 1, 0, T0)]}
    watch = SilentWatch("c", grace_s=30.0)
    assert check(watch, dht, p, T0) == [] and dht.scans == 0  # just named: nothing is due
    assert check(watch, dht, p, T0 + 29.0) == []
    assert check(watch, dht, p, T0 + 30.0) == ["m"]  # one lease interval, and m holds nothing
    assert watch.excluded(T0 + 31.0) == {"m"} and watch.status(T0 + 31.0) == {"silent": ["m"], "found": 1}
    # w and x were found at work: believed for a grace period, not scanned again before
    scans = dht.scans
    assert check(watch, dht, p, T0 + 45.0) == [] and dht.scans == scans
    # the penalty ends, m is planned again, stays silent: out for twice as long
    back = T0 + 30.0 + PENALTY_LEASES * 30.0
    assert watch.excluded(back) == set()
    dht.cells = {(0, 1): [cell_lease("w", 0, 1, back)], (1, 0): [cell_lease("x", 1, 0, back)]}  # renewed
    assert check(watch, dht, p, back + 30.0) == ["m"]
    assert watch.excluded(back + 30.0 + 2 * PENALTY_LEASES * 30.0 - 1) == {"m"}


def test_one_lease_of_its_own_shows_a_member_at_work() -> None:
    p = plan(["c", "s"], [[0, 0]], [0, 1])  # s only serves stage 1's shard
    dht = LeasesDHT()
    watch = SilentWatch("c", grace_s=10.0)
    check(watch, dht, p, T0)
    dht.shards = {1: [shard_lease("s", 1, T0 + 10.0)]}
    assert check(watch, dht, p, T0 + 10.0) == []
    # a lease another peer signed for s's cell, or one s let go, is not s at work
    p2 = plan(["c", "s"], [[0, 1]], [0, 0])
    dht2 = LeasesDHT()
    released = cell_lease("s", 0, 1, T0)
    dht2.cells = {(0, 1): [cell_lease("c", 0, 1, T0), released.__class__(**{**released.__dict__, "released": True})]}
    watch2 = SilentWatch("c", grace_s=10.0)
    check(watch2, dht2, p2, T0)
    assert check(watch2, dht2, p2, T0 + 10.0) == ["s"]


def test_scans_are_bounded_and_the_coordinator_never_checks_itself() -> None:
    devices = ["c", *(f"m{i:03d}" for i in range(100))]
    p = plan(devices, [[0, i] for i in range(1, 101)], [0, 1])
    dht = LeasesDHT()
    watch = SilentWatch("c", grace_s=10.0)
    check(watch, dht, p, T0)
    assert len(check(watch, dht, p, T0 + 10.0)) == MAX_CHECKS and dht.scans <= 2 * MAX_CHECKS
    assert "c" not in watch.excluded(T0 + 11.0)
    assert check(watch, dht, p, T0 + 11.0) and len(watch.excluded(T0 + 12.0)) == 2 * MAX_CHECKS
