"""peers/wire/rpc.py's server before it reads a request: admission after the header and before
any blob, strangers' own slots, deadlines for stalled streams, the byte budget, per-peer quotas
and bans, over in-memory streams fed by hand."""

from __future__ import annotations

import asyncio
import json
import struct
from typing import Any

import pytest

from swarmd.peers.wire import framing, rpc
from swarmd.peers.wire.errors import NotMember
from swarmd.peers.wire.messages import Relayed
from swarmd.peers.wire.protocol import Request
from swarmd.peers.wire.quota import ByteBudget, QuotaLimits
from tests.unit.peers.wire.memory_streams import stream
from tests.unit.peers.wire.test_rpc import RUN, Direct, Host, Scale

pytestmark = pytest.mark.timeout(30)

MiB = 1024 * 1024


class Members:
    """An ``rpc.Admit``: ``members`` may ask anything, others only ``public`` request types."""

    def __init__(self, *members: str, public: tuple[type[Request[Any]], ...] = ()) -> None:
        self.members, self.public = set(members), public

    def member(self, peer: str) -> bool:
        return peer in self.members

    def check(self, peer: str, request_type: type[Request[Any]]) -> None:
        if peer not in self.members and request_type not in self.public:
            raise NotMember(f"{peer} is not a live member of this run")


def head(request_type: type[Request[Any]], blobs: int, **fields: Any) -> bytes:
    """A request's header and blob count as they travel, in our run."""
    header = json.dumps({"method": request_type.METHOD, "run_id": RUN, **fields}).encode()
    return struct.pack("<I", len(header)) + header + struct.pack("<I", blobs)


class Stream:
    """A request stream to ``server`` from ``sender``, written by hand; ``answer`` reads back."""

    def __init__(self, server: rpc.RpcServer, sender: str) -> None:
        self.to_server, self.client = stream()
        self.back, server_writer = stream()
        self.serving = asyncio.create_task(server.serve(sender, self.to_server, server_writer))

    async def answer(self) -> dict[str, Any]:
        """The answer's header ({} when the server closed the stream without one)."""
        await asyncio.wait_for(self.serving, 10)
        raw = await self.back.read()
        if not raw:
            return {}
        (length,) = struct.unpack_from("<I", raw)
        answer: dict[str, Any] = json.loads(raw[4 : 4 + length])
        return answer


async def until(condition: Any) -> None:
    while not condition():
        await asyncio.sleep(0.001)


def test_a_stranger_is_refused_after_its_header_before_a_byte_of_its_blob_is_read() -> None:
    h = Host(admit=Members("w"))

    async def scenario() -> dict[str, Any]:
        s = Stream(h.server, "x")
        s.client.write(head(Scale, 1, factor=1) + struct.pack("<I", 48 * MiB) + bytes(MiB))
        answer = await s.answer()
        # Unread but for what the refusal's lingering close drops: the blob was never taken in.
        assert len(s.to_server._buffer) >= MiB - framing.LINGER_BYTES  # type: ignore[attr-defined]
        return answer

    answer = asyncio.run(scenario())
    assert answer["code"] == "NOT_MEMBER" and "x is not a live member" in answer["detail"]
    assert h.seen == [] and h.server.budget.held == 0
    assert h.server.counters.offenders == {"x": {"NOT_MEMBER": 1}}


def test_a_refused_stream_is_drained_until_the_asker_hangs_up_so_no_reset_overtakes_the_refusal() -> None:
    h = Host(admit=Members("w"))

    async def scenario() -> dict[str, Any]:
        s = Stream(h.server, "x")
        s.client.write(head(Scale, 1, factor=1))
        await until(lambda: len(s.back._buffer) > 0)  # type: ignore[attr-defined]  # refused after the header
        s.client.write(struct.pack("<I", 16) + bytes(16))  # the rest of the request, still on its way
        s.client.close()  # the asker read its refusal and hangs up
        answer = await s.answer()
        assert len(s.to_server._buffer) == 0 and s.to_server.at_eof()  # type: ignore[attr-defined]
        return answer

    assert asyncio.run(scenario())["code"] == "NOT_MEMBER"


def test_a_stranger_may_make_what_the_admission_opens_to_it_in_slots_of_its_own() -> None:
    h = Host(admit=Members("w", public=(Scale,)))

    async def scenario() -> None:
        stalled = []
        for i in range(rpc.STRANGER_SLOTS):  # strangers (two streams each) stall every stranger slot
            stalled.append(Stream(h.server, f"x{i // rpc.MAX_PER_STRANGER}"))
        await until(lambda: h.server._stranger_slots.locked())
        late = Stream(h.server, "y")
        assert (await late.answer())["code"] == "BUSY"
        member = Stream(h.server, "w")  # a member's slot is its own
        member.client.write(head(Scale, 0, factor=1))
        assert (await member.answer())["ok"] is True
        for s in stalled:
            s.client.write(head(Scale, 0, factor=2))
        assert [(await s.answer())["speaker"] for s in stalled] == [f"x{i // 2}" for i in range(len(stalled))]
        third = [Stream(h.server, "z") for _ in range(3)]
        assert (await third[-1].answer())["code"] == "QUOTA"  # two in flight is a stranger's most
        for s in third[:2]:
            s.client.write(head(Direct, 0))
            assert (await s.answer())["code"] == "NOT_MEMBER"

    asyncio.run(scenario())


