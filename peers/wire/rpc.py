"""Requests between peers on the data path: typed messages framed over hivemind P2P streams.

One request per stream: the caller opens a stream on ``PROTOCOL`` to a peer (libp2p
authenticates the peer ID on both ends), writes one message, reads one answer, each framed and
bounded by ``swarmd.peers.wire.framing`` (a request at most its method's ``MAX_BYTES``, else
the server's limit). The header is a ``swarmd.peers.wire.protocol`` message; blobs carry
tensor frames (``codecs``) or safetensors.

``RpcServer`` dispatches by method to the handler registered for the request's type, which
gets the authenticated speaker and a request already checked. Before a byte of a request is
read, the speaker's ban, requests in flight and request rate are checked (``quota``), and a
peer that is no member (``Admit``) gets one of a few slots of its own; its header must come
within ``HEADER_TIMEOUT_S``, and the admission then decides, by request type, whether that
speaker may ask it (NOT_MEMBER). Only then are blobs read: each one's declared length is
checked against the limit and reserved from the server's byte budget (BUSY when it does not
fit), charged to the speaker's byte rate, and read at ``MIN_RATE_Bps`` or faster. The server
never raises: a malformed, oversized, slow or unknown request, or a handler's refusal, is
answered with a ``Code`` and counted by code and by peer; a peer whose faults pile up is banned
for a while (its streams closed unread). A request a relay passes on (``Relayed``) is unwrapped
as soon as its header is read, believed only from a relay of the plan, admitted and counted as
from the peer it speaks for, and handed to the inner method's handler as from that peer:
handlers never see relaying; the one that must know where a speaker is (dial-back) asks
``seen_at``: the remote address of its latest stream, ``p2p-circuit`` when relayed. ``call``
sends a request and returns its typed answer, or raises the refusal's own exception (``errors``).

Both sides count every byte by method and pace blobs chunk by chunk under the owner's caps
(``swarmd.peers.wire.shaping.TRAFFIC``); waiting for one's own cap makes nobody late.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar, cast

from swarmd.errors import SwarmdError
from swarmd.peers.wire.emulated_delay import one_way_delay_s
from swarmd.peers.wire.errors import (
    BadRequest,
    Busy,
    Code,
    Internal,
    Invalid,
    NotRelay,
    OverQuota,
    ProtocolViolation,
    Refused,
    RpcError,
    SchemaError,
    StreamBroken,
    UnknownMethod,
    Unreachable,
    WrongRun,
    parse_refusal,
    refusal,
    refusal_header,
)
from swarmd.peers.wire.framing import (
    DEFAULT_MAX_MESSAGE_BYTES,
    DEFAULT_TIMEOUT_S,
    MAX_HEADER_BYTES,
    Frame,
    MIN_RATE_Bps,
    linger,
    max_request_bytes,
    method_of,
    no_constants,
    read_head,
    read_length,
    read_message,
    read_paced,
    stream_broken,
    write_message,
)
from swarmd.peers.wire.messages import Relayed
from swarmd.peers.wire.protocol import Answer as TypedAnswer
from swarmd.peers.wire.protocol import Request
from swarmd.peers.wire.quota import ByteBudget, PeerQuotas, QuotaLimits, RpcCounters
from swarmd.peers.wire.shaping import OTHER_METHOD, TRAFFIC, TrafficShaper

__all__ = ["PROTOCOL", "MAX_HEADER_BYTES", "RpcServer", "RpcCounters", "Admit", "Handler", "call", "exchange"]
__all__ += ["request_on", "answer_of", "RpcError", "Unreachable", "StreamBroken", "ProtocolViolation"]

logger = logging.getLogger(__name__)

PROTOCOL = "/swarmd/wire/2.0.0"
HEADER_TIMEOUT_S = 5.0
"""A request's header and blob count must be in this soon after its stream opens (the largest
header in 5 s is 400 kbit/s): a stream that stalls before it says what it asks holds a slot no
longer, and a non-member is refused within it."""
BLOB_GRACE_S = 10.0
"""After the header, a request's blobs are due at ``framing.MIN_RATE_Bps`` from this long on."""
MAX_CONCURRENT_REQUESTS = 64
"""Requests of members (and relays of the plan) served at once. Memory is bounded by the byte
budget, not by this: it bounds the handlers at work, long polls included."""
STRANGER_SLOTS = 8
"""Requests of non-members (the few methods the admission lets them make) served at once, in
slots of their own: however many keys a stranger makes, it never takes a member's slot."""
MAX_PER_STRANGER = 2
MAX_SEEN = 4096
"""Speakers whose latest stream's address is remembered (``seen_at``); the least recent goes first."""
R = TypeVar("R", bound=Request[Any])
A = TypeVar("A", bound=TypedAnswer)
Handler = Callable[[str, R, list[bytes]], Awaitable[tuple[TypedAnswer, list[bytes]]]]
"""``async def handler(sender, request, blobs) -> (answer, blobs)``."""


