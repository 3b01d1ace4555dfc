"""The hello protocol: one size-bounded payload read over a libp2p stream.

A peer that wants to know another opens a stream on ``/swarmd/hello/1.0.0``; the other writes
its hello (varint-prefixed: the daemon's signed record with the run ID and its DHT addresses)
and closes. The payload is opaque here and untrusted: it is bounded by ``max_hello_bytes``
before it is read whole, and handed on with the peer ID that the libp2p security handshake
authenticated, never the one the dialler assumed.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable

import multiaddr
import trio
from libp2p.abc import IHost, INetStream
from libp2p.custom_types import TProtocol
from libp2p.io.exceptions import MessageTooLarge
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo
from libp2p.utils.varint import encode_varint_prefixed, read_varint_prefixed_bytes_limited

from swarmd.errors import SwarmdError

logger = logging.getLogger(__name__)

HELLO_PROTOCOL = TProtocol("/swarmd/hello/1.0.0")
HELLO_TIMEOUT_S = 5.0


class LanDiscoveryError(SwarmdError):
    """The LAN discovery host failed to start, or a hello exchange failed."""


async def read_hello(
    host: IHost, peer_id: ID, addrs: list[multiaddr.Multiaddr], timeout: float, max_hello_bytes: int
) -> bytes:
    """``peer_id``'s hello, dialled at ``addrs`` (none: over an open connection); raises
    LanDiscoveryError when it fails, is too large, times out, or another peer answers."""
    payload = b""
    remote = peer_id
    with trio.move_on_after(timeout) as scope:
        try:
            if addrs:
                await host.connect(PeerInfo(peer_id, addrs))
            stream = await host.new_stream(peer_id, [HELLO_PROTOCOL])
            remote = stream.muxed_conn.peer_id
            try:
                payload = await read_varint_prefixed_bytes_limited(stream, max_hello_bytes)
            except BaseException:
                with contextlib.suppress(Exception):
                    await stream.reset()  # tells the peer at once that we gave up
                raise
            await stream.close()
        except MessageTooLarge as e:
            raise LanDiscoveryError(f"hello from {peer_id} rejected: {e} (max_hello_bytes={max_hello_bytes})") from None
        except LanDiscoveryError:
            raise
        except Exception as e:
            raise LanDiscoveryError(f"hello to {peer_id} failed: {e!r}") from None
    if scope.cancelled_caught:
        raise LanDiscoveryError(f"hello to {peer_id} timed out after {timeout:.1f} s")
    if remote != peer_id:
        raise LanDiscoveryError(f"dialled {peer_id} but the handshake authenticated {remote}")
    return payload


async def answer_hello(stream: INetStream, get_hello: Callable[[], bytes], max_hello_bytes: int) -> bool:
    """Write our hello (``get_hello()``) on an inbound stream; whether it went out. Never raises:
    a failure is logged and the stream reset."""
    remote = stream.muxed_conn.peer_id
    try:
        payload = get_hello()
        if len(payload) > max_hello_bytes:
            # Peers of the same run use the same bound and would reject it anyway.
            logger.warning(
                "Own hello is %d bytes, over max_hello_bytes=%d; not sending it",
                len(payload),
                max_hello_bytes,
            )
            await stream.reset()
            return False
        with trio.move_on_after(HELLO_TIMEOUT_S):
            await stream.write(encode_varint_prefixed(payload))
            await stream.close()
    except Exception as e:
        logger.warning("Answering the hello of LAN peer %s failed: %r", remote, e)
        with contextlib.suppress(Exception):
            await stream.reset()
        return False
    return True
