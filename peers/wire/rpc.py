"""Requests between peers on the data path: typed messages framed over hivemind P2P streams.

One request per stream: the caller opens a stream on ``PROTOCOL`` to a peer (libp2p
authenticates the peer ID on both ends), writes one message, reads one answer. A message is

    u32 header length | header (JSON object) | u32 blob count | (u32 length | bytes) per blob

with the header at most ``MAX_HEADER_BYTES``, at most ``MAX_BLOBS`` blobs, and the whole at
most the receiver's limit (a method's own ``MAX_BYTES``, else the server's): every length is
checked before anything is read or allocated, and every read has a deadline. The header is a
``swarmd.peers.wire.protocol`` message; blobs carry tensor frames (``codecs``) or safetensors.

``RpcServer`` dispatches by method to the handler registered for the request's type, which
gets the authenticated speaker and a request already checked. The server never raises: a
malformed, oversized, slow or unknown request, or a handler's refusal, is answered with a
``Code`` and counted. A request a relay passes on (``Relayed``) is unwrapped here, believed only
from a relay of the plan, and handed to the inner method's handler as from the peer it speaks
for: handlers never see relaying. ``call`` sends a request and returns its typed answer, or
raises the refusal's own exception (``swarmd.peers.wire.errors``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import struct
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

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
from swarmd.peers.wire.messages import Relayed
from swarmd.peers.wire.protocol import MAX_BLOBS, Request
from swarmd.peers.wire.protocol import Answer as TypedAnswer

__all__ = [
    "PROTOCOL",
    "MAX_HEADER_BYTES",
    "RpcServer",
    "RpcCounters",
    "Handler",
    "call",
    "exchange",
    "request_on",
    "answer_of",
    "read_message",
    "write_message",
    "max_request_bytes",
    "RpcError",
    "Unreachable",
    "StreamBroken",
    "ProtocolViolation",
]

logger = logging.getLogger(__name__)

PROTOCOL = "/swarmd/wire/2.0.0"
MAX_HEADER_BYTES = 256 * 1024
"""Fits the largest message (a replica log's 64 KiB ledger, or a relayed header, escaped)."""
SMALL_REQUEST_BYTES = MAX_HEADER_BYTES + 8
"""What the server reads at most of a request that carries no blobs."""
DEFAULT_MAX_MESSAGE_BYTES = 256 * 1024 * 1024
DEFAULT_TIMEOUT_S = 30.0
MAX_CONCURRENT_REQUESTS = 32
MAX_PER_PEER = 8
"""Requests of one speaker served at once; more are refused QUOTA (a peer cannot take every slot)."""

R = TypeVar("R", bound=Request[Any])
A = TypeVar("A", bound=TypedAnswer)
Handler = Callable[[str, R, list[bytes]], Awaitable[tuple[TypedAnswer, list[bytes]]]]
"""``async def handler(sender, request, blobs) -> (answer, blobs)``."""
Frame = tuple[dict[str, Any], list[bytes]]
"""A message's header and blobs, as they travel."""


def _no_constants(name: str) -> float:
    raise ValueError(f"{name} is not a number a message may carry")


async def write_message(
    writer: asyncio.StreamWriter,
    header: dict[str, Any],
    blobs: Sequence[bytes] = (),
    max_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
) -> int:
    """Write one message; returns its size in bytes."""
    try:
        encoded = json.dumps(header, separators=(",", ":"), allow_nan=False).encode()
    except ValueError as e:
        raise Invalid(f"message header cannot be sent: {e}") from None
    if len(encoded) > MAX_HEADER_BYTES:
        raise Invalid(f"message header is {len(encoded)} bytes, over {MAX_HEADER_BYTES}")
    if len(blobs) > MAX_BLOBS:
        raise Invalid(f"message has {len(blobs)} blobs, over {MAX_BLOBS}")
    total = 8 + len(encoded) + sum(4 + len(b) for b in blobs)
    if total > max_bytes:
        raise Invalid(f"message is {total} bytes, over the {max_bytes}-byte limit")
    writer.write(struct.pack("<I", len(encoded)) + encoded + struct.pack("<I", len(blobs)))
    for blob in blobs:
        writer.write(struct.pack("<I", len(blob)))
        writer.write(blob)
    await writer.drain()
    return total


async def read_message(
    reader: asyncio.StreamReader,
    max_bytes: int | Callable[[dict[str, Any]], int] = DEFAULT_MAX_MESSAGE_BYTES,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> Frame:
    """Read one message; raises ProtocolViolation naming what was wrong (and the limit).
    ``max_bytes`` may depend on the header (a method's own limit), read before any blob."""
    try:
        return await asyncio.wait_for(_read_message(reader, max_bytes), timeout_s)
    except TimeoutError:
        raise ProtocolViolation(f"message not received within {timeout_s:.0f} s", Code.TIMEOUT) from None
    except asyncio.IncompleteReadError as e:
        # The other side (or the path to it) closed the stream: a broken stream, not bad bytes; a
        # request that is safe to repeat may go again.
        raise StreamBroken(f"the stream ended mid-message ({len(e.partial)} of {e.expected} bytes)") from None


async def _read_message(reader: asyncio.StreamReader, limit: int | Callable[[dict[str, Any]], int]) -> Frame:
    (header_len,) = struct.unpack("<I", await reader.readexactly(4))
    if header_len > MAX_HEADER_BYTES:
        raise ProtocolViolation(f"header of {header_len} bytes, over {MAX_HEADER_BYTES}", Code.TOO_LARGE)
    try:
        header = json.loads(await reader.readexactly(header_len), parse_constant=_no_constants)
    except (ValueError, RecursionError):
        raise ProtocolViolation("header is not JSON (or holds NaN or an infinity)") from None
    if not isinstance(header, dict):
        raise ProtocolViolation("header is not a JSON object")
    max_bytes = limit(header) if callable(limit) else limit
    (count,) = struct.unpack("<I", await reader.readexactly(4))
    if count > MAX_BLOBS:
        raise ProtocolViolation(f"{count} blobs, over {MAX_BLOBS}", Code.TOO_LARGE)
    total, blobs = 8 + header_len, []
    for _ in range(count):
        (size,) = struct.unpack("<I", await reader.readexactly(4))
        total += 4 + size
        if total > max_bytes:
            raise ProtocolViolation(
                f"message of at least {total} bytes, over the {max_bytes}-byte limit", Code.TOO_LARGE
            )
        blobs.append(await reader.readexactly(size))
    return header, blobs


@dataclass
class RpcCounters:
    requests: int = 0
    answered: int = 0
    refused: dict[str, int] = field(default_factory=dict)
    """Refusals by code (``Code``): malformed, oversized and slow requests, unknown methods, and
    what the handlers refused."""
    bytes_in: int = 0
    """Bytes of the requests' blobs and framing (their JSON headers left out)."""
    bytes_out: int = 0
    """Bytes of the answers sent, headers included."""

    def refuse(self, code: Code) -> None:
        self.refused[code.value] = self.refused.get(code.value, 0) + 1


@dataclass(frozen=True)
class _Route:
    request_type: type[Request[Any]]
    handler: Callable[..., Awaitable[Any]]
    relayable: bool


class RpcServer:
    """Serves registered handlers on ``PROTOCOL``; one instance per daemon (module doc)."""

    def __init__(
        self,
        *,
        run_id: str | None = None,
        is_relay: Callable[[str], bool] | None = None,
        admit: Callable[[str, Request[Any]], None] | None = None,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        max_per_peer: int = MAX_PER_PEER,
    ) -> None:
        """``run_id``: the run served (another run's request is refused WRONG_RUN); ``is_relay``:
        whether a peer is a relay of the plan in force (None: nobody relays to us); ``admit``:
        raises a ``Refused`` for a speaker that may not be served (not a member, over a quota)."""
        self.run_id, self.is_relay, self.admit = run_id, is_relay, admit
        self.max_message_bytes, self.timeout_s, self.max_per_peer = max_message_bytes, timeout_s, max_per_peer
        self.counters = RpcCounters()
        self._routes: dict[str, _Route] = {}
        self._slots = asyncio.Semaphore(MAX_CONCURRENT_REQUESTS)
        self._in_flight: dict[str, int] = {}

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
        await self.serve(str(info.peer_id), reader, writer)

    async def serve(self, peer_id: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Answer one request from ``peer_id`` (authenticated by the transport) on a stream."""
        self.counters.requests += 1
        try:
            if self._slots.locked():
                await self._refuse(writer, Busy(f"{MAX_CONCURRENT_REQUESTS} requests in flight here; retry later"))
                return
            async with self._slots:
                await self._serve_one(peer_id, reader, writer)
        except Exception:  # the stream broke while answering: nothing more to tell the peer
            logger.debug("Answering %s failed", peer_id, exc_info=True)
        finally:
            writer.close()

    async def _serve_one(self, peer_id: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            header, blobs = await read_message(reader, self._limit, self.timeout_s)
        except (ProtocolViolation, StreamBroken) as e:  # a request cut short is the sender's: answered if it can hear
            code = e.code if isinstance(e, ProtocolViolation) else Code.BAD_REQUEST
            logger.debug("Refused a request from %s: %s", peer_id, e)
            await self._refuse(writer, refusal(code, f"refused: {e}"))
            return
        self.counters.bytes_in += 8 + sum(4 + len(b) for b in blobs)
        answer, out = await self._dispatch(peer_id, header, blobs)
        try:
            sent = await asyncio.wait_for(write_message(writer, answer, out, self.max_message_bytes), self.timeout_s)
        except Invalid as e:  # too large for our own limit: the handler's fault, and the asker must hear of it
            logger.warning("Answer to %s from %s cannot be sent: %s", header.get("method"), peer_id, e)
            await self._refuse(writer, Internal(f"the answer cannot be sent: {e}"))
            return
        self.counters.bytes_out += sent
        if answer.get("ok") is True:
            self.counters.answered += 1

    async def _dispatch(self, sender: str, header: dict[str, Any], blobs: list[bytes]) -> Frame:
        """The answer (or refusal) to one request; never raises."""
        try:
            method = header.get("method")
            if method == Relayed.METHOD:
                sender, header = self._unwrap(sender, Relayed.decode(header, blobs))
                method = header.get("method")
            route = self._routes.get(method) if isinstance(method, str) else None
            if route is None:
                raise UnknownMethod(f"no method {str(method)[:40]!r} here; this peer serves {sorted(self._routes)}")
            if self._in_flight.get(sender, 0) >= self.max_per_peer:
                raise OverQuota(f"{self.max_per_peer} requests of yours in flight here; wait for their answers")
            self._in_flight[sender] = self._in_flight.get(sender, 0) + 1
            try:
                return await self._handle(route, sender, header, blobs)
            finally:
                self._in_flight[sender] -= 1
                if not self._in_flight[sender]:
                    del self._in_flight[sender]
        except Refused as e:
            error: Refused = e
        except Invalid as e:
            error = BadRequest(str(e))
        except SwarmdError as e:  # a failure of the handler's own, not a refusal: its text for people
            error = Internal(str(e))
        except Exception as e:
            logger.exception("Handler of %s failed on a request from %s", header.get("method"), sender)
            error = Internal(f"internal error ({type(e).__name__}); see this peer's log")
        self.counters.refuse(error.code)
        return refusal_header(error), []

    async def _handle(self, route: _Route, sender: str, header: dict[str, Any], blobs: list[bytes]) -> Frame:
        request = route.request_type.decode(header, blobs)
        if self.run_id is not None and request.run_id != self.run_id:
            raise WrongRun(f"this peer serves run {self.run_id}, not {request.run_id}")
        if self.admit is not None:
            self.admit(sender, request)
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
            inner = json.loads(relayed.header, parse_constant=_no_constants)
        except (ValueError, RecursionError):
            raise BadRequest("a relayed request's header is not JSON") from None
        method = inner.get("method") if isinstance(inner, dict) else None
        route = self._routes.get(method) if isinstance(method, str) else None
        if route is None or not route.relayable:
            raise BadRequest(f"method {str(method)[:40]!r} is not served through relays here")
        return relayed.on_behalf_of, inner

    def _limit(self, header: dict[str, Any]) -> int:
        method = header.get("method")
        route = self._routes.get(method) if isinstance(method, str) else None
        if route is None or route.request_type is None:
            return self.max_message_bytes
        return min(self.max_message_bytes, max_request_bytes(route.request_type))

    async def _refuse(self, writer: asyncio.StreamWriter, error: Refused) -> None:
        self.counters.refuse(error.code)
        await asyncio.wait_for(write_message(writer, refusal_header(error)), self.timeout_s)


def max_request_bytes(request_type: type[Request[Any]]) -> int:
    """The most the server reads of one request of this type."""
    if request_type.MAX_BYTES is not None:
        return request_type.MAX_BYTES
    return SMALL_REQUEST_BYTES if request_type.BLOBS == 0 else DEFAULT_MAX_MESSAGE_BYTES


async def request_on(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    header: dict[str, Any],
    blobs: Sequence[bytes],
    *,
    timeout_s: float,
    max_message_bytes: int,
    what: str = "request",
) -> Frame:
    """One request on an open stream: its answer's header (``ok`` included) and blobs, as read.
    ``what`` (method and peer) opens the errors' messages."""
    try:
        await asyncio.wait_for(write_message(writer, header, blobs, max_message_bytes), timeout_s)
        return await read_message(reader, max_message_bytes, timeout_s)
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
