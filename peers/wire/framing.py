"""How one message travels on a stream: its framing, and reading it with bounds and deadlines.

    u32 header length | header (JSON object) | u32 blob count | (u32 length | bytes) per blob

The header is at most ``MAX_HEADER_BYTES`` and holds no NaN or infinity, a message carries at
most ``MAX_BLOBS`` blobs, and the whole is at most the reader's limit: every length is checked
before what it counts is read or allocated. ``read_message`` reads one (a caller's answer)
under one deadline; ``swarmd.peers.wire.rpc``'s server reads a request piece by piece
(``read_head``, ``read_length``, ``read_paced``) to admit it and bound it as it goes.
"""

from __future__ import annotations

import asyncio
import json
import struct
from collections.abc import Sequence
from typing import Any

from swarmd.peers.wire.errors import Code, Invalid, ProtocolViolation, StreamBroken
from swarmd.peers.wire.protocol import MAX_BLOBS

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
    reader: asyncio.StreamReader, max_bytes: int = DEFAULT_MAX_MESSAGE_BYTES, timeout_s: float = DEFAULT_TIMEOUT_S
) -> Frame:
    """Read one message (a caller reads its answer so); raises ProtocolViolation naming what was
    wrong (and the limit)."""
    try:
        return await asyncio.wait_for(_read_message(reader, max_bytes), timeout_s)
    except TimeoutError:
        raise ProtocolViolation(f"message not received within {timeout_s:.0f} s", Code.TIMEOUT) from None
    except asyncio.IncompleteReadError as e:
        raise stream_broken(e) from None


def stream_broken(e: asyncio.IncompleteReadError) -> StreamBroken:
    # The other side (or the path to it) closed the stream: a broken stream, not bad bytes; a
    # request that is safe to repeat may go again.
    return StreamBroken(f"the stream ended mid-message ({len(e.partial)} of {e.expected} bytes)")


async def _read_message(reader: asyncio.StreamReader, max_bytes: int) -> Frame:
    header, total, count = await read_head(reader)
    blobs = []
    for _ in range(count):
        size, total = await read_length(reader, total, max_bytes)
        blobs.append(await reader.readexactly(size))
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


async def read_paced(reader: asyncio.StreamReader, size: int, deadline: asyncio.Timeout, due: float) -> bytes:
    """``size`` bytes in chunks, the end of each due ``MIN_RATE_Bps`` after ``due`` (its start)."""
    chunks = [b""]
    for offset in range(0, size, CHUNK_BYTES):
        n = min(CHUNK_BYTES, size - offset)
        deadline.reschedule(due + (offset + n) / MIN_RATE_Bps)
        chunks.append(await reader.readexactly(n))
    return chunks[-1] if len(chunks) <= 2 else b"".join(chunks)
