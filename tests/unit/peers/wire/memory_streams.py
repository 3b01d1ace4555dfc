"""In-memory streams and a network of RPC servers for unit tests: the real framing, dispatch and
refusals of ``swarmd.peers.wire.rpc``, without hivemind, sockets or p2pd.

``MemoryNet.exchange`` stands in for ``rpc.exchange``: the ``p2p`` argument is the sending
peer's ID, ``peer_id`` names the server that answers; a peer in ``unreachable`` (or without a
server) does not open.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from swarmd.peers.wire import rpc
from swarmd.peers.wire.errors import Unreachable
from swarmd.peers.wire.shaping import TRAFFIC, TrafficShaper


class _Writer:
    """The writing end of a one-way in-memory stream: what it writes, ``reader`` reads."""

    def __init__(self, reader: asyncio.StreamReader) -> None:
        self.reader, self.closed, self.written = reader, False, 0

    def write(self, data: bytes) -> None:
        if not self.closed:
            self.written += len(data)
            self.reader.feed_data(bytes(data))

    async def drain(self) -> None:
        await asyncio.sleep(0)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.reader.feed_eof()

    async def wait_closed(self) -> None:
        return None


def stream() -> tuple[asyncio.StreamReader, Any]:
    """One direction of a stream: (reader, writer)."""
    reader = asyncio.StreamReader()
    return reader, _Writer(reader)


async def serve_raw(server: rpc.RpcServer, sender: str, payload: bytes, timeout_s: float = 5.0) -> bytes:
    """Write ``payload`` as it is to ``server`` (no half-close: it must end the stream itself)
    and return all it answers."""
    to_server, client_writer = stream()
    from_server, server_writer = stream()
    client_writer.write(payload)
    await asyncio.wait_for(server.serve(sender, to_server, server_writer), timeout_s)
    return await from_server.read()


class MemoryNet:
    def __init__(self) -> None:
        self.servers: dict[str, rpc.RpcServer] = {}
        self.unreachable: set[str] = set()
        self.calls: list[tuple[str, str, str]] = []
        """(sender, peer, method) of every request tried."""

    async def exchange(
        self,
        p2p: Any,
        peer_id: str,
        header: dict[str, Any],
        blobs: Sequence[bytes] = (),
        *,
        timeout_s: float = rpc.DEFAULT_TIMEOUT_S,
        max_message_bytes: int = rpc.DEFAULT_MAX_MESSAGE_BYTES,
        shaper: TrafficShaper = TRAFFIC,
    ) -> rpc.Frame:
        """``rpc.exchange``'s stand-in; ``shaper``: what counts and paces the sender's bytes."""
        sender = str(p2p)
        self.calls.append((sender, peer_id, str(header.get("method"))))
        server = self.servers.get(peer_id)
        if server is None or peer_id in self.unreachable:
            raise Unreachable(f"{header.get('method')} to {peer_id}: cannot open a stream")
        to_server, client_writer = stream()
        from_server, server_writer = stream()
        serving = asyncio.create_task(server.serve(sender, to_server, server_writer))
        try:
            what = f"{header.get('method')} to {peer_id}"
            return await rpc.request_on(
                from_server,
                client_writer,
                header,
                blobs,
                timeout_s=timeout_s,
                max_message_bytes=max_message_bytes,
                what=what,
                shaper=shaper,
            )
        finally:
            client_writer.close()
            await serving
