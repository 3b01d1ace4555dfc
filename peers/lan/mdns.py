"""LAN discovery: find peers of the same run on the local network with py-libp2p's mDNS.

The hivemind DHT is the source of truth for membership; this module only shortens the way in.
A daemon on a LAN with no bootstrap address advertises itself over mDNS under a service type
private to its run, and whenever it finds a peer it opens a libp2p stream on
``/swarmd/hello/1.0.0`` and reads that peer's hello (an opaque, size-bounded payload: the
daemon's signed record with the run ID and its DHT addresses). The daemon validates the
payload and dials the DHT addresses in it.

py-libp2p runs on trio and the daemon on asyncio, so the libp2p host lives in a thread of its
own under ``trio.run``. The public methods are synchronous and safe to call from any other
thread; the callbacks (``get_hello``, ``on_hello``) are called from the trio thread.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import secrets
import threading
import time
from collections.abc import Callable

import ifaddr
import multiaddr
import trio
from libp2p import new_host
from libp2p.abc import IHost, INetStream
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.custom_types import TProtocol
from libp2p.discovery.mdns.broadcaster import PeerBroadcaster
from libp2p.discovery.mdns.listener import PeerListener
from libp2p.io.exceptions import MessageTooLarge
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo, info_from_p2p_addr
from libp2p.utils.varint import encode_varint_prefixed, read_varint_prefixed_bytes_limited
from zeroconf import InterfaceChoice, Zeroconf, service_type_name

from swarmd.errors import SwarmdError
from swarmd.peers.records.identity import Identity

logger = logging.getLogger(__name__)

HELLO_PROTOCOL = TProtocol("/swarmd/hello/1.0.0")
# A peer is hello'd at most once per interval: mDNS re-announces and inbound hellos both ask
# for one, and a hostile peer opening streams must not make us dial it in a loop.
REHELLO_INTERVAL_S = 60.0
HELLO_TIMEOUT_S = 5.0
RETRY_BASE_S = 1.0
RETRY_CAP_S = 30.0
MAX_HELLO_ATTEMPTS = 6
MAX_CONCURRENT_HELLOS = 16
# Forget old hello times past this many peers so a busy LAN cannot grow the table forever.
MAX_REMEMBERED_PEERS = 4096
MDNS_TTL_S = 120


class LanDiscoveryError(SwarmdError):
    """The LAN discovery host failed to start, or a hello exchange failed."""


def mdns_service_type(run_id: str) -> str:
    """The mDNS service type private to ``run_id``: daemons of other runs never browse for it.

    RFC 6763 (and zeroconf) limit the service label to 15 bytes: ``p2p-`` and 10 hex digits
    of the run ID's SHA-256 make 14.
    """
    fingerprint = hashlib.sha256(run_id.encode()).hexdigest()[:10]
    service_type = f"_p2p-{fingerprint}._udp.local."
    service_type_name(service_type, strict=True)  # raises BadTypeInNameException if too long
    return service_type


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
        self._get_hello = get_hello
        self._on_hello = on_hello
        self._use_mdns = use_mdns
        self._max_hello_bytes = max_hello_bytes

        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._stop_requested = threading.Event()
        self._start_error: BaseException | None = None
        self._listen_maddrs: list[str] = []
        # Set and used only in the trio thread, except the token (thread-safe by design).
        self._token: trio.lowlevel.TrioToken | None = None
        self._run_scope = trio.CancelScope()
        self._host: IHost | None = None
        self._nursery: trio.Nursery | None = None
        self._hello_slots = trio.Semaphore(MAX_CONCURRENT_HELLOS)
        self._last_hello: dict[ID, float] = {}
        self._inflight: set[ID] = set()
        # Peers found (by mDNS or an inbound hello) before the hello nursery opened: mDNS answers
        # from zeroconf's cache at once, and the host accepts streams as soon as it listens.
        self._pending: dict[ID, bool] = {}
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
            trio.from_thread.run(self._hello, info.peer_id, info.addrs, timeout, trio_token=token)
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
        host.set_stream_handler(HELLO_PROTOCOL, self._handle_hello_stream)
        async with host.run(listen_addrs=[self._listen]):
            self._host = host
            if not host.get_transport_addrs():
                # py-libp2p logs a failed listen and carries on; without this we would run deaf.
                raise LanDiscoveryError(
                    f"could not listen on {self._listen}; check that the address is local and the port free"
                )
            advertised = _advertised_addrs(host.get_transport_addrs())
            self._listen_maddrs = [f"{a}/p2p/{self._identity.peer_id}" for a in advertised]
            mdns: _Mdns | None = None
            try:
                with self._run_scope:
                    if self._use_mdns:
                        # zeroconf's sync API blocks (registration sends 3 announcements), so it
                        # runs in a worker thread rather than stalling the host.
                        mdns = await trio.to_thread.run_sync(self._start_mdns, host, advertised)
                    async with trio.open_nursery() as nursery:
                        self._nursery = nursery
                        pending, self._pending = self._pending, {}
                        for peer_id, from_mdns in pending.items():
                            self._maybe_spawn_hello(peer_id, from_mdns=from_mdns)
                        logger.info(
                            "LAN discovery listening on %s (mDNS %s)",
                            ", ".join(self._listen_maddrs),
                            self._service_type if mdns else "off",
                        )
                        self._ready.set()
                        await trio.sleep_forever()
            finally:
                self._nursery = None
                if mdns is not None:
                    with trio.move_on_after(self._stop_budget_s) as scope:
                        await trio.to_thread.run_sync(mdns.close, abandon_on_cancel=True)  # type: ignore[call-arg]
                    if scope.cancelled_caught:
                        logger.warning("mDNS did not unregister in %.1f s; leaving it", self._stop_budget_s)

    def _start_mdns(self, host: IHost, advertised: list[multiaddr.Multiaddr]) -> _Mdns:
        token = self._token
        assert token is not None

        # Called from zeroconf's browser thread: hop into the trio thread without blocking.
        def found(peer_id: ID) -> None:
            with contextlib.suppress(trio.RunFinishedError):
                token.run_sync_soon(self._on_found, peer_id)

        def gone(peer_id: ID) -> None:
            with contextlib.suppress(trio.RunFinishedError):
                token.run_sync_soon(self._on_gone, peer_id)

        return _Mdns(host, self._service_type, advertised, found, gone)

    def _on_found(self, peer_id: ID, from_mdns: bool = True) -> None:
        # Never raises: a run_sync_soon callback that raises crashes the whole trio run.
        try:
            self._maybe_spawn_hello(peer_id, from_mdns=from_mdns)
        except Exception as e:
            logger.warning("Could not schedule a hello to LAN peer %s: %r", peer_id, e)

    def _on_gone(self, peer_id: ID) -> None:
        # An mDNS goodbye: the peer stopped, so a restart of it deserves an immediate hello.
        if self._last_hello.pop(peer_id, None) is not None:
            logger.info("LAN peer %s left (mDNS goodbye)", peer_id)

    def _maybe_spawn_hello(self, peer_id: ID, *, from_mdns: bool) -> None:
        if str(peer_id) == self._identity.peer_id:
            return
        nursery = self._nursery
        if nursery is None:
            if not self._stop_requested.is_set() and len(self._pending) < MAX_CONCURRENT_HELLOS * 16:
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
                addrs = self._host.get_peerstore().addrs(peer_id) if self._host is not None else []
                try:
                    async with self._hello_slots:
                        await self._hello(peer_id, addrs, HELLO_TIMEOUT_S)
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

    async def _hello(self, peer_id: ID, addrs: list[multiaddr.Multiaddr], timeout: float) -> None:
        """Read ``peer_id``'s hello and hand it to ``on_hello``; LanDiscoveryError on failure."""
        host = self._host
        if host is None:
            raise LanDiscoveryError("LAN discovery host is not running")
        payload = b""
        remote = peer_id
        with trio.move_on_after(timeout) as scope:
            try:
                if addrs:
                    await host.connect(PeerInfo(peer_id, addrs))
                stream = await host.new_stream(peer_id, [HELLO_PROTOCOL])
                remote = stream.muxed_conn.peer_id
                try:
                    payload = await read_varint_prefixed_bytes_limited(stream, self._max_hello_bytes)
                except BaseException:
                    with contextlib.suppress(Exception):
                        await stream.reset()  # tells the peer at once that we gave up
                    raise
                await stream.close()
            except MessageTooLarge as e:
                raise LanDiscoveryError(
                    f"hello from {peer_id} rejected: {e} (max_hello_bytes={self._max_hello_bytes})"
                ) from None
            except LanDiscoveryError:
                raise
            except Exception as e:
                raise LanDiscoveryError(f"hello to {peer_id} failed: {e!r}") from None
        if scope.cancelled_caught:
            raise LanDiscoveryError(f"hello to {peer_id} timed out after {timeout:.1f} s")
        if remote != peer_id:
            raise LanDiscoveryError(f"dialled {peer_id} but the handshake authenticated {remote}")
        first = peer_id not in self._last_hello
        self._last_hello[peer_id] = time.monotonic()
        logger.log(logging.INFO if first else logging.DEBUG, "LAN peer %s said hello", peer_id)
        try:
            self._on_hello(str(peer_id), payload)
        except Exception as e:
            logger.warning("on_hello raised for LAN peer %s: %r", peer_id, e)

    async def _handle_hello_stream(self, stream: INetStream) -> None:
        remote = stream.muxed_conn.peer_id
        try:
            payload = self._get_hello()
            if len(payload) > self._max_hello_bytes:
                # Peers of the same run use the same bound and would reject it anyway.
                logger.warning(
                    "Own hello is %d bytes, over max_hello_bytes=%d; not sending it",
                    len(payload),
                    self._max_hello_bytes,
                )
                await stream.reset()
                return
            with trio.move_on_after(HELLO_TIMEOUT_S):
                await stream.write(encode_varint_prefixed(payload))
                await stream.close()
        except Exception as e:
            logger.warning("Answering the hello of LAN peer %s failed: %r", remote, e)
            with contextlib.suppress(Exception):
                await stream.reset()
            return
        # The peer now knows us; learn of it too (unless we did so recently).
        self._on_found(remote, from_mdns=False)


