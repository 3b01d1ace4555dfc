"""daemon/training/shards/head_relay.py with a fake pool: a head keeps the deltas its cell pulled and
answers its members' long polls from them; a member further behind than it keeps, a new one,
or a peer that does not hold the member's cell is sent to the server."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest

from swarmd.peers.taskpool.assignment import Assignment
from swarmd.peers.wire.errors import NotHolder, Unavailable
from swarmd.peers.wire.messages import Pulled, PullFromHead
from swarmd.training.shards.head_relay import HeadRelays
from tests.unit.training.shards.test_shard_server import grid

pytestmark = pytest.mark.timeout(30)

RUN = "tiny." + "a" * 24


@dataclass
class Pool:
    assignment: Assignment = field(default_factory=lambda: grid(2, group=2))

    def cell_holder(self, cell: tuple[int, int]) -> str:
        return f"cell-{cell[0]}"


class HeadCell:
    def round_seconds(self) -> float:
        return 1.0


def relays() -> HeadRelays:
    return HeadRelays(Pool(), {(0, 0): HeadCell()})  # pipeline 0's cell heads shard 0 for the group


def pull(have: int, pending: list[int] | None = None, wait_s: float = 0.0) -> PullFromHead:
    return PullFromHead(
        run_id=RUN,
        stage=0,
        shard=0,
        shards=1,
        have_version=have,
        pending_share_ids=pending or [],
        wait_s=wait_s,
        pipeline=1,
    )


def deltas(versions: list[int], committed: list[int] | None = None) -> Pulled:
    return Pulled(version=versions[-1], kind="deltas", versions=versions, committed=committed or [])


def test_a_member_gets_the_deltas_after_its_version_and_its_commits() -> None:
    async def scenario() -> tuple[Pulled, list[bytes]]:
        r = relays()
        await r.offer(0, 0, deltas([4, 5], committed=[9]), [b"d4", b"d5"])
        await r.offer(0, 0, deltas([6]), [b"d6"])
        return await r.pull("cell-1", pull(4, pending=[9, 10]))

    answer, blobs = asyncio.run(scenario())
    assert answer.version == 6 and answer.kind == "deltas" and answer.versions == [5, 6]
    assert blobs == [b"d5", b"d6"] and answer.committed == [9]


def test_a_long_poll_wakes_when_the_head_brings_a_new_version() -> None:
    async def scenario() -> tuple[Pulled, list[bytes]]:
        r = relays()
        await r.offer(0, 0, deltas([4]), [b"d4"])
        waiting = asyncio.create_task(r.pull("cell-1", pull(4, wait_s=5.0)))
        await asyncio.sleep(0.05)
        assert not waiting.done()
        await r.offer(0, 0, deltas([5]), [b"d5"])
        return await asyncio.wait_for(waiting, 1.0)

    answer, blobs = asyncio.run(scenario())
    assert answer.versions == [5] and blobs == [b"d5"]


def test_pulls_the_relay_cannot_answer_go_to_the_server() -> None:
    async def scenario() -> None:
        r = relays()
        with pytest.raises(Unavailable, match="comes from its server"):
            await r.pull("cell-1", pull(-1))  # a new cell: the whole slice
        await r.offer(0, 0, deltas([4]), [b"d4"])
        await r.offer(0, 0, deltas([7]), [b"d7"])  # a gap: the head kept only 7 on
        with pytest.raises(Unavailable, match="further behind"):
            await r.pull("cell-1", pull(4))
        with pytest.raises(Unavailable, match="behind the cell's"):
            await r.pull("cell-1", pull(9))
        with pytest.raises(NotHolder, match="does not hold cell"):
            await r.pull("cell-0", pull(7))  # not the member's holder
        assert r.info() == {"pulls": 0, "pulls_refused": 3}

    asyncio.run(scenario())


def test_a_peer_that_heads_nothing_for_the_group_refuses_the_pull() -> None:
    r = HeadRelays(Pool(), {})  # no cell here
    with pytest.raises(NotHolder, match="does not head shard"):
        asyncio.run(r.pull("cell-1", pull(4)))


def test_share_ids_sent_up_are_asked_about_until_committed() -> None:
    async def scenario() -> list[list[int]]:
        r = relays()
        r.ask(0, 0, [5, 6])
        before = r.asked(0, 0)
        await r.offer(0, 0, deltas([4], committed=[5]), [b"d4"])
        return [before, r.asked(0, 0)]

    assert asyncio.run(scenario()) == [[5, 6], [6]]
