"""mDNS for LAN discovery: a service type private to the run, and our announcement on it.

Daemons of one run advertise themselves under a service type derived from the run ID, so a
daemon of another run never browses for them. py-libp2p's own mDNS (``new_host(enable_mDNS=True)``)
offers no private service type and reports finds only through a process-wide event, so
:class:`MdnsService` composes its parts (the broadcaster's records, the listener's TXT parsing
and peerstore updates) on a zeroconf of our own, with per-instance callbacks.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
from collections.abc import Callable

import ifaddr
import multiaddr
from libp2p.abc import IHost
from libp2p.discovery.mdns.broadcaster import PeerBroadcaster
from libp2p.discovery.mdns.listener import PeerListener
from libp2p.peer.id import ID
from zeroconf import InterfaceChoice, Zeroconf, service_type_name

logger = logging.getLogger(__name__)

MDNS_TTL_S = 120


def mdns_service_type(run_id: str) -> str:
    """The mDNS service type private to ``run_id``: daemons of other runs never browse for it.

    RFC 6763 (and zeroconf) limit the service label to 15 bytes: ``p2p-`` and 10 hex digits
    of the run ID's SHA-256 make 14.
    """
    fingerprint = hashlib.sha256(run_id.encode()).hexdigest()[:10]
    service_type = f"_p2p-{fingerprint}._udp.local."
    service_type_name(service_type, strict=True)  # raises BadTypeInNameException if too long
    return service_type


class MdnsService:
    """libp2p's mDNS broadcaster and listener on a zeroconf of our own, with per-instance hooks.

    Composing the parts gives a private service type and callbacks of our own, and lets
    zeroconf join multicast only on the interface we listen on. ``found`` and ``gone`` are
    called from zeroconf's browser thread.
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


def advertised_addrs(transport_addrs: list[multiaddr.Multiaddr]) -> list[multiaddr.Multiaddr]:
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
