"""peers/wire/rpc.py: dispatch to typed handlers, refusals by code, relayed requests, quotas,
and the framing's bounds, over in-memory streams (tests/integration/test_wire_rpc.py runs
the same over real libp2p)."""

from __future__ import annotations

import asyncio
import json
import logging
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pytest

from swarmd.peers.wire import rpc
from swarmd.peers.wire.errors import (
    BadRequest,
    Busy,
    Internal,
    Invalid,
    NotHolder,
    NotRelay,
    OverQuota,
    ProtocolViolation,
    UnknownMethod,
    WrongRun,
)
from swarmd.peers.wire.messages import Probe, Probed, Pull, Pulled, Relayed
from swarmd.peers.wire.protocol import Ack, Answer, Request, bound
from swarmd.peers.wire.quota import QuotaLimits
from tests.unit.peers.wire.memory_streams import MemoryNet, serve_raw, stream

pytestmark = pytest.mark.timeout(30)

RUN = "demo.abcdefghijklmnopqrstuvwx"
OTHER_RUN = "other.abcdefghijklmnopqrstuvwx"


@dataclass(frozen=True, kw_only=True)
class Scaled(Answer):
    BLOBS = (0, 1)

    factor: float = bound(min_value=-10.0, max_value=10.0)
    speaker: str = bound(max_len=64)


@dataclass(frozen=True, kw_only=True)
class Scale(Request[Scaled]):
    METHOD = "test.rpc.scale"
    BLOBS = (0, 1)
    RELAYABLE = True

    factor: float = bound(min_value=-10.0, max_value=10.0)
    refuse: bool = False
    hold: bool = False


@dataclass(frozen=True, kw_only=True)
class Direct(Request[Ack]):
    METHOD = "test.rpc.direct"


class Host:
    """The server of peer "h": scales, refuses when asked, holds while ``gate`` is closed."""

    def __init__(self, **server: Any) -> None:
        self.seen: list[tuple[str, Scale]] = []
        self.gate = asyncio.Event()
        self.server = rpc.RpcServer(run_id=RUN, is_relay=lambda peer: peer == "r", **server)
        self.server.register(Scale, self.scale)
        self.server.register(Probe, self.probe)
        self.server.register(Direct, self.direct)

    async def scale(self, sender: str, request: Scale, blobs: list[bytes]) -> tuple[Scaled, list[bytes]]:
        self.seen.append((sender, request))
        if request.refuse:
            raise NotHolder("shard (1, 0) is not held here; refresh the shard leases")
        if request.hold:
            await self.gate.wait()
        return Scaled(factor=request.factor * 2, speaker=sender), blobs

    async def probe(self, sender: str, request: Probe, blobs: list[bytes]) -> tuple[Probed, list[bytes]]:
        return Probed(bytes=len(blobs[0])), []

    async def direct(self, sender: str, request: Direct, blobs: list[bytes]) -> tuple[Ack, list[bytes]]:
        return Ack(), []


@pytest.fixture
def net(monkeypatch: pytest.MonkeyPatch) -> MemoryNet:
    net = MemoryNet()
    monkeypatch.setattr(rpc, "exchange", net.exchange)
    return net


def host(net: MemoryNet, **server: Any) -> Host:
    h = Host(**server)
    net.servers["h"] = h.server
    return h


def test_a_handler_gets_a_checked_request_and_the_caller_a_typed_answer(net: MemoryNet) -> None:
    h = host(net)
    answer, blobs = asyncio.run(rpc.call("w", "h", Scale(run_id=RUN, factor=1.5), [b"payload"]))
    assert answer == Scaled(factor=3.0, speaker="w") and blobs == [b"payload"]
    assert h.seen == [("w", Scale(run_id=RUN, factor=1.5))]
    c = h.server.counters
    assert (c.requests, c.answered, c.refused) == (1, 1, {}) and c.bytes_in > 7 and c.bytes_out > 7


def test_a_handlers_refusal_comes_back_as_its_own_exception(net: MemoryNet) -> None:
    h = host(net)
    with pytest.raises(NotHolder) as caught:
        asyncio.run(rpc.call("w", "h", Scale(run_id=RUN, factor=1, refuse=True)))
    assert caught.value.peer_id == "h" and caught.value.method == "test.rpc.scale"
    assert caught.value.detail == "shard (1, 0) is not held here; refresh the shard leases"
    assert h.server.counters.refused == {"NOT_HOLDER": 1} and h.server.counters.answered == 0