class Admit(Protocol):
    """Who may be served what (the daemon's: ``swarmd.node.admission``)."""

    def member(self, peer: str) -> bool:
        """Whether ``peer`` is a member: asked when its stream opens, to give it a member's slot."""

    def check(self, peer: str, request_type: type[Request[Any]]) -> None:
        """Raise a ``Refused`` (NOT_MEMBER) when ``peer`` may not make such a request; asked once
        its header is read, before any blob."""


@dataclass(frozen=True)
class _Route:
    request_type: type[Request[Any]]
    handler: Callable[..., Awaitable[Any]]
    relayable: bool


@dataclass
class _Call:
    """One request as it is served: who speaks, for whom, and what it holds here."""

    speaker: str
    sender: str
    counted: list[str] = field(default_factory=list)
    """The peers whose requests in flight it counts in."""
    reserved: int = 0
    """Bytes of the budget reserved for the sender."""
    method: str = OTHER_METHOD  # its traffic is counted under: its header's, once read, if served here


class RpcServer:
    """Serves registered handlers on ``PROTOCOL``; one instance per daemon (module doc)."""

    def __init__(
        self,
        *,
        run_id: str | None = None,
        is_relay: Callable[[str], bool] | None = None,
        admit: Admit | None = None,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        limits: QuotaLimits | None = None,
        budget: ByteBudget | None = None,
        clock: Callable[[], float] = time.monotonic,
        shaper: TrafficShaper = TRAFFIC,
    ) -> None:
        """``run_id``: the run served (another run's request is refused WRONG_RUN); ``is_relay``:
        whether a peer is a relay of the plan in force (None: nobody relays to us); ``admit``:
        who may ask what (None: everyone is a member); ``limits`` and ``budget``: each peer's
        quotas and what all requests may hold (``swarmd.peers.wire.quota``); ``shaper``: what
        counts and paces the bytes (``swarmd.peers.wire.shaping``)."""
        self.run_id, self.is_relay, self.admit = run_id, is_relay, admit
        self.max_message_bytes, self.timeout_s, self.clock = max_message_bytes, timeout_s, clock
        self.quotas, self.budget = PeerQuotas(limits), budget or ByteBudget()
        self.counters, self.shaper = RpcCounters(), shaper
        self._routes: dict[str, _Route] = {}
        self._slots = asyncio.Semaphore(MAX_CONCURRENT_REQUESTS)
        self._stranger_slots = asyncio.Semaphore(STRANGER_SLOTS)
        self._seen: dict[str, str] = {}  # in order of the latest stream, oldest first

    def register(
        self,
        request_type: type[R],
        handler: Callable[[str, R, list[bytes]], Awaitable[tuple[TypedAnswer, list[bytes]]]],
    ) -> None:
        """Serve ``request_type`` with ``async handler(sender, request, blobs) -> (answer, blobs)``,
        where the answer is an instance of ``request_type.ANSWER``; raise a ``Refused`` to refuse."""
        method = getattr(request_type, "METHOD", None)
        if method is None or method in self._routes or method == Relayed.METHOD:
            raise ValueError(f"cannot register {request_type.__name__}: method {method!r} is taken or missing")
        self._routes[method] = _Route(request_type, handler, request_type.RELAYABLE)

    async def attach(self, p2p: Any) -> None:
        """Start serving on a hivemind P2P instance (the daemon's replica of the DHT's)."""
        await p2p.add_binary_stream_handler(PROTOCOL, self._serve_p2p)

    async def _serve_p2p(self, info: Any, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = str(info.peer_id)
        self._seen.pop(peer, None)
        self._seen[peer] = str(info.addr)  # libp2p's, as it saw the connection: not the peer's word
        if len(self._seen) > MAX_SEEN:
            del self._seen[next(iter(self._seen))]
        await self.serve(peer, reader, writer)

    def seen_at(self, peer: str) -> str | None:
        """The remote multiaddr of ``peer``'s latest stream here (``.../p2p-circuit`` when it came
        through a relay), or None when none is remembered."""
        return self._seen.get(peer)

    async def serve(self, peer_id: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Answer one request from ``peer_id`` (authenticated by the transport) on a stream."""
        self.counters.requests += 1
        call = _Call(peer_id, peer_id)
        try:
            if self.quotas.banned_s(peer_id, self.clock()):
                self.counters.ignored += 1  # unread and unanswered: a banned peer costs a stream, no more
                return
            try:
                await self._serve_call(call, reader, writer)
            except Refused as e:
                await self._refuse(call, writer, e)
                await linger(reader)  # the refusal must not be lost to a reset
        except Exception:  # the stream broke while answering: nothing more to tell the peer
            logger.debug("Answering %s failed", peer_id, exc_info=True)
        finally:
            for peer in call.counted:
                self.quotas.close(peer)
            if call.reserved:
                self.budget.release(call.sender, call.reserved)
            writer.close()

    async def _serve_call(self, call: _Call, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        relay = self.is_relay is not None and self.is_relay(call.speaker)
        member = relay or self.admit is None or self.admit.member(call.speaker)
        # A relay speaks for others: whom, its header says, and they are counted then.
        if not relay and (delay_s := self._charge(call, call.speaker, member)) > 0:
            await asyncio.sleep(delay_s)  # slowed before it takes a slot
        slots = self._slots if member else self._stranger_slots
        if slots.locked():
            held = f"{MAX_CONCURRENT_REQUESTS} requests" if member else f"{STRANGER_SLOTS} requests of non-members"
            raise Busy(f"{held} in flight here; retry later")
        async with slots:
            try:
                route, header, blobs = await self._read(call, reader)
            except StreamBroken as e:  # a request cut short is the sender's: answered if it can hear
                raise BadRequest(f"refused: {e}") from None
            except ProtocolViolation as e:
                raise refusal(e.code, f"refused: {e}") from None
            self.counters.bytes_in += 8 + sum(4 + len(b) for b in blobs)
            answer, out = await self._dispatch(call.sender, route, header, blobs)
            try:
                async with asyncio.timeout(self.timeout_s) as deadline:
                    sent = await self._write(call, writer, (answer, out), deadline)
            except Invalid as e:  # too large for our own limit: the handler's fault, and the asker must hear of it
                logger.warning("Answer to %s from %s cannot be sent: %s", header.get("method"), call.sender, e)
                raise Internal(f"the answer cannot be sent: {e}") from None
        self.counters.bytes_out += sent
        if answer.get("ok") is True:
            self.counters.answered += 1

    def _charge(self, call: _Call, peer: str, member: bool) -> float:
        """Count a request of ``peer`` in flight and against its rate: how long to slow it."""
        if not member and self.quotas.in_flight(peer) >= MAX_PER_STRANGER:
            raise OverQuota(f"{MAX_PER_STRANGER} requests of yours in flight here, the most a non-member may have")
        now = self.clock()
        self.quotas.open(peer, now)
        call.counted.append(peer)
        delay_s = self.quotas.request(peer, now)
        self.counters.slowed += delay_s > 0
        return delay_s

    async def _read(self, call: _Call, reader: asyncio.StreamReader) -> tuple[_Route, dict[str, Any], list[bytes]]:
        """Read a request: its header within ``HEADER_TIMEOUT_S``, then (once admitted) its blobs,
        each reserved, charged and read at ``MIN_RATE_Bps``."""
        loop, header_s = asyncio.get_running_loop(), min(HEADER_TIMEOUT_S, self.timeout_s)
        try:
            async with asyncio.timeout_at(loop.time() + header_s) as deadline:
                header, total, count = await read_head(reader)
                # Counted under a method served here: a peer's made-up names are not kept.
                if isinstance(m := header.get("method"), str) and (m in self._routes or m == Relayed.METHOD):
                    call.method = m
                self.shaper.charge("received", call.method, total)
                route, header, delay_s = self._admit(call, header, count)
                limit = min(self.max_message_bytes, max_request_bytes(route.request_type))
                blobs: list[bytes] = []
                if delay_s > 0:  # a relayed request over its sender's rate: slowed, its deadline paused
                    deadline.reschedule(None)
                    await asyncio.sleep(delay_s)
                due = loop.time() + BLOB_GRACE_S  # when the bytes read so far are due at the least rate
                for _ in range(count):
                    deadline.reschedule(due + 4 / MIN_RATE_Bps)
                    size, total = await read_length(reader, total, limit)
                    self.budget.reserve(call.sender, size)
                    call.reserved += size
                    if (delay_s := self.quotas.transfer(call.sender, size, self.clock())) > 0:
                        self.counters.slowed += 1
                        deadline.reschedule(None)
                        await asyncio.sleep(delay_s)
                        due += delay_s
                    blob, waited_s = await read_paced(reader, size, self.shaper, call.method, deadline, due)
                    blobs.append(blob)
                    due += waited_s + (4 + size) / MIN_RATE_Bps
        except TimeoutError:
            raise ProtocolViolation(
                f"request not received in time: its header is due within {header_s:.0f} s, then its blobs at "
                f"{MIN_RATE_Bps // 1024} KiB/s or faster after {BLOB_GRACE_S:.0f} s",
                Code.TIMEOUT,
            ) from None
        except asyncio.IncompleteReadError as e:
            raise stream_broken(e) from None
        return route, header, blobs

    def _admit(self, call: _Call, header: dict[str, Any], count: int) -> tuple[_Route, dict[str, Any], float]:
        """The route of a request whose header is read, if its speaker may make it; and how long
        to slow it (a relayed request is counted against the peer it speaks for)."""
        method = header.get("method")
        if method == Relayed.METHOD:
            try:
                relayed = Relayed.from_fields({k: v for k, v in header.items() if k != "method"})
            except Invalid as e:
                raise BadRequest(str(e)) from None
            call.sender, header = self._unwrap(call.speaker, relayed)
            method = header.get("method")
        route = self._routes.get(method) if isinstance(method, str) else None
        if route is None:
            raise UnknownMethod(f"no method {str(method)[:40]!r} here; this peer serves {sorted(self._routes)}")
        if self.run_id is not None and header.get("run_id") != self.run_id:
            raise WrongRun(f"this peer serves run {self.run_id}, not {str(header.get('run_id'))[:80]}")
        low, high = (b, b) if isinstance(b := route.request_type.BLOBS, int) else b
        if not low <= count <= high:  # refused before its blobs are read
            rule = f"exactly {low}" if low == high else f"{low} to {high}"
            raise BadRequest(f"{route.request_type.__name__} blobs = {count}: must be {rule}")
        if self.admit is not None:
            self.admit.check(call.sender, route.request_type)
        return route, header, 0.0 if call.sender == call.speaker else self._charge(call, call.sender, True)

    async def _dispatch(self, sender: str, route: _Route, header: dict[str, Any], blobs: list[bytes]) -> Frame:
        """The answer (or refusal) to one request; never raises."""
        try:
            return await self._handle(route, sender, header, blobs)
        except Refused as e:
            error: Refused = e
        except Invalid as e:
            error = BadRequest(str(e))
        except SwarmdError as e:  # a failure of the handler's own, not a refusal: its text for people
            error = Internal(str(e))
        except Exception as e:
            logger.exception("Handler of %s failed on a request from %s", header.get("method"), sender)
            error = Internal(f"internal error ({type(e).__name__}); see this peer's log")
        self._count(sender, error.code)
        return refusal_header(error), []

    async def _handle(self, route: _Route, sender: str, header: dict[str, Any], blobs: list[bytes]) -> Frame:
        request = route.request_type.decode(header, blobs)
        answer, out = await route.handler(sender, request, blobs)
        if not isinstance(answer, route.request_type.ANSWER):
            raise TypeError(f"{route.request_type.__name__} handler answered {type(answer).__name__}")
        try:
            return answer.encode(out)
        except SchemaError as e:  # our handler's answer broke its own schema: a bug here, not the asker's
            raise Internal(f"answer does not fit its schema: {e}") from None

    def _unwrap(self, relay: str, relayed: Relayed) -> tuple[str, dict[str, Any]]:
        """Whom a relayed request speaks for, and the request."""
        if self.is_relay is None or not self.is_relay(relay):
            raise NotRelay(f"{relay} is not a relay of the plan in force; it may not speak for {relayed.on_behalf_of}")
        if self.run_id is not None and relayed.run_id != self.run_id:
            raise WrongRun(f"this peer serves run {self.run_id}, not {relayed.run_id}")
        try:
            inner = json.loads(relayed.header, parse_constant=no_constants)
        except (ValueError, RecursionError):
            raise BadRequest("a relayed request's header is not JSON") from None
        method = inner.get("method") if isinstance(inner, dict) else None
        route = self._routes.get(method) if isinstance(method, str) else None
        if route is None or not route.relayable:
            raise BadRequest(f"method {str(method)[:40]!r} is not served through relays here")
        return relayed.on_behalf_of, inner

    def _count(self, peer: str, code: Code) -> None:
        """Count a refusal by code and peer; a peer whose faults pile up is banned for a while."""
        self.counters.refuse(code, peer)
        ban_s = self.quotas.strike(peer, code, self.clock())
        if ban_s:
            logger.info("Ignoring %s for %.0f s: too many refused requests (the last %s)", peer, ban_s, code.value)
            self.counters.ban(peer, time.time() + ban_s)

    async def _refuse(self, call: _Call, writer: asyncio.StreamWriter, error: Refused) -> None:
        self._count(call.sender, error.code)
        await asyncio.wait_for(self._write(call, writer, (refusal_header(error), [])), HEADER_TIMEOUT_S)

    async def _write(
        self, call: _Call, writer: asyncio.StreamWriter, frame: Frame, deadline: asyncio.Timeout | None = None
    ) -> int:
        """An answer or a refusal to ``call``, counted and paced under its method."""
        return await write_message(
            writer, *frame, self.max_message_bytes, shaper=self.shaper, method=call.method, deadline=deadline
        )


async def request_on(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    header: dict[str, Any],
    blobs: Sequence[bytes],
    *,
    timeout_s: float,
    max_message_bytes: int,
    what: str = "request",
    shaper: TrafficShaper = TRAFFIC,
) -> Frame:
    """One request on an open stream: its answer's header (``ok`` included) and blobs, as read.
    ``what`` (method and peer) opens the errors' messages; waits for our own caps are not late."""
    method = method_of(header)
    try:
        try:
            async with asyncio.timeout(timeout_s) as deadline:
                await write_message(writer, header, blobs, max_message_bytes, shaper=shaper, deadline=deadline)
        except ConnectionError as e:
            # The server may have refused after the header and cut off the rest: its refusal can
            # still be in the stream, and it says why; without one, the cut is what went wrong.
            try:
                return await read_message(reader, max_message_bytes, min(timeout_s, 5.0), shaper=shaper, method=method)
            except (RpcError, ConnectionError, TimeoutError):
                raise e from None
        return await read_message(reader, max_message_bytes, timeout_s, shaper=shaper, method=method)
    except ProtocolViolation as e:
        if e.code is Code.TIMEOUT:
            raise StreamBroken(f"{what}: no answer within {timeout_s:.0f} s") from None
        raise ProtocolViolation(f"{what}: {e}", e.code) from None
    except StreamBroken as e:
        raise StreamBroken(f"{what}: {e}") from None
    except (ConnectionError, TimeoutError) as e:
        raise StreamBroken(f"{what}: the stream broke ({type(e).__name__})") from None


async def exchange(
    p2p: Any,
    peer_id: str,
    header: dict[str, Any],
    blobs: Sequence[bytes] = (),
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
) -> Frame:
    """Send one framed request to ``peer_id``; returns the answer as it came (ok or refused).
    Raises only the transport's errors: Unreachable, StreamBroken, ProtocolViolation."""
    from hivemind.p2p import PeerID  # deferred: hivemind cannot share a process with py-libp2p

    method = str(header.get("method"))[:40]
    try:
        info, reader, writer = await asyncio.wait_for(
            p2p.call_binary_stream_handler(PeerID.from_base58(peer_id), PROTOCOL), timeout_s
        )
    except TimeoutError:
        raise Unreachable(f"{method} to {peer_id}: no stream within {timeout_s:.0f} s") from None
    except Exception as e:
        raise Unreachable(f"{method} to {peer_id}: cannot open a stream ({e})") from None
    delay_s = one_way_delay_s(getattr(info, "addr", None))  # 0 unless the calibration harness set it
    try:
        if delay_s:
            await asyncio.sleep(delay_s)
        answer = await request_on(
            reader,
            writer,
            header,
            blobs,
            timeout_s=timeout_s,
            max_message_bytes=max_message_bytes,
            what=f"{method} to {peer_id}",
        )
        if delay_s:
            await asyncio.sleep(delay_s)
        return answer
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


def answer_of(request: Request[A], peer_id: str, header: dict[str, Any], blobs: list[bytes]) -> tuple[A, list[bytes]]:
    """The typed answer to ``request`` from its answer's header, or the refusal's exception."""
    if header.get("ok") is False:
        raise parse_refusal(header, peer_id=peer_id, method=request.METHOD)
    try:
        answer = request.ANSWER.decode(header, blobs)
    except SchemaError as e:
        raise ProtocolViolation(f"{request.METHOD} to {peer_id}: the answer broke its schema: {e}") from None
    return cast(A, answer), blobs


async def call(
    p2p: Any,
    peer_id: str,
    request: Request[A],
    blobs: Sequence[bytes] = (),
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
) -> tuple[A, list[bytes]]:
    """One request to ``peer_id``: its typed answer and blobs, or the refusal's exception. The
    deadline covers the whole exchange, plus what the request lets the server wait (a long poll)."""
    header, out = request.encode(blobs)
    answer, answer_blobs = await exchange(
        p2p, peer_id, header, out, timeout_s=timeout_s + request.server_wait_s(), max_message_bytes=max_message_bytes
    )
    return answer_of(request, peer_id, answer, answer_blobs)
