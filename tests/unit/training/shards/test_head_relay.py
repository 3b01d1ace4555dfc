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


def test_a_delivered_share_given_back_ends_the_members_waits_at_once_and_only_once() -> None:
    """A step the server dropped gave share 7 back (the head's pull says it is unknown, and the
    head had delivered it): every member's wait ends once, a poll sent before the member's
    shares went up included, and a later poll that names 7 is told at once, once. Share 8,
    still on its way (asked about, never delivered), is unknown too and ends no wait; nor does
    the head's next pull finding the same IDs unknown. Sent again and taken, 7 is known there."""

    async def scenario() -> None:
        r = relays()
        await r.offer(0, 0, deltas([4]), [b"d4"])
        r.ask(0, 0, [7, 8])
        r.delivered(0, 0, [7])
        sent_before = asyncio.create_task(r.pull("cell-1", pull(4, wait_s=5.0)))
        await asyncio.sleep(0.05)
        still_unknown = Pulled(version=4, kind="none", versions=[], committed=[], unknown=[7, 8])
        await r.offer(0, 0, still_unknown, [])
        assert (await asyncio.wait_for(sent_before, 1.0))[0].kind == "none"
        told, _ = await asyncio.wait_for(r.pull("cell-1", pull(4, pending=[7], wait_s=5.0)), 1.0)
        assert told.unknown == [7]
        again = asyncio.create_task(r.pull("cell-1", pull(4, pending=[7], wait_s=5.0)))
        on_its_way = asyncio.create_task(r.pull("cell-1", pull(4, pending=[8], wait_s=5.0)))
        await asyncio.sleep(0.05)
        await r.offer(0, 0, still_unknown, [])
        await asyncio.sleep(0.05)
        assert not again.done() and not on_its_way.done()
        r.delivered(0, 0, [7])  # sent again, and taken: known at the server now
        await r.offer(0, 0, deltas([5], committed=[7]), [b"d5"])
        assert (await asyncio.wait_for(again, 1.0))[0].committed == [7]
        assert (await asyncio.wait_for(on_its_way, 1.0))[0].versions == [5]

    asyncio.run(scenario())