def ask(net: MemoryNet, header: dict[str, Any], blobs: list[bytes] | None = None, sender: str = "w") -> Any:
    """A raw request; returns the typed answer, or raises the refusal."""
    answer, out = asyncio.run(net.exchange(sender, "h", header, blobs or []))
    return rpc.answer_of(Scale(run_id=RUN, factor=0), "h", answer, out)


@pytest.mark.parametrize(
    ("changes", "blobs", "error", "why"),
    [
        ({"factor": 11}, 0, BadRequest, r"Scale.factor = 11.0: must be in \[-10, 10\]"),
        ({"factor": True}, 0, BadRequest, "Scale.factor = True: must be a number"),
        ({"colour": "red"}, 0, BadRequest, "Scale.colour = 'red': unknown field"),
        ({}, 2, BadRequest, "Scale blobs = 2: must be 0 to 1"),
        ({"method": "test.rpc.nope"}, 0, UnknownMethod, "no method 'test.rpc.nope' here"),
        ({"method": 5}, 0, UnknownMethod, "no method '5'"),
        ({"run_id": OTHER_RUN}, 0, WrongRun, f"serves run {RUN}, not {OTHER_RUN}"),
    ],
)
def test_what_a_request_gets_wrong_is_refused_by_code_naming_it(
    net: MemoryNet, changes: dict[str, Any], blobs: int, error: type[Exception], why: str
) -> None:
    h = host(net)
    header = {"method": Scale.METHOD, "run_id": RUN, "factor": 1.0, **changes}
    with pytest.raises(error, match=why):
        ask(net, header, [b"x"] * blobs)
    assert h.seen == [] and sum(h.server.counters.refused.values()) == 1


def test_a_failing_handler_is_internal_and_tells_the_peer_nothing_of_its_insides(
    net: MemoryNet, caplog: pytest.LogCaptureFixture
) -> None:
    h = host(net)

    async def broken(sender: str, request: Scale, blobs: list[bytes]) -> tuple[Scaled, list[bytes]]:
        raise KeyError("secret")

    async def wrong(sender: str, request: Direct, blobs: list[bytes]) -> tuple[Answer, list[bytes]]:
        return Scaled(factor=1, speaker="x"), []

    h.server._routes[Scale.METHOD] = h.server._routes[Scale.METHOD].__class__(Scale, broken, True)
    h.server._routes[Direct.METHOD] = h.server._routes[Direct.METHOD].__class__(Direct, wrong, False)
    with caplog.at_level(logging.ERROR), pytest.raises(Internal) as caught:
        asyncio.run(rpc.call("w", "h", Scale(run_id=RUN, factor=1)))
    assert "KeyError" in caught.value.detail and "secret" not in caught.value.detail
    assert "secret" in caplog.text  # the traceback stays in this peer's log
    with caplog.at_level(logging.ERROR), pytest.raises(Internal, match=r"internal error \(TypeError\)"):
        asyncio.run(rpc.call("w", "h", Direct(run_id=RUN)))
    assert "Direct handler answered Scaled" in caplog.text


def test_a_relays_word_is_believed_and_nobody_elses(net: MemoryNet) -> None:
    h = host(net)
    inner, _ = Scale(run_id=RUN, factor=2).encode()
    relayed, _ = Relayed(run_id=RUN, on_behalf_of="w", header=json.dumps(inner)).encode()
    assert ask(net, relayed, sender="r")[0] == Scaled(factor=4.0, speaker="w")
    assert h.seen[-1][0] == "w"  # the handler sees whom the relay speaks for, never the relay
    with pytest.raises(NotRelay, match="x is not a relay of the plan in force; it may not speak for w"):
        ask(net, relayed, sender="x")
    direct, _ = Direct(run_id=RUN).encode()
    for header, why in (
        (Relayed(run_id=RUN, on_behalf_of="w", header=json.dumps(direct)), "'test.rpc.direct' is not served through"),
        (Relayed(run_id=RUN, on_behalf_of="w", header=json.dumps(relayed)), "'relay.relayed' is not served through"),
        (Relayed(run_id=RUN, on_behalf_of="w", header="{not json"), "not JSON"),
        (Relayed(run_id=OTHER_RUN, on_behalf_of="w", header=json.dumps(inner)), "not other"),
    ):
        with pytest.raises((BadRequest, WrongRun), match=why):
            ask(net, header.encode()[0], sender="r")


