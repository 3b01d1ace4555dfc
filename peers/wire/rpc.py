"""Requests between peers on the data path: framed messages over hivemind P2P streams.

One request per stream: the caller opens a stream on ``PROTOCOL`` to a peer (libp2p
authenticates the peer ID on both ends), writes one message, reads one answer. A message is

    u32 header length | header (JSON object) | u32 blob count | (u32 length | bytes) per blob

with the header at most ``MAX_HEADER_BYTES``, at most ``MAX_BLOBS`` blobs, and the whole at
most the receiver's ``max_message_bytes``: every length is checked before anything is read
or allocated, and every read has a deadline. Blobs carry tensors (``tensor_wire`` frames or
safetensors bytes); the handler checks them against the plan. The server never raises: a
malformed, oversized or slow request is refused, counted and answered when it still can be.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import struct
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from swarmd.errors import SwarmdError
from swarmd.peers.wire.emulated_delay import one_way_delay_s

logger = logging.getLogger(__name__)

PROTOCOL = "/swarmd/stage/1.0.0"
MAX_HEADER_BYTES = 16 * 1024
MAX_BLOBS = 16
DEFAULT_MAX_MESSAGE_BYTES = 256 * 1024 * 1024
DEFAULT_TIMEOUT_S = 30.0
MAX_CONCURRENT_REQUESTS = 32

Answer = tuple[dict[str, Any], list[bytes]]
"""A request's or answer's header and blobs."""
Handler = Callable[[str, dict[str, Any], list[bytes]], Awaitable[Answer]]


class RpcError(SwarmdError):
    """A request failed: the peer answered with an error, or broke the protocol."""


class Unreachable(RpcError):
    """No stream to the peer could be opened: it is gone, or cannot be reached from here
    (a relay may still reach it, ``swarmd.peers.wire.routing``)."""


class ProtocolViolation(RpcError):
    """A message was malformed, oversized or too slow; its sender is at fault."""

    def __init__(self, message: str, kind: str = "malformed") -> None:
        super().__init__(message)
        self.kind = kind  # malformed, oversized or timeout: what the server counts


@dataclass
class RpcCounters:
    requests: int = 0
    answered: int = 0
    handler_errors: int = 0
    """Requests the handler refused (a SwarmdError: bad task, stale version, wrong shape)."""
    refused: dict[str, int] = field(default_factory=dict)
    """Protocol violations by kind: malformed, oversized, timeout, unknown_method, busy."""

    def refuse(self, kind: str) -> None:
        self.refused[kind] = self.refused.get(kind, 0) + 1


async def write_message(
    writer: asyncio.StreamWriter, header: dict[str, Any], blobs: Sequence[bytes] = (),
    max_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
) -> None:  # fmt: skip
    encoded = json.dumps(header, separators=(",", ":")).encode()
    if len(encoded) > MAX_HEADER_BYTES:
        raise RpcError(f"message header is {len(encoded)} bytes, over {MAX_HEADER_BYTES}")
    if len(blobs) > MAX_BLOBS:
        raise RpcError(f"message has {len(blobs)} blobs, over {MAX_BLOBS}")
    total = 8 + len(encoded) + sum(4 + len(b) for b in blobs)
    if total > max_bytes:
        raise RpcError(f"message is {total} bytes, over the {max_bytes}-byte limit")
    writer.write(struct.pack("<I", len(encoded)) + encoded + struct.pack("<I", len(blobs)))
    for blob in blobs:
        writer.write(struct.pack("<I", len(blob)))
        writer.write(blob)
    await writer.drain()


async def read_message(
    reader: asyncio.StreamReader, max_bytes: int | Callable[[dict[str, Any]], int] = DEFAULT_MAX_MESSAGE_BYTES,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> tuple[dict[str, Any], list[bytes]]:  # fmt: skip
    """Read one message; raises ProtocolViolation naming what was wrong (and the limit).
    ``max_bytes`` may depend on the header (a method's own limit), read before any blob."""
    try:
        return await asyncio.wait_for(_read_message(reader, max_bytes), timeout_s)
    except TimeoutError:
        raise ProtocolViolation(f"message not received within {timeout_s:.0f} s", "timeout") from None
    except asyncio.IncompleteReadError as e:
        raise ProtocolViolation(f"stream ended mid-message ({len(e.partial)} of {e.expected} bytes)") from None


async def _read_message(
    reader: asyncio.StreamReader, limit: int | Callable[[dict[str, Any]], int]
) -> tuple[dict[str, Any], list[bytes]]:
    (header_len,) = struct.unpack("<I", await reader.readexactly(4))
    if header_len > MAX_HEADER_BYTES:
        raise ProtocolViolation(f"header of {header_len} bytes, over {MAX_HEADER_BYTES}", "oversized")
    try:
        header = json.loads(await reader.readexactly(header_len))
    except (ValueError, RecursionError):
        raise ProtocolViolation("header is not JSON") from None
    if not isinstance(header, dict):
        raise ProtocolViolation("header is not a JSON object")
    max_bytes = limit(header) if callable(limit) else limit
    (count,) = struct.unpack("<I", await reader.readexactly(4))
    if count > MAX_BLOBS:
        raise ProtocolViolation(f"{count} blobs, over {MAX_BLOBS}", "oversized")
    total, blobs = 8 + header_len, []
    for _ in range(count):
        (size,) = struct.unpack("<I", await reader.readexactly(4))
        total += 4 + size
        if total > max_bytes:
            raise ProtocolViolation(f"message of at least {total} bytes, over the {max_bytes}-byte limit", "oversized")
        blobs.append(await reader.readexactly(size))
    return header, blobs


class RpcServer:
    """Serves named request handlers on ``PROTOCOL``; one instance per daemon."""

    def __init__(
        self, handlers: dict[str, Handler], *, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        timeout_s: float = DEFAULT_TIMEOUT_S, method_limits: dict[str, int] | None = None,
    ) -> None:  # fmt: skip
        """``method_limits``: a smaller bound on the requests of some methods (a probe, say),
        enforced while reading, before their blobs are taken in."""
        self.handlers = handlers
        self.max_message_bytes = max_message_bytes
        self.method_limits = dict(method_limits or {})
        self.timeout_s = timeout_s
        self.counters = RpcCounters()
        self._slots = asyncio.Semaphore(MAX_CONCURRENT_REQUESTS)

    async def attach(self, p2p: Any) -> None:
        """Start serving on a hivemind P2P instance (the daemon's replica of the DHT's)."""
        await p2p.add_binary_stream_handler(PROTOCOL, self._serve)

    async def _serve(self, info: Any, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer_id = str(info.peer_id)
        self.counters.requests += 1
        try:
            if self._slots.locked():
                self.counters.refuse("busy")
                await self._answer(writer, {"ok": False, "error": "busy: too many requests; retry later"})
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
        except ProtocolViolation as e:
            self.counters.refuse(e.kind)
            logger.debug("Refused a request from %s: %s", peer_id, e)
            await self._answer(writer, {"ok": False, "error": f"refused: {e}"})
            return
        method = header.get("method")
        handler = self.handlers.get(method) if isinstance(method, str) else None
        if handler is None:
            self.counters.refuse("unknown_method")
            await self._answer(writer, {"ok": False, "error": f"unknown method {str(method)[:40]!r}"})
            return
        try:
            answer, out_blobs = await handler(peer_id, header, blobs)
        except SwarmdError as e:
            self.counters.handler_errors += 1
            await self._answer(writer, {"ok": False, "error": str(e)})
            return
        await self._answer(writer, {"ok": True, **answer}, out_blobs)
        self.counters.answered += 1

    def _limit(self, header: dict[str, Any]) -> int:
        method = header.get("method")
        own = self.method_limits.get(method) if isinstance(method, str) else None
        return self.max_message_bytes if own is None else min(own, self.max_message_bytes)

    async def _answer(self, writer: asyncio.StreamWriter, header: dict[str, Any], blobs: Sequence[bytes] = ()) -> None:
        await asyncio.wait_for(write_message(writer, header, blobs, self.max_message_bytes), self.timeout_s)


async def call(
    p2p: Any, peer_id: str, method: str, args: dict[str, Any] | None = None, blobs: Sequence[bytes] = (), *,
    timeout_s: float = DEFAULT_TIMEOUT_S, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
) -> tuple[dict[str, Any], list[bytes]]:  # fmt: skip
    """One request to ``peer_id``; returns the answer's header (without ``ok``) and blobs."""
    from hivemind.p2p import PeerID  # deferred: hivemind cannot share a process with py-libp2p

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
        await asyncio.wait_for(write_message(writer, {**(args or {}), "method": method}, blobs, max_message_bytes),
                               timeout_s)  # fmt: skip
        header, answer_blobs = await read_message(reader, max_message_bytes, timeout_s)
        if delay_s:
            await asyncio.sleep(delay_s)
    except (ConnectionError, TimeoutError) as e:
        raise RpcError(f"{method} to {peer_id} failed: {type(e).__name__}") from None
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()
    if header.get("ok") is not True:
        raise RpcError(f"{method} refused by {peer_id}: {str(header.get('error'))[:300]}")
    header.pop("ok")
    return header, answer_blobs