class _Mdns:
    """libp2p's mDNS broadcaster and listener on a zeroconf of our own, with per-instance hooks.

    ``new_host(enable_mDNS=True)`` offers no private service type, and libp2p reports finds only
    through a process-wide event (``peerDiscovery``); composing the parts gives both, and lets
    zeroconf join multicast only on the interface we listen on.
    """

    def __init__(
        self,
        host: IHost,
        service_type: str,
        advertised: list[multiaddr.Multiaddr],
        found: Callable[[ID], None],
        gone: Callable[[ID], None],
    ) -> None:
        ips = _ipv4s(advertised)
        specific = [ip for ip in ips if ip != "0.0.0.0"]
        # A daemon that listens on one address should not announce itself on every interface.
        self.zeroconf = Zeroconf(interfaces=specific or InterfaceChoice.All)
        try:
            tcp_port = int(advertised[0].value_for_protocol("tcp")) if advertised else 0
            self.broadcaster = _Broadcaster(
                ips=specific or ["127.0.0.1"],
                zeroconf=self.zeroconf,
                service_type=service_type,
                service_name=f"{secrets.token_hex(24)}.{service_type}",
                peer_id=str(host.get_id()),
                port=tcp_port,
                listen_addrs=[str(a) for a in advertised],
            )
            assert self.broadcaster.service_info is not None
            # Called directly: PeerBroadcaster.register() logs and swallows failures.
            self.zeroconf.register_service(self.broadcaster.service_info)
            self.listener = _Listener(
                found=found,
                gone=gone,
                peerstore=host.get_peerstore(),
                zeroconf=self.zeroconf,
                service_type=service_type,
                service_name=self.broadcaster.service_name,
                ttl=MDNS_TTL_S,
            )
        except BaseException:
            self.zeroconf.close()
            raise

    def close(self) -> None:
        self.broadcaster.unregister()  # the goodbye tells peers at once, not after the TTL
        self.listener.stop()
        self.zeroconf.close()


