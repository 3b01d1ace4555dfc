"""Issue 26 against the daemon's own trainers (swarm_in_process.py): a member that holds a cell
contributes made-up share IDs, another pipeline's shares, and squats the next 1,023 IDs; every
such contribution is refused and counted by reason, and the swarm goes on training the very
shares it squatted; a reduction head checks its members' tickets before it sums them."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest
import torch

from swarmd.peers.records.identity import Identity
from swarmd.peers.taskpool.tickets import ShareTicket
from swarmd.peers.wire.codecs import encode_vector
from swarmd.peers.wire.errors import BadRequest
from swarmd.peers.wire.messages import Contribute, Reduce
from tests.unit.training.shards.test_reducer import KEEPER, RUN, Server, head
from tests.unit.training.swarm_in_process import Swarm

pytestmark = pytest.mark.timeout(240)


def test_made_up_foreign_and_squatted_shares_are_refused_and_training_goes_on(tmp_path: Path) -> None:
    async def scenario(swarm: Swarm) -> tuple[list[str], dict[str, int], int, int, set[int]]:
        await swarm.wait_for("4 updates", lambda: swarm.updates() >= 4, 180)
        trainers = {p: m.trainer for p, m in swarm.members.items()}
        # Mallory: the member that works pipeline 1's cell of the stage of shard (s, 0).
        stage = 1
        mallory = next(p for p, t in trainers.items() if (1, stage) in t.cells)
        server_peer = next(p for p, t in trainers.items() if (stage, 0) in t.servers)
        server = trainers[server_peer].servers[(stage, 0)]
        ledger = next(t.held.ledger for t in trainers.values() if t.held.ledger is not None)
        blob = encode_vector(torch.full((server.shard.size,), 1e-3), "fp32")
        upcoming = ledger.ledger.next_id

        def contribution(share_ids: list[int], micro_batches: int, tickets: list[ShareTicket]) -> Contribute:
            return Contribute(
                run_id=swarm.spec.run_id,
                stage=stage,
                shard=0,
                shards=server.shards,
                share_ids=share_ids,
                base_version=server.version,
                micro_batches=micro_batches,
                kind="gradient",
                codec="fp32",
                tickets=len(tickets),
            )

        def forged(share_id: int, pipeline: int = 1, count: int = 1024) -> ShareTicket:
            fields = dict(share_id=share_id, first=share_id * count, count=count, pipeline=pipeline)
            return ShareTicket.sign(swarm.members[mallory].identity, swarm.spec.run_id, **fields, now=time.time())

        # A real ticket of pipeline 0's, as its cells send it along the pipeline.
        theirs = None
        while theirs is None:
            share = next((t.cells[(0, 0)].flight.share for t in trainers.values() if (0, 0) in t.cells), None)
            theirs = ShareTicket.from_text(share.ticket) if share is not None and share.ticket else None
            await asyncio.sleep(0.01)
        made_up = 2**39 + 1
        squat = list(range(upcoming, upcoming + 1023))
        attacks = [
            (contribution([made_up], 4 * 1024, []), []),  # made-up work, no ticket
            (contribution([made_up], 4, [forged(made_up)]), [forged(made_up)]),  # a ticket it signed itself
            (contribution([theirs.share_id], 1, [theirs]), [theirs]),  # another pipeline's share
            (contribution(squat, 1023, []), []),  # the next 1,023 IDs, unticketed
            (contribution(squat, 1023, [forged(i) for i in squat]), [forged(i) for i in squat]),
        ]
        reasons = []
        for request, tickets in attacks:
            blobs = [blob, b"".join(t.pack() for t in tickets)] if tickets else [blob]
            counted = dict(server.stats.refused_by)
            try:
                await swarm.send(mallory, server_peer, request, blobs)
                reasons.append("taken")
            except BadRequest:  # a fault of the sender's: a strike toward its ban
                reasons += [r for r, n in server.stats.refused_by.items() if n > counted.get(r, 0)]
        before = swarm.updates()

        def squatted_trained() -> bool:
            unfinished = {s[0] for s in json.loads(ledger.state())["again"]}
            return ledger.ledger.next_id > upcoming + 4 and not unfinished & set(squat[:4])

        # The squatted IDs are issued to the honest pipelines and trained: the ledger completes them.
        await swarm.wait_for("the squatted shares trained", squatted_trained, 180)
        return reasons, dict(server.stats.refused_by), before, swarm.updates(), set(server.shard.committed(squat))

    async def main() -> tuple[list[str], dict[str, int], int, int, set[int]]:
        swarm = Swarm(tmp_path, 4)
        swarm.start()
        try:
            return await scenario(swarm)
        finally:
            await swarm.stop()

    codes, refused_by, before, after, committed = asyncio.run(main())
    assert codes == ["micro_batches", "ticket_signature", "ticket_pipeline", "ticket", "ticket_signature"], codes
    assert refused_by == {"micro_batches": 1, "ticket_signature": 2, "ticket_pipeline": 1, "ticket": 1}, refused_by
    assert after > before and committed  # trained on, the squatted shares among what it applied


def test_a_keeper_is_believed_only_for_its_own_signature() -> None:
    keeper, other = Identity.generate(), Identity.generate()
    t = ShareTicket.sign(keeper, "tiny." + "a" * 24, share_id=1, first=0, count=4, pipeline=0, now=time.time())
    assert t.signed_by("tiny." + "a" * 24, keeper.peer_id) and not t.signed_by("tiny." + "a" * 24, other.peer_id)


def test_a_head_refuses_a_members_slice_for_shares_not_ticketed_to_its_pipeline() -> None:
    # One member's bad tickets in a head's sum would make the server refuse the sum and count
    # it against the head: the head checks each member's tickets for the member's own pipeline.
    keeper, run_id = KEEPER, RUN
    server = Server()
    reducer = head(server)

    def ticket(share_id: int, pipeline: int) -> bytes:
        fields = dict(share_id=share_id, first=2 * share_id, count=2, pipeline=pipeline)
        return ShareTicket.sign(keeper, run_id, **fields, now=time.time()).pack()

    def reduce(tickets: bytes, count: int) -> None:
        request = Reduce(
            run_id=run_id,
            stage=0,
            shard=0,
            shards=1,
            share_ids=[5],
            base_version=0,
            micro_batches=2,
            kind="gradient",
            codec="fp32",
            pipeline=1,
            tickets=count,
        )
        asyncio.run(reducer.reduce("cell-1", request, b"", tickets))

    for tickets, count, reason in ((b"", 0, r"\(ticket\)"), (ticket(5, 0), 1, r"\(ticket_pipeline\)")):
        with pytest.raises(BadRequest, match=reason):
            reduce(tickets, count)
    assert server.sent == []  # neither went on to the server