def test_a_stream_that_stalls_before_its_header_or_mid_blob_is_cut_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rpc, "HEADER_TIMEOUT_S", 0.05)
    monkeypatch.setattr(rpc, "BLOB_GRACE_S", 0.05)
    for module in (rpc, framing):  # a chunk of the blob is due within 10 ms
        monkeypatch.setattr(module, "MIN_RATE_Bps", 100 * MiB)
    h = Host(limits=QuotaLimits(ban_after=2, strike_decay_per_s=0.0))

    async def scenario() -> list[dict[str, Any]]:
        silent = Stream(h.server, "m")
        trickle = Stream(h.server, "m")
        trickle.client.write(head(Scale, 1, factor=1) + struct.pack("<I", 10 * MiB) + bytes(1000))
        answers = [await silent.answer(), await trickle.answer()]
        assert h.server.budget.held == 0  # the stalled blob's reservation is given back
        banned = Stream(h.server, "m")  # two strikes: its streams are closed unread, unanswered
        answers.append(await banned.answer())
        return answers

    silent, trickle, banned = asyncio.run(scenario())
    assert silent["code"] == trickle["code"] == "TIMEOUT" and "header is due within 0 s" in silent["detail"]
    assert "KiB/s or faster" in trickle["detail"] and banned == {}
    c = h.server.counters
    assert c.ignored == 1 and list(c.banned) == ["m"] and c.offenders == {"m": {"TIMEOUT": 2}}


def test_what_requests_hold_together_is_bounded_and_a_request_that_does_not_fit_is_busy() -> None:
    h = Host(budget=ByteBudget(total=1000, per_peer=800))

    async def scenario() -> None:
        held = Stream(h.server, "a")
        held.client.write(head(Scale, 1, factor=1, hold=True) + struct.pack("<I", 700) + bytes(700))
        await until(lambda: h.seen)
        assert h.server.budget.held == 700
        over = Stream(h.server, "b")
        over.client.write(head(Scale, 1, factor=1) + struct.pack("<I", 301))  # its bytes never sent
        answer = await over.answer()
        assert answer["code"] == "BUSY" and "700 bytes of requests are held here (limit 1000)" in answer["detail"]
        h.gate.set()
        assert (await held.answer())["ok"] is True and h.server.budget.held == 0
        fits = Stream(h.server, "b")
        fits.client.write(head(Scale, 1, factor=1) + struct.pack("<I", 301) + bytes(301))
        assert (await fits.answer())["ok"] is True

    asyncio.run(scenario())


def test_a_peer_over_its_rate_is_slowed_then_refused_and_counted_by_peer() -> None:
    h = Host(limits=QuotaLimits(requests_per_s=1, request_burst=1, max_delay_s=0.05))
    now = [0.0]
    h.server.clock = lambda: now[0]

    async def scenario() -> list[str]:
        codes = []
        for _ in range(2):
            s = Stream(h.server, "a")
            s.client.write(head(Scale, 0, factor=1))
            codes.append((await s.answer()).get("code", "ok"))
        now[0] = 0.96  # 0.04 s short of a token: slowed, then served
        s = Stream(h.server, "a")
        s.client.write(head(Scale, 0, factor=1))
        codes.append((await s.answer()).get("code", "ok"))
        return codes

    assert asyncio.run(scenario()) == ["ok", "QUOTA", "ok"]
    c = h.server.counters
    assert c.slowed == 1 and c.refused == {"QUOTA": 1} and c.offenders == {"a": {"QUOTA": 1}}


def test_a_relayed_request_is_admitted_and_counted_as_from_the_peer_it_speaks_for() -> None:
    h = Host(admit=Members("r", "w"), limits=QuotaLimits(max_in_flight=1))

    async def ask(on_behalf_of: str) -> dict[str, Any]:
        inner = json.dumps({"method": Scale.METHOD, "run_id": RUN, "factor": 1})
        s = Stream(h.server, "r")
        s.client.write(head(Relayed, 0, on_behalf_of=on_behalf_of, header=inner))
        return await s.answer()

    assert asyncio.run(ask("w"))["speaker"] == "w"
    refused = asyncio.run(ask("x"))
    assert refused["code"] == "NOT_MEMBER" and h.server.counters.offenders == {"x": {"NOT_MEMBER": 1}}
    assert h.server.quotas.in_flight("w") == h.server.quotas.in_flight("r") == 0
