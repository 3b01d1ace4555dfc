"""How one message travels on a stream: its framing, and reading it with bounds and deadlines.

    u32 header length | header (JSON object) | u32 blob count | (u32 length | bytes) per blob

The header is at most ``MAX_HEADER_BYTES`` and holds no NaN or infinity, a message carries at
most ``MAX_BLOBS`` blobs, and the whole is at most the reader's limit: every length is checked
before what it counts is read or allocated. ``read_message`` reads one (a caller's answer)
under one deadline; ``swarmd.peers.wire.rpc``'s server reads a request piece by piece
(``read_head``, ``read_length``, ``read_paced``) to admit it and bound it as it goes.

Given a ``swarmd.peers.wire.shaping.TrafficShaper``, both count what they move, by method, and
pace blobs chunk by chunk under the owner's caps (a header goes at once, charged to the cap);
the time spent waiting for this peer's own cap pushes a deadline back, since the other side
is not late for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import struct
from collections.abc import Awaitable, Sequence
from typing import Any

from swarmd.peers.wire.errors import Code, Invalid, ProtocolViolation, StreamBroken
from swarmd.peers.wire.protocol import MAX_BLOBS, Request
from swarmd.peers.wire.shaping import OTHER_METHOD, TrafficShaper

MAX_HEADER_BYTES = 256 * 1024
"""Fits the largest message (a replica log's 64 KiB ledger, or a relayed header, escaped)."""
DEFAULT_MAX_MESSAGE_BYTES = 256 * 1024 * 1024
DEFAULT_TIMEOUT_S = 30.0
MIN_RATE_Bps = 256 * 1024
"""A request's blobs must keep arriving at this average rate (2 Mbit/s, under any link the data
path can train over), counted from a grace after its header: a sender that stalls mid-request
is cut off, whatever length it declared."""
CHUNK_BYTES = 1024 * 1024
"""A large blob is read in chunks of this size, each due by the minimum rate."""

Frame = tuple[dict[str, Any], list[bytes]]
"""A message's header and blobs, as they travel."""


def no_constants(name: str) -> float:
    raise ValueError(f"{name} is not a number a message may carry")


async def write_message(
    writer: asyncio.StreamWriter,
    header: dict[str, Any],
    blobs: Sequence[bytes] = (),
    max_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    *,
    shaper: TrafficShaper | None = None,
    method: str | None = None,
    deadline: asyncio.Timeout | None = None,
) -> int:
    """Write one message; returns its size in bytes. With a ``shaper``, counted as sent for
    ``method`` (None: the header's) and its blobs paced, pushing ``deadline`` back by each wait."""
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
    head = struct.pack("<I", len(encoded)) + encoded + struct.pack("<I", len(blobs))
    if shaper is None:
        writer.write(head)
        for blob in blobs:
            writer.write(struct.pack("<I", len(blob)))
            writer.write(blob)
    else:
        label = method if method is not None else method_of(header)
        shaper.charge("sent", label, len(head))
        writer.write(head)
        for blob in blobs:
            shaper.charge("sent", label, 4)
            writer.write(struct.pack("<I", len(blob)))
            view = memoryview(blob)
            for offset in range(0, len(blob), CHUNK_BYTES):
                piece = view[offset : offset + CHUNK_BYTES]
                await _held(deadline, shaper.pace("sent", len(piece)))
                writer.write(piece)
                shaper.count("sent", label, len(piece))
    await writer.drain()
    return total


SMALL_REQUEST_BYTES = MAX_HEADER_BYTES + 8
"""What a server reads at most of a request that carries no blobs."""


def max_request_bytes(request_type: type[Request[Any]]) -> int:
    """The most a server reads of one request of this type."""
    if request_type.MAX_BYTES is not None:
        return request_type.MAX_BYTES
    return SMALL_REQUEST_BYTES if request_type.BLOBS == 0 else DEFAULT_MAX_MESSAGE_BYTES


LINGER_BYTES = 64 * 1024
LINGER_IDLE_S = 0.25
"""After a refusal, what a server reads and drops of the rest of the request, and how long it
waits for more, before it closes: a stream closed with bytes unread is reset, and a reset can
overtake the refusal on its way back (the asker would hear "the stream broke", not why). A
larger upload is cut off; its sender still tries to read the refusal (``rpc.request_on``)."""


async def linger(reader: asyncio.StreamReader) -> None:
    """Read and drop what more comes on a refused stream, until its end, ``LINGER_BYTES``, or
    ``LINGER_IDLE_S`` without a byte."""
    left = LINGER_BYTES
    with contextlib.suppress(TimeoutError, ConnectionError):
        while left > 0 and (chunk := await asyncio.wait_for(reader.read(left), LINGER_IDLE_S)):
            left -= len(chunk)


def method_of(header: dict[str, Any]) -> str:
    """The method a message's traffic is counted under: its header's, if it names one."""
    method = header.get("method")
    return method if isinstance(method, str) else OTHER_METHOD


async def _held(deadline: asyncio.Timeout | None, waiting: Awaitable[float]) -> float:
    """Wait for this peer's own cap with ``deadline`` stopped, then move it back by as long."""
    when = deadline.when() if deadline is not None else None
    if deadline is not None:
        deadline.reschedule(None)
    waited_s = await waiting
    if deadline is not None and when is not None:
        deadline.reschedule(when + waited_s)
    return waited_s


async def read_message(
    reader: asyncio.StreamReader,
    max_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    *,
    shaper: TrafficShaper | None = None,
    method: str = OTHER_METHOD,
) -> Frame:
    """Read one message (a caller reads its answer so); raises ProtocolViolation naming what was
    wrong (and the limit). With a ``shaper``, counted as received for ``method`` and its blobs
    paced; ``timeout_s`` does not count the waits for this peer's own cap."""
    try:
        async with asyncio.timeout(timeout_s) as deadline:
            return await _read_message(reader, max_bytes, shaper, method, deadline)
    except TimeoutError:
        raise ProtocolViolation(f"message not received within {timeout_s:.0f} s", Code.TIMEOUT) from None
    except asyncio.IncompleteReadError as e:
        raise stream_broken(e) from None


def stream_broken(e: asyncio.IncompleteReadError) -> StreamBroken:
    # The other side (or the path to it) closed the stream: a broken stream, not bad bytes; a
    # request that is safe to repeat may go again.
    return StreamBroken(f"the stream ended mid-message ({len(e.partial)} of {e.expected} bytes)")


async def _read_message(
    reader: asyncio.StreamReader,
    max_bytes: int,
    shaper: TrafficShaper | None,
    method: str,
    deadline: asyncio.Timeout,
) -> Frame:
    header, total, count = await read_head(reader)
    if shaper is not None:
        shaper.charge("received", method, total)
    blobs = []
    for _ in range(count):
        size, total = await read_length(reader, total, max_bytes)
        if shaper is None:
            blobs.append(await reader.readexactly(size))
        else:
            blobs.append((await read_paced(reader, size, shaper, method, deadline))[0])
    return header, blobs


async def read_head(reader: asyncio.StreamReader) -> tuple[dict[str, Any], int, int]:
    """A message's header and blob count, and the bytes read so far."""
    (header_len,) = struct.unpack("<I", await reader.readexactly(4))
    if header_len > MAX_HEADER_BYTES:
        raise ProtocolViolation(f"header of {header_len} bytes, over {MAX_HEADER_BYTES}", Code.TOO_LARGE)
    try:
        header = json.loads(await reader.readexactly(header_len), parse_constant=no_constants)
    except (ValueError, RecursionError):
        raise ProtocolViolation("header is not JSON (or holds NaN or an infinity)") from None
    if not isinstance(header, dict):
        raise ProtocolViolation("header is not a JSON object")
    (count,) = struct.unpack("<I", await reader.readexactly(4))
    if count > MAX_BLOBS:
        raise ProtocolViolation(f"{count} blobs, over {MAX_BLOBS}", Code.TOO_LARGE)
    return header, 8 + header_len, count


async def read_length(reader: asyncio.StreamReader, total: int, max_bytes: int) -> tuple[int, int]:
    """The next blob's declared length, refused before it is read when the message would pass
    ``max_bytes``; and the message's bytes with it."""
    (size,) = struct.unpack("<I", await reader.readexactly(4))
    total += 4 + size
    if total > max_bytes:
        raise ProtocolViolation(f"message of at least {total} bytes, over the {max_bytes}-byte limit", Code.TOO_LARGE)
    return size, total


async def read_paced(
    reader: asyncio.StreamReader,
    size: int,
    shaper: TrafficShaper,
    method: str,
    deadline: asyncio.Timeout | None = None,
    due: float | None = None,
) -> tuple[bytes, float]:
    """A blob of ``size`` bytes (its length read) in chunks, each let in by ``shaper``'s cap on
    receiving and counted for ``method``. With ``due``, the end of each chunk is due on
    ``deadline`` ``MIN_RATE_Bps`` after ``due`` (its start) plus the time waited for the cap;
    without, ``deadline`` (if any) is moved back by each wait. Returns the blob and the time
    waited."""
    shaper.charge("received", method, 4)
    chunks, waited_s = [b""], 0.0
    for offset in range(0, size, CHUNK_BYTES):
        n = min(CHUNK_BYTES, size - offset)
        if deadline is None or due is None:
            waited_s += await _held(deadline, shaper.pace("received", n))
        else:
            deadline.reschedule(None)  # our own cap holds the bytes back, not the sender
            waited_s += await shaper.pace("received", n)
            deadline.reschedule(due + waited_s + (offset + n) / MIN_RATE_Bps)
        chunks.append(await reader.readexactly(n))
        shaper.count("received", method, n)
    return chunks[-1] if len(chunks) <= 2 else b"".join(chunks), waited_s