class _Broadcaster(PeerBroadcaster):
    def __init__(self, *, ips: list[str], **kwargs: object) -> None:
        self._ips = ips  # before super().__init__, which builds the records
        super().__init__(**kwargs)  # type: ignore[arg-type]

    def _get_local_ips(self) -> list[str]:
        # libp2p picks "the" local IP by routing towards 8.8.8.8; with no default route (an
        # isolated LAN, a network namespace) that yields 127.0.0.1 for the A record.
        return list(self._ips)


class _Listener(PeerListener):
    """libp2p's listener (TXT dnsaddr parsing, peerstore updates) plus callbacks."""

    def __init__(self, *, found: Callable[[ID], None], gone: Callable[[ID], None], **kwargs: object) -> None:
        # Set first: the browser that super().__init__ starts may call back at once.
        self._found = found
        self._gone = gone
        super().__init__(**kwargs)  # type: ignore[arg-type]

    def add_service(self, zc: Zeroconf, type_: str, name: str) -> None:
        super().add_service(zc, type_, name)
        self._notify(self._found, name)

    def update_service(self, zc: Zeroconf, type_: str, name: str) -> None:
        super().update_service(zc, type_, name)
        self._notify(self._found, name)

    def remove_service(self, zc: Zeroconf, type_: str, name: str) -> None:
        entry = self.discovered_services.get(name)
        super().remove_service(zc, type_, name)
        if entry is not None:
            self._call(self._gone, entry[0], name)

    def _notify(self, callback: Callable[[ID], None], name: str) -> None:
        entry = self.discovered_services.get(name)  # set by super() only for a valid peer record
        if entry is not None:
            self._call(callback, entry[0], name)

    @staticmethod
    def _call(callback: Callable[[ID], None], peer_id: ID, name: str) -> None:
        try:
            callback(peer_id)
        except Exception as e:  # an exception here would end zeroconf's browser thread
            logger.warning("mDNS discovery callback failed for %s: %r", name, e)


def _ipv4s(addrs: list[multiaddr.Multiaddr]) -> list[str]:
    ips = []
    for addr in addrs:
        try:
            ips.append(addr.value_for_protocol("ip4"))
        except Exception:
            continue  # not an IPv4 address
    return ips


def _advertised_addrs(transport_addrs: list[multiaddr.Multiaddr]) -> list[multiaddr.Multiaddr]:
    """The transport addresses with 0.0.0.0 expanded: peers cannot dial a wildcard."""
    out: list[multiaddr.Multiaddr] = []
    for addr in transport_addrs:
        if _ipv4s([addr]) != ["0.0.0.0"]:
            out.append(addr)
            continue
        rest = str(addr).removeprefix("/ip4/0.0.0.0")
        ips = [
            str(ip.ip)
            for adapter in ifaddr.get_adapters()
            for ip in adapter.ips
            if ip.is_IPv4 and not str(ip.ip).startswith("127.")
        ]
        out.extend(multiaddr.Multiaddr(f"/ip4/{ip}{rest}") for ip in (ips or ["127.0.0.1"]))
    return out


def _root_cause(error: BaseException) -> BaseException:
    """The one error inside trio's nested exception groups, for a message a user can read."""
    while isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
        error = error.exceptions[0]
    return error
