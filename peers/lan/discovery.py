"""LAN discovery: find peers of the same run on the local network with py-libp2p's mDNS.

The hivemind DHT is the source of truth for membership; this package only shortens the way in.
A daemon on a LAN with no bootstrap address advertises itself over mDNS under a service type
private to its run (``mdns``), and whenever it finds a peer it reads that peer's hello
(``hello``: an opaque, size-bounded payload, the daemon's signed record with the run ID and its
DHT addresses), paced by the ``greeter``. The daemon validates the payload and dials the DHT
addresses in it.

py-libp2p runs on trio and the daemon on asyncio, so the libp2p host lives in a thread of its
own under ``trio.run``. The public methods are synchronous and safe to call from any other
thread; the callbacks (``get_hello``, ``on_hello``) are called from the trio thread.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable

import multiaddr
import trio
from libp2p import new_host
from libp2p.abc import IHost
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import info_from_p2p_addr

from swarmd.peers.lan.greeter import Greeter
from swarmd.peers.lan.hello import HELLO_PROTOCOL, LanDiscoveryError
from swarmd.peers.lan.mdns import MdnsService, advertised_addrs, mdns_service_type
from swarmd.peers.records.identity import Identity

logger = logging.getLogger(__name__)


class LanDiscovery:
    """A py-libp2p host in its own trio thread that advertises this peer over mDNS and says hello.

    ``get_hello`` and ``on_hello(peer_id, payload)`` are called from the trio thread, so both
    must be thread-safe (the daemon hands ``on_hello`` over with ``loop.call_soon_threadsafe``)
    and quick (they block the host while they run). ``payload`` is untrusted bytes of at most
    ``max_hello_bytes``; ``peer_id`` is the one the libp2p security handshake authenticated.
    """

    def __init__(
        self,
        identity: Identity,
        run_id: str,
        listen_maddr: str,
        get_hello: Callable[[], bytes],
        on_hello: Callable[[str, bytes], None],
        use_mdns: bool = True,
        max_hello_bytes: int = 16384,
    ) -> None:
        if max_hello_bytes <= 0:
            raise ValueError(f"max_hello_bytes must be positive, got {max_hello_bytes}")
        try:
            self._listen = multiaddr.Multiaddr(listen_maddr)
        except Exception as e:
            raise LanDiscoveryError(
                f"LAN listen address {listen_maddr!r} is not a multiaddr ({e}); use e.g. /ip4/0.0.0.0/tcp/0"
            ) from None
        self._identity = identity
        self._service_type = mdns_service_type(run_id)
        self._use_mdns = use_mdns

        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._stop_requested = threading.Event()
        self._start_error: BaseException | None = None
        self._listen_maddrs: list[str] = []
        # Set and used only in the trio thread, except the token (thread-safe by design).
        self._token: trio.lowlevel.TrioToken | None = None
        self._run_scope = trio.CancelScope()
        self._greeter = Greeter(identity.peer_id, get_hello, on_hello, max_hello_bytes, self._stop_requested)
        self._stop_budget_s = 2.0

    @property
    def listen_maddrs(self) -> list[str]:
        """Dialable addresses of the host, each ending in ``/p2p/<peer id>``."""
        return list(self._listen_maddrs)

    def start(self, timeout: float = 15.0) -> None:
        """Start the trio thread; return once the host listens (and mDNS is registered)."""
        if self._thread is not None:
            raise LanDiscoveryError("LAN discovery is already started; create a new LanDiscovery to restart")
        # A daemon thread: should stop() ever have to abandon a wedged host, it must not keep
        # the process alive at exit.
        self._thread = threading.Thread(target=self._thread_main, name="swarmd-lan", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            self.stop()
            raise LanDiscoveryError(
                f"LAN discovery failed to start in {timeout:.1f} seconds on {self._listen}; "
                "check that the address is local and the port free"
            )
        if self._start_error is not None:
            self.stop()
            raise LanDiscoveryError(
                f"LAN discovery failed to start on {self._listen}: {self._start_error}"
            ) from self._start_error

    def stop(self, timeout: float = 5.0) -> None:
        """Unregister from mDNS, close the host and join the thread; returns within ``timeout``."""
        thread = self._thread
        if thread is None:
            return
        if threading.current_thread() is thread:
            raise LanDiscoveryError("LanDiscovery.stop() called from its own thread (in a callback)")
        deadline = time.monotonic() + timeout
        # The mDNS goodbye gets part of the time; closing the host the rest.
        self._stop_budget_s = max(0.1, timeout * 0.5)
        # Both the flag and the token are written before the other is read (here and in
        # _main), so one side always sees the other: the scope is cancelled exactly when due.
        self._stop_requested.set()
        token = self._token
        if token is not None:
            with contextlib.suppress(trio.RunFinishedError):
                token.run_sync_soon(self._run_scope.cancel)
        thread.join(max(0.0, deadline - time.monotonic()))
        if thread.is_alive():
            logger.warning("LAN discovery thread did not stop in %.1f s; abandoning it", timeout)

    def hello_peer(self, maddr: str, timeout: float = 5.0) -> None:
        """Connect to ``maddr`` (``/ip4/…/tcp/…/p2p/<id>``) and run the hello exchange.

        Safe from any thread but the trio one; raises ``LanDiscoveryError`` on failure.
        """
        token = self._token
        if token is None or not self._ready.is_set() or self._stop_requested.is_set():
            raise LanDiscoveryError("LAN discovery is not running; call start() first")
        if threading.current_thread() is self._thread:
            raise LanDiscoveryError("LanDiscovery.hello_peer() called from its own thread (in a callback)")
        try:
            info = info_from_p2p_addr(multiaddr.Multiaddr(maddr))
        except Exception as e:
            raise LanDiscoveryError(
                f"{maddr!r} is not a peer multiaddr like /ip4/10.0.0.2/tcp/4001/p2p/12D3KooW… ({e})"
            ) from None
        try:
            trio.from_thread.run(self._greeter.hello, info.peer_id, info.addrs, timeout, trio_token=token)
        except (trio.RunFinishedError, trio.Cancelled):
            raise LanDiscoveryError(f"LAN discovery stopped during the hello to {info.peer_id}") from None

    # --- the trio thread -------------------------------------------------------------------

    def _thread_main(self) -> None:
        try:
            trio.run(self._main)
        except BaseException as e:  # noqa: BLE001 - the thread must never die silently
            cause = _root_cause(e)
            if self._ready.is_set():
                logger.warning("LAN discovery stopped on an error: %r", cause)
            else:
                self._start_error = cause
        finally:
            self._ready.set()  # wakes start() however the thread ended

    async def _main(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        if self._stop_requested.is_set():
            return
        host = new_host(key_pair=create_new_key_pair(self._identity.seed), listen_addrs=[self._listen])
        # Same key as the DHT and our signed records: a hello's authenticated sender is the peer
        # whose records it carries.
        assert str(host.get_id()) == self._identity.peer_id, "py-libp2p derived another peer ID"
        host.set_stream_handler(HELLO_PROTOCOL, self._greeter.answer)
        async with host.run(listen_addrs=[self._listen]):
            self._greeter.host = host
            if not host.get_transport_addrs():
                # py-libp2p logs a failed listen and carries on; without this we would run deaf.
                raise LanDiscoveryError(
                    f"could not listen on {self._listen}; check that the address is local and the port free"
                )
            advertised = advertised_addrs(host.get_transport_addrs())
            self._listen_maddrs = [f"{a}/p2p/{self._identity.peer_id}" for a in advertised]
            mdns: MdnsService | None = None
            try:
                with self._run_scope:
                    if self._use_mdns:
                        # zeroconf's sync API blocks (registration sends 3 announcements), so it
                        # runs in a worker thread rather than stalling the host.
                        mdns = await trio.to_thread.run_sync(self._start_mdns, host, advertised)
                    async with trio.open_nursery() as nursery:
                        self._greeter.open(nursery)
                        logger.info(
                            "LAN discovery listening on %s (mDNS %s)",
                            ", ".join(self._listen_maddrs),
                            self._service_type if mdns else "off",
                        )
                        self._ready.set()
                        await trio.sleep_forever()
            finally:
                self._greeter.close()
                if mdns is not None:
                    with trio.move_on_after(self._stop_budget_s) as scope:
                        await trio.to_thread.run_sync(mdns.close, abandon_on_cancel=True)  # type: ignore[call-arg]
                    if scope.cancelled_caught:
                        logger.warning("mDNS did not unregister in %.1f s; leaving it", self._stop_budget_s)

    def _start_mdns(self, host: IHost, advertised: list[multiaddr.Multiaddr]) -> MdnsService:
        token = self._token
        assert token is not None

        # Called from zeroconf's browser thread: hop into the trio thread without blocking.
        def found(peer_id: ID) -> None:
            with contextlib.suppress(trio.RunFinishedError):
                token.run_sync_soon(self._greeter.found, peer_id)

        def gone(peer_id: ID) -> None:
            with contextlib.suppress(trio.RunFinishedError):
                token.run_sync_soon(self._greeter.gone, peer_id)

        return MdnsService(host, self._service_type, advertised, found, gone)


def _root_cause(error: BaseException) -> BaseException:
    """The one error inside trio's nested exception groups, for a message a user can read."""
    while isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
        error = error.exceptions[0]
    return error