def test_one_peer_cannot_take_every_slot(net: MemoryNet) -> None:
    h = host(net, limits=QuotaLimits(max_in_flight=1))

    async def scenario() -> None:
        held = asyncio.create_task(rpc.call("a", "h", Scale(run_id=RUN, factor=1, hold=True)))
        while not h.seen:
            await asyncio.sleep(0)
        with pytest.raises(OverQuota, match="1 requests of yours in flight"):
            await rpc.call("a", "h", Scale(run_id=RUN, factor=1))
        answer, _ = await rpc.call("b", "h", Scale(run_id=RUN, factor=1))  # another peer is served
        assert answer.speaker == "b"
        h.gate.set()
        assert (await held)[0].speaker == "a"
        assert (await rpc.call("a", "h", Scale(run_id=RUN, factor=1)))[0].speaker == "a"  # its slot is back

    asyncio.run(scenario())
    assert h.server.counters.refused == {"QUOTA": 1}


def test_a_full_server_says_busy(net: MemoryNet) -> None:
    h = host(net)

    async def scenario() -> None:
        h.server._slots = asyncio.Semaphore(1)
        held = asyncio.create_task(rpc.call("a", "h", Scale(run_id=RUN, factor=1, hold=True)))
        while not h.seen:
            await asyncio.sleep(0)
        with pytest.raises(Busy, match="retry later"):
            await rpc.call("b", "h", Scale(run_id=RUN, factor=1))
        h.gate.set()
        await held

    asyncio.run(scenario())


def frame(header: bytes, blobs: Sequence[bytes] = ()) -> bytes:
    out = struct.pack("<I", len(header)) + header + struct.pack("<I", len(blobs))
    return out + b"".join(struct.pack("<I", len(b)) + b for b in blobs)


def ask_for(request_type: type[Request[Any]], **fields: Any) -> bytes:
    """The header of a request of this type in our run, as it travels."""
    return json.dumps({"method": request_type.METHOD, "run_id": RUN, **fields}).encode()


def refusal(raw: bytes) -> dict[str, Any]:
    (length,) = struct.unpack_from("<I", raw)
    answer: dict[str, Any] = json.loads(raw[4 : 4 + length])
    assert answer["ok"] is False
    return answer


@pytest.mark.parametrize(
    ("payload", "code", "why"),
    [
        (frame(b"{{{{"), "BAD_REQUEST", "not JSON"),
        (frame(b'{"method": "test.rpc.scale", "factor": NaN}'), "BAD_REQUEST", "NaN"),
        (frame(b"[1, 2]"), "BAD_REQUEST", "not a JSON object"),
        (struct.pack("<I", 2**31), "TOO_LARGE", "over 262144"),
        (frame(b'{"method": "x"}', [b""] * 65), "TOO_LARGE", "65 blobs, over 64"),
        (frame(ask_for(Direct), [b""]), "BAD_REQUEST", "Direct blobs = 1: must be exactly 0"),
        (frame(ask_for(Scale, factor=1))[:-4] + struct.pack("<II", 1, 2**31), "TOO_LARGE", "268435456-byte limit"),
        (frame(ask_for(Probe), [bytes(Probe.MAX_BYTES or 0)]), "TOO_LARGE", f"over the {Probe.MAX_BYTES}-byte"),
        (struct.pack("<I", 100) + b'{"method":', "TIMEOUT", "its header is due within 0 s"),
        (struct.pack("<I", 100) + b'{"method"', "BAD_REQUEST", None),
    ],
)
def test_a_malformed_oversized_or_slow_request_is_refused_and_counted(payload: bytes, code: str, why: str) -> None:
    h = Host(timeout_s=0.2)

    async def send() -> bytes:
        if code == "BAD_REQUEST" and why is None:  # the peer ends the stream mid-message
            to_server, client = stream()
            back, server_writer = stream()
            client.write(payload)
            client.close()
            await h.server.serve("w", to_server, server_writer)
            return await back.read()
        return await serve_raw(h.server, "w", payload)

    answer = refusal(asyncio.run(send()))
    assert answer["code"] == code and (why is None or why in answer["detail"]), answer
    assert h.server.counters.refused == {code: 1}


