"""Whom LAN discovery says hello to, and when: the peers mDNS finds and those that call us.

Each peer is hello'd at most once per ``REHELLO_INTERVAL_S``: mDNS re-announces and inbound
hellos both ask for one, and a hostile peer opening streams must not make us dial it in a loop.
A failed hello is retried with capped exponential backoff, a few times, and a bounded number
run at once. An mDNS goodbye forgets the peer, so that its restart is hello'd at once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import multiaddr
import trio
from libp2p.abc import IHost, INetStream
from libp2p.peer.id import ID

from swarmd.peers.lan.hello import HELLO_TIMEOUT_S, LanDiscoveryError, answer_hello, read_hello

logger = logging.getLogger(__name__)

REHELLO_INTERVAL_S = 60.0
RETRY_BASE_S = 1.0
RETRY_CAP_S = 30.0
MAX_HELLO_ATTEMPTS = 6
MAX_CONCURRENT_HELLOS = 16
# Forget old hello times past this many peers so a busy LAN cannot grow the table forever.
MAX_REMEMBERED_PEERS = 4096


class Greeter:
    """Says hello to the LAN peers found and answers theirs; lives in the host's trio thread.

    ``on_hello(peer_id, payload)`` gets each hello read, ``get_hello()`` makes ours; both are
    called from the trio thread. Peers found before :meth:`open` are kept until it.
    """

    def __init__(
        self,
        own_peer_id: str,
        get_hello: Callable[[], bytes],
        on_hello: Callable[[str, bytes], None],
        max_hello_bytes: int,
        stopping: threading.Event,
    ) -> None:
        self.host: IHost | None = None
        """The libp2p host, set once it runs."""
        self._own_peer_id = own_peer_id
        self._get_hello = get_hello
        self._on_hello = on_hello
        self._max_hello_bytes = max_hello_bytes
        self._stopping = stopping
        self._nursery: trio.Nursery | None = None
        self._hello_slots = trio.Semaphore(MAX_CONCURRENT_HELLOS)
        self._last_hello: dict[ID, float] = {}
        self._inflight: set[ID] = set()
        # Peers found (by mDNS or an inbound hello) before the hello nursery opened: mDNS answers
        # from zeroconf's cache at once, and the host accepts streams as soon as it listens.
        self._pending: dict[ID, bool] = {}

    def open(self, nursery: trio.Nursery) -> None:
        """Say hellos in ``nursery`` from now on, first to the peers found meanwhile."""
        self._nursery = nursery
        pending, self._pending = self._pending, {}
        for peer_id, from_mdns in pending.items():
            self._maybe_spawn_hello(peer_id, from_mdns=from_mdns)

    def close(self) -> None:
        """The nursery is gone: hello no more."""
        self._nursery = None

    def found(self, peer_id: ID, from_mdns: bool = True) -> None:
        """A peer was announced (or called us): hello it unless we did so recently."""
        # Never raises: a run_sync_soon callback that raises crashes the whole trio run.
        try:
            self._maybe_spawn_hello(peer_id, from_mdns=from_mdns)
        except Exception as e:
            logger.warning("Could not schedule a hello to LAN peer %s: %r", peer_id, e)

    def gone(self, peer_id: ID) -> None:
        # An mDNS goodbye: the peer stopped, so a restart of it deserves an immediate hello.
        if self._last_hello.pop(peer_id, None) is not None:
            logger.info("LAN peer %s left (mDNS goodbye)", peer_id)

    def _maybe_spawn_hello(self, peer_id: ID, *, from_mdns: bool) -> None:
        if str(peer_id) == self._own_peer_id:
            return
        nursery = self._nursery
        if nursery is None:
            if not self._stopping.is_set() and len(self._pending) < MAX_CONCURRENT_HELLOS * 16:
                self._pending[peer_id] = from_mdns
            return
        now = time.monotonic()
        last = self._last_hello.get(peer_id)
        if peer_id in self._inflight or (last is not None and now - last < REHELLO_INTERVAL_S):
            logger.debug("Hello to LAN peer %s skipped: in flight or done recently", peer_id)
            return
        logger.debug("Saying hello to LAN peer %s (%s)", peer_id, "mDNS" if from_mdns else "it called us")
        if len(self._last_hello) > MAX_REMEMBERED_PEERS:
            self._last_hello = {p: t for p, t in self._last_hello.items() if now - t < REHELLO_INTERVAL_S}
        self._inflight.add(peer_id)
        nursery.start_soon(self._hello_with_retry, peer_id, from_mdns)

    async def _hello_with_retry(self, peer_id: ID, from_mdns: bool) -> None:
        try:
            for attempt in range(1, MAX_HELLO_ATTEMPTS + 1):
                # Addresses are re-read each try: mDNS may have updated them meanwhile. A peer
                # that said hello to us is reached over its open connection (or identify's addrs).
                addrs = self.host.get_peerstore().addrs(peer_id) if self.host is not None else []
                try:
                    async with self._hello_slots:
                        await self.hello(peer_id, addrs, HELLO_TIMEOUT_S)
                    return
                except Exception as e:
                    if attempt == MAX_HELLO_ATTEMPTS:
                        logger.warning(
                            "Hello to LAN peer %s failed %d times (%s); giving up until it is %s again",
                            peer_id,
                            attempt,
                            e,
                            "announced" if from_mdns else "heard from",
                        )
                        return
                    delay = min(RETRY_CAP_S, RETRY_BASE_S * 2 ** (attempt - 1))
                    logger.warning("Hello to LAN peer %s failed (%s); retrying in %.0f s", peer_id, e, delay)
                    await trio.sleep(delay)
        finally:
            self._inflight.discard(peer_id)

    async def hello(self, peer_id: ID, addrs: list[multiaddr.Multiaddr], timeout: float) -> None:
        """Read ``peer_id``'s hello and hand it to ``on_hello``; LanDiscoveryError on failure."""
        host = self.host
        if host is None:
            raise LanDiscoveryError("LAN discovery host is not running")
        payload = await read_hello(host, peer_id, addrs, timeout, self._max_hello_bytes)
        first = peer_id not in self._last_hello
        self._last_hello[peer_id] = time.monotonic()
        logger.log(logging.INFO if first else logging.DEBUG, "LAN peer %s said hello", peer_id)
        try:
            self._on_hello(str(peer_id), payload)
        except Exception as e:
            logger.warning("on_hello raised for LAN peer %s: %r", peer_id, e)

    async def answer(self, stream: INetStream) -> None:
        """The hello protocol's stream handler: answer, then learn of the caller too."""
        remote = stream.muxed_conn.peer_id
        if await answer_hello(stream, self._get_hello, self._max_hello_bytes):
            # The peer now knows us; learn of it too (unless we did so recently).
            self.found(remote, from_mdns=False)
