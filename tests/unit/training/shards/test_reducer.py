"""daemon/training/shards/reducer.py with a fake pool and a fake send: a head sums its group's slices
into one contribution to the shard's server, weighted by micro-batches, hands the share IDs to
its relay, and answers every member with the server's answer; a refused sum goes one by one."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

from swarmd.peers.records.identity import Identity
from swarmd.peers.taskpool.assignment import Assignment
from swarmd.peers.taskpool.exchange import ExchangeConfig
from swarmd.peers.taskpool.tickets import ShareTicket
from swarmd.peers.wire.codecs import decode_vector, encode_vector
from swarmd.peers.wire.errors import AlreadyApplied, NotHolder
from swarmd.peers.wire.messages import Contribute, Contributed, Reduce
from swarmd.training.shards.head_relay import HeadRelays
from swarmd.training.shards.reducer import Reducer
from tests.unit.training.shards.test_shard_server import grid

pytestmark = pytest.mark.timeout(30)

RUN = "tiny." + "a" * 24
KEEPER = Identity.generate()
SIZE = 8


@dataclass
class Pool:
    """The pool as a head reads it: pipelines 0 and 1 reduce in one group, cell p held by cell-p."""

    assignment: Assignment = field(default_factory=lambda: grid(2, group=2))

    def cell_holder(self, cell: tuple[int, int]) -> str:
        return f"cell-{cell[0]}"

    def shard_holder(self, key: tuple[int, int]) -> str:
        return "server"

    def exchange_settings(self) -> ExchangeConfig:
        return ExchangeConfig(batch_micro_batches=1, share_micro_batches=2)

    def ledger_keepers(self) -> list[str]:
        return [KEEPER.peer_id]


class HeadCell:
    def round_seconds(self) -> float:
        return 60.0  # the bucket waits its longest: only the group's second slice sends it


@dataclass
class Server:
    """The shard's server: records what it is sent; refuses sums while ``refuse_sums``."""

    refuse_sums: bool = False
    sent: list[tuple[str, Contribute, list[bytes]]] = field(default_factory=list)

    async def send(self, peer: str, request: Any, blobs: list[bytes], timeout_s: float) -> tuple[Any, list[bytes]]:
        self.sent.append((peer, request, blobs))
        if request.parts > 1 and self.refuse_sums:
            raise AlreadyApplied("a member sent its part alone meanwhile")
        answer = Contributed(version=7, accepted=True, staleness=0, weight=1.0, duplicate=False)
        return answer, []


def slice_of(pipeline: int, share_id: int, value: float, micro_batches: int) -> tuple[Reduce, bytes, bytes]:
    fields = dict(share_id=share_id, first=2 * share_id, count=2, pipeline=pipeline)
    tickets = ShareTicket.sign(KEEPER, RUN, **fields, now=time.time()).pack()
    request = Reduce(
        run_id=RUN,
        stage=0,
        shard=0,
        shards=1,
        share_ids=[share_id],
        base_version=3 + pipeline,
        micro_batches=micro_batches,
        kind="gradient",
        codec="fp32",
        pipeline=pipeline,
        tickets=1,
    )
    return request, bytes(encode_vector(torch.full((SIZE,), value), "fp32")), tickets


async def _until(condition: Callable[[], bool]) -> None:
    while not condition():
        await asyncio.sleep(0.001)


def head(server: Server) -> Reducer:
    pool = Pool()
    cells = {(0, 0): HeadCell()}  # pipeline 0 heads shard 0 for the group
    return Reducer(pool, cells, HeadRelays(pool, cells), lambda stage: SIZE, server.send, lambda peer: 1e12, "fp16")


def test_a_groups_slices_go_as_one_weighted_sum_and_every_member_gets_its_answer() -> None:
    server = Server()
    reducer = head(server)

    async def scenario() -> list[Contributed]:
        a, b = slice_of(0, 5, 1.0, 1), slice_of(1, 6, 4.0, 2)
        # Pipeline 1's slice is in the bucket before pipeline 0's: the sum is still in pipeline order.
        second = asyncio.create_task(reducer.reduce("cell-1", *b))
        await asyncio.wait_for(_until(lambda: reducer.stats.slices == 1), 5)
        return [await reducer.reduce("cell-0", *a), await second]

    answers = asyncio.run(scenario())
    assert [a.version for a in answers] == [7, 7]
    [(peer, request, blobs)] = server.sent
    assert peer == "server" and request.parts == 2 and request.share_ids == [5, 6]
    assert request.micro_batches == 3 and request.base_version == 3 and request.tickets == 2
    total = decode_vector(blobs[0], SIZE, request.codec)
    assert torch.allclose(total, torch.full((SIZE,), (1.0 * 1 + 4.0 * 2) / 3), atol=1e-2)
    assert reducer.relays.asked(0, 0) == [5, 6]  # the head's pulls ask the server about them
    assert reducer.info()["sums"] == 1 and reducer.info()["summed"] == 2 and reducer.info()["waiting"] == 0


def test_a_refused_sum_goes_one_slice_at_a_time_as_it_came() -> None:
    server = Server(refuse_sums=True)
    reducer = head(server)
    a, b = slice_of(0, 5, 1.0, 1), slice_of(1, 6, 4.0, 1)

    async def scenario() -> list[Contributed]:
        return await asyncio.gather(reducer.reduce("cell-0", *a), reducer.reduce("cell-1", *b))

    answers = asyncio.run(scenario())
    assert [a.accepted for a in answers] == [True, True]
    sums, *singles = server.sent
    assert sums[1].parts == 2
    assert sorted((r.share_ids[0], blobs[0]) for _, r, blobs in singles) == [(5, a[1]), (6, b[1])]  # not re-encoded
    assert reducer.info()["refused_sums"] == 1 and reducer.info()["singles"] == 2


def test_a_slice_from_a_peer_that_does_not_hold_the_members_cell_is_refused() -> None:
    server = Server()
    reducer = head(server)
    with pytest.raises(NotHolder, match="does not hold cell"):
        asyncio.run(reducer.reduce("cell-0", *slice_of(1, 6, 1.0, 1)))  # pipeline 1's slice, from cell-0
    assert server.sent == []