def test_a_probe_within_its_bound_is_served() -> None:
    h = Host()
    raw = asyncio.run(
        serve_raw(h.server, "w", frame(json.dumps({"method": "probe", "run_id": RUN}).encode(), [bytes(1000)]))
    )
    (length,) = struct.unpack_from("<I", raw)
    assert json.loads(raw[4 : 4 + length]) == {"ok": True, "bytes": 1000}


@pytest.mark.parametrize(
    ("header", "why"),
    [
        ({"ok": True, "factor": "x", "speaker": "h"}, "the answer broke its schema: Scaled.factor"),
        ({"ok": "yes"}, "Scaled.ok = 'yes': must be true"),
        ({"ok": False, "code": "BUSY"}, "a refusal must be exactly ok, code and detail"),
        ({"ok": False, "code": "SLEEPY", "detail": "zz"}, "unknown code 'SLEEPY'"),
    ],
)
def test_an_answer_that_breaks_its_schema_is_the_servers_protocol_violation(header: dict[str, Any], why: str) -> None:
    with pytest.raises(ProtocolViolation, match=why):
        rpc.answer_of(Scale(run_id=RUN, factor=1), "h", header, [])


def test_a_long_poll_extends_the_callers_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[float] = []

    async def exchange(p2p: Any, peer: str, header: dict[str, Any], blobs: Any, **kw: Any) -> rpc.Frame:
        seen.append(kw["timeout_s"])
        return Pulled(version=3, kind="none", versions=[], committed=[]).encode()

    monkeypatch.setattr(rpc, "exchange", exchange)
    pull = Pull(run_id=RUN, stage=0, shard=0, shards=1, have_version=3, pending_share_ids=[], wait_s=12)
    answer, _ = asyncio.run(rpc.call(None, "h", pull, timeout_s=5))
    assert seen == [17.0] and answer.kind == "none"


def test_a_method_is_registered_once() -> None:
    h = Host()
    with pytest.raises(ValueError, match="taken"):
        h.server.register(Scale, h.scale)
    with pytest.raises(ValueError, match="taken"):
        h.server.register(Relayed, h.scale)  # type: ignore[arg-type]


def test_a_header_that_cannot_travel_is_refused_before_it_is_sent() -> None:
    async def send(header: dict[str, Any], blobs: list[bytes]) -> None:
        _, writer = stream()
        await rpc.write_message(writer, header, blobs, max_bytes=1000)

    for header, blobs, why in (
        ({"x": float("nan")}, [], "cannot be sent"),
        ({"x": "y" * rpc.MAX_HEADER_BYTES}, [], "header is"),
        ({}, [b""] * 65, "65 blobs"),
        ({}, [bytes(1000)], "over the 1000-byte limit"),
    ):
        with pytest.raises(Invalid, match=why):
            asyncio.run(send(header, blobs))


def test_a_caller_cut_off_mid_upload_still_hears_the_refusal_sent_before_the_cut() -> None:
    class CutOff:
        """A stream the server reset after refusing the header: writes fail from the first drain."""

        def write(self, data: bytes) -> None:
            pass

        async def drain(self) -> None:
            raise ConnectionResetError("reset by peer")

    async def scenario() -> rpc.Frame:
        back = asyncio.StreamReader()
        back.feed_data(frame(json.dumps({"ok": False, "code": "NOT_MEMBER", "detail": "x is no member"}).encode()))
        back.feed_eof()
        header, blobs = Scale(run_id=RUN, factor=1).encode([bytes(1 << 20)])
        return await rpc.request_on(back, CutOff(), header, blobs, timeout_s=5, max_message_bytes=64 << 20)

    answer, _ = asyncio.run(scenario())
    assert answer == {"ok": False, "code": "NOT_MEMBER", "detail": "x is no member"}
    with pytest.raises(rpc.StreamBroken, match="the stream broke"):  # no refusal to read: the cut is what it was

        async def nothing() -> rpc.Frame:
            back = asyncio.StreamReader()
            back.feed_eof()
            return await rpc.request_on(
                back, CutOff(), *Scale(run_id=RUN, factor=1).encode([]), timeout_s=5, max_message_bytes=1 << 20
            )

        asyncio.run(nothing())
