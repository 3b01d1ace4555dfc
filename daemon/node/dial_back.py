"""Reachability from outside: a peer dials this one back (``swarmd doctor``).

Whether the swarm can open a connection to this daemon decides whether it needs a relay; only
another machine can tell. ``swarmd doctor`` asks the running daemon, which asks a few members
(``DialBack``); each opens a fresh TCP connection to the addresses our signed heartbeat
announces and checks that a libp2p host answers there (the multistream-select greeting, the
first thing a libp2p listener says). A connection the peers already hold (perhaps through a
relay) proves nothing, so the check never reuses one.

Left unbounded this is a port scanner: any member (and keys are free) announces addresses and
has every volunteer knock on them, loopback and the LAN included. So a member is dialled back
only where it already is, and only where the internet is:

- **Only the seen host.** We dial an address of the member's heartbeat (never one from the
  request) only when its host is the host the member's request came from: the remote address of
  its libp2p stream, which the transport authenticated (``RpcServer.seen_at``; a TCP peer cannot
  be seen at a host it does not hold). The seen port is the member's ephemeral one, so the ports
  are its announced ones, at most ``MAX_DIAL_ADDRS``, TCP only. A member can thus have us knock
  only on its own host (or the NAT it sits behind), never on a third party. A request that came
  through a relay (``p2p-circuit``) or from a host we do not know is answered, and nothing dialled.
- **Only public hosts.** The host must be global (``scope`` is ``public``): never loopback,
  link-local (169.254.169.254, the cloud metadata service, among them), private (RFC 1918,
  100.64/10 CGNAT, unique-local), unspecified, multicast, reserved or documentation. IPv6 forms
  that carry an IPv4 address (IPv4-mapped, NAT64 64:ff9b::/96 and 64:ff9b:1::/48, 6to4 2002::/16,
  Teredo) are classified by the address they carry (``::ffff:127.0.0.1`` is loopback), and are
  never dialled at all: they lead to a translator or to the IPv4 stack, not to the host compared,
  and an honest peer is seen at its own address (a seen IPv4-mapped host counts as its IPv4).
- **Unless the run is explicitly local.** When every address this daemon listens on
  (``[swarm] host_maddrs``) is an explicit non-public IP (127.0.0.1 in tests and ``swarmd demo``,
  a LAN or VPN address), nobody off those networks can reach it, and the seen host can only be
  on them: hosts of the scopes we listen in are dialled too, still only the seen one. The default
  ``0.0.0.0`` (and ``::``) is not explicit: it takes the internet's connections, so a LAN or
  loopback host is never dialled for them.
- **Rarely.** One dial-back a sender every ``PER_SENDER_INTERVAL_S`` (refused OVER_QUOTA), and
  one a target host every ``PER_HOST_INTERVAL_S`` whichever member asks (answered "not dialled"),
  so that 500 keys on one host get it knocked on once. Both memories are bounded and fail closed:
  full of entries still in force, they refuse (BUSY) rather than forget one.

The answer says only, per address, whether a libp2p host answered, or why it was not dialled.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from ipaddress import IPv4Address, IPv6Address
from typing import Any, Literal

from swarmd.peers.wire.errors import Busy, OverQuota
from swarmd.peers.wire.messages import MAX_DIAL_ADDRS, DialBack, DialedBack
from swarmd.peers.wire.rpc import call

logger = logging.getLogger(__name__)

DIAL_TIMEOUT_S = 3.0
"""Each connection and its greeting, at most."""
PER_SENDER_INTERVAL_S = 30.0
"""A sender is dialled back at most once in this long."""
PER_HOST_INTERVAL_S = 30.0
"""A target host is dialled at most once in this long, whichever members ask."""
MAX_REMEMBERED = 1024
"""Senders, and target hosts, remembered for their interval (each; beyond it, refused BUSY)."""
ASK_PEERS = 3
"""Members asked to dial us back at once."""
ASK_TIMEOUT_S = 15.0
MULTISTREAM = b"/multistream/1.0.0\n"
"""The greeting both ends of a libp2p connection send first (length-prefixed by one varint byte)."""

Scope = Literal["public", "private", "link-local", "loopback", "special"]
"""``special``: unspecified, multicast, reserved, documentation and other non-global ranges."""
PUBLIC: frozenset[Scope] = frozenset({"public"})
"""What any run dials back (module doc)."""
IP = IPv4Address | IPv6Address
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_NAT64_LOCAL = ipaddress.ip_network("64:ff9b:1::/48")
_PRIVATE = [
    ipaddress.ip_network(n)
    for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "fc00::/7", "fec0::/10")
]
_DOCUMENTATION = [
    ipaddress.ip_network(n) for n in ("192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24", "2001:db8::/32", "3fff::/20")
]


def tcp_target(maddr: str) -> tuple[str, int] | None:
    """``/ip4/H/tcp/P[/p2p/ID]`` (or ip6) as (H, P); None for other transports and relayed addresses."""
    parts = maddr.split("/")
    if "p2p-circuit" in parts or len(parts) < 5 or parts[0] != "":
        return None
    if parts[1] not in ("ip4", "ip6") or parts[3] != "tcp" or not parts[4].isdigit():
        return None
    try:
        ipaddress.ip_address(parts[2])
    except ValueError:
        return None
    port = int(parts[4])
    return (parts[2], port) if 0 < port < 65536 else None


def host_of(maddr: str) -> IP | None:
    """The IP of ``/ip4/H/...`` or ``/ip6/H/...`` over any transport, an IPv4-mapped one as its
    IPv4; None for a relayed address (the host there is the relay's) or a name."""
    parts = maddr.split("/")
    if "p2p-circuit" in parts or len(parts) < 3 or parts[0] != "" or parts[1] not in ("ip4", "ip6"):
        return None
    try:
        ip = ipaddress.ip_address(parts[2])
    except ValueError:
        return None
    return ip.ipv4_mapped or ip if isinstance(ip, IPv6Address) else ip


def embedded_ipv4(ip: IPv6Address) -> IPv4Address | None:
    """The IPv4 address an IPv6 one carries: IPv4-mapped, NAT64 (RFC 6052: the well-known
    64:ff9b::/96 and the local-use 64:ff9b:1::/48), 6to4 (2002::/16) or Teredo (its client)."""
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip in _NAT64:
        return IPv4Address(ip.packed[12:])
    if ip in _NAT64_LOCAL:  # a /48 prefix: the IPv4 address in bytes 6-7 and 9-10, around the u octet
        return IPv4Address(ip.packed[6:8] + ip.packed[9:11])
    if ip.sixtofour is not None:
        return ip.sixtofour
    return ip.teredo[1] if ip.teredo is not None else None


def scope(host: str | IP) -> Scope:
    """Where ``host`` can be reached from: ``public`` (the internet), ``private`` (RFC 1918,
    100.64/10 CGNAT, unique- and site-local IPv6), ``link-local``, ``loopback``, or ``special``
    (module doc). An IPv6 form carrying an IPv4 address has that address's scope."""
    ip = ipaddress.ip_address(host) if isinstance(host, str) else host
    if isinstance(ip, IPv6Address) and (inner := embedded_ipv4(ip)) is not None:
        ip = inner
    if ip.is_loopback:
        return "loopback"
    if ip.is_unspecified or ip.is_multicast or ip.is_reserved or any(ip in n for n in _DOCUMENTATION):
        return "special"
    if ip.is_link_local:
        return "link-local"
    if any(ip in n for n in _PRIVATE):
        return "private"
    return "public" if ip.is_global else "special"


def local_scopes(listen_on: Iterable[str]) -> frozenset[Scope]:
    """The scopes of a run that listens only on explicit non-public IPs (module doc); empty when
    any listen address is public, unspecified (``0.0.0.0``, ``::``), special, relayed or a name."""
    scopes: set[Scope] = set()
    for maddr in listen_on:
        ip = host_of(maddr)
        where = scope(ip) if ip is not None else "special"
        if where in ("public", "special"):
            return frozenset()
        scopes.add(where)
    return frozenset(scopes)


def dial_targets(
    announced: Iterable[str], seen: str | None, allowed: frozenset[Scope] | set[Scope]
) -> tuple[list[tuple[str, str, int]], list[tuple[str, str]]]:
    """Which of ``announced`` may be dialled for a member whose request came from ``seen`` (a
    multiaddr, None when unknown), in scopes ``allowed`` (module doc): up to ``MAX_DIAL_ADDRS``
    (address, host, port) to dial, each host and port once; and, in the room left of that bound,
    the (address, why) of TCP addresses not dialled, for the answer."""
    seen_ip = host_of(seen) if seen is not None else None
    if seen_ip is not None:
        why = ""
    elif seen is not None and "p2p-circuit" in seen.split("/"):
        why = "not dialled: your request came through a relay; only the host you are seen at is dialled"
    else:
        why = "not dialled: the host your request came from is not known here"
    dial: list[tuple[str, str, int]] = []
    skipped: list[tuple[str, str]] = []
    done: set[tuple[IP, int]] = set()
    for maddr in announced:
        target = tcp_target(maddr)
        if target is None or len(dial) == MAX_DIAL_ADDRS:
            continue
        ip, port = ipaddress.ip_address(target[0]), target[1]
        if (ip, port) in done:
            continue
        done.add((ip, port))
        if why:
            skipped.append((maddr, why))
        elif ip != seen_ip:
            skipped.append((maddr, f"not dialled: you are seen at {seen_ip}, not there"))
        elif isinstance(ip, IPv6Address) and embedded_ipv4(ip) is not None:
            skipped.append((maddr, "not dialled: an IPv6 form of an IPv4 address (mapped, NAT64, 6to4, Teredo)"))
        elif (where := scope(ip)) not in allowed:
            skipped.append((maddr, f"not dialled: a {where} address, dialled only in runs that listen on one"))
        else:
            dial.append((maddr, str(ip), port))
    if not dial and not skipped:
        skipped.append((seen or "unknown", why or "not dialled: your heartbeat announces no TCP address"))
    return dial, skipped[: MAX_DIAL_ADDRS - len(dial)]


class RecentDials:
    """When each key (a sender, a host) was last dialled back, for ``interval_s``; at most
    ``limit`` keys, and a full memory refuses rather than forgets."""

    def __init__(self, interval_s: float, limit: int = MAX_REMEMBERED) -> None:
        self.interval_s, self.limit = interval_s, limit
        self._at: OrderedDict[str, float] = OrderedDict()
        """Oldest first: a key is inserted only when absent, with the clock's latest reading."""

    def take(self, key: str, now: float) -> float | None:
        """Record a dial-back of ``key`` at ``now`` and return None; or, when ``key`` had one less
        than ``interval_s`` ago, how long ago (nothing recorded). Raises ``Busy`` when full."""
        while self._at and now - next(iter(self._at.values())) >= self.interval_s:
            self._at.popitem(last=False)
        if (last := self._at.get(key)) is not None:
            return now - last
        if len(self._at) >= self.limit:
            raise Busy(
                f"{self.limit} dial-backs in the last {self.interval_s:.0f} s here, the most remembered; retry later"
            )
        self._at[key] = now
        return None

    def __len__(self) -> int:
        return len(self._at)


async def dial(host: str, port: int, timeout_s: float = DIAL_TIMEOUT_S) -> tuple[bool, str]:
    """Whether a libp2p host answers at ``host:port``, and what happened, in a few words."""
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout_s)
    except TimeoutError:
        return False, f"no connection within {timeout_s:.0f} s (a firewall drops it?)"
    except ConnectionRefusedError:
        return False, "connection refused (nothing listens on that port from outside)"
    except OSError as e:
        return False, f"cannot connect ({e.strerror or type(e).__name__})"
    try:
        writer.write(bytes([len(MULTISTREAM)]) + MULTISTREAM)
        await writer.drain()
        greeting = await asyncio.wait_for(reader.readexactly(1 + len(MULTISTREAM)), timeout_s)
        if greeting[1:] == MULTISTREAM:
            return True, "connected: a libp2p host answered"
        return False, "connected, but what answers is not a libp2p host"
    except (TimeoutError, asyncio.IncompleteReadError, OSError):
        return False, "connected, but no libp2p greeting came back"
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


class DialBackService:
    """Answers ``DialBack`` (module doc) and asks members for it on ``swarmd doctor``'s behalf."""

    def __init__(
        self,
        run_id: str,
        addrs_of: Callable[[str], list[str] | None],
        seen_at: Callable[[str], str | None],
        listen_on: Iterable[str],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``addrs_of(peer)``: the addresses a member's live heartbeat announces (None: no member);
        ``seen_at(peer)``: the remote multiaddr of its latest stream here (``RpcServer.seen_at``);
        ``listen_on``: the addresses this daemon listens on (``[swarm] host_maddrs``)."""
        self.run_id, self.addrs_of, self.seen_at, self.clock = run_id, addrs_of, seen_at, clock
        self.allowed: frozenset[Scope] = PUBLIC | local_scopes(listen_on)
        """The scopes of hosts dialled back: public, and those we listen in when the run is local."""
        self.p2p: Any = None
        self._senders = RecentDials(PER_SENDER_INTERVAL_S)
        self._hosts = RecentDials(PER_HOST_INTERVAL_S)

    async def handle(self, sender: str, request: DialBack, blobs: list[bytes]) -> tuple[DialedBack, list[bytes]]:
        now = self.clock()
        if (ago := self._senders.take(sender, now)) is not None:
            raise OverQuota(f"dialled back {ago:.0f} s ago; one dial-back every {PER_SENDER_INTERVAL_S:.0f} s a peer")
        targets, skipped = dial_targets(self.addrs_of(sender) or [], self.seen_at(sender), self.allowed)
        if targets and (ago := self._hosts.take(targets[0][1], now)) is not None:
            why = f"not dialled: this host was dialled back {ago:.0f} s ago; once every {PER_HOST_INTERVAL_S:.0f} s"
            skipped, targets = [(maddr, why) for maddr, _, _ in targets] + skipped, []
        if targets:
            logger.debug("Dialling %s back at %s", sender, [maddr for maddr, _, _ in targets])
        results = list(await asyncio.gather(*(dial(host, port) for _, host, port in targets)))
        results += [(False, why) for _, why in skipped]
        return (
            DialedBack(
                addrs=[maddr[:256] for maddr in [m for m, _, _ in targets] + [m for m, _ in skipped]],
                reached=[int(ok) for ok, _ in results],
                details=[detail.encode("ascii", "replace").decode()[:120] for _, detail in results],
            ),
            [],
        )

    async def ask(self, peers: list[str]) -> list[dict[str, Any]]:
        """Ask up to ``ASK_PEERS`` of ``peers`` to dial us back: per peer, what each address gave,
        or the error."""
        return list(await asyncio.gather(*(self._ask_one(peer) for peer in peers[:ASK_PEERS])))

    async def _ask_one(self, peer: str) -> dict[str, Any]:
        try:
            answer, _ = await call(self.p2p, peer, DialBack(run_id=self.run_id), timeout_s=ASK_TIMEOUT_S)
        except Exception as e:  # one peer's failure is a line of the report, not the doctor's end
            return {"peer": peer, "error": f"{type(e).__name__}: {e}"[:300]}
        return {
            "peer": peer,
            "addrs": [
                {"addr": a, "reached": bool(r), "detail": d}
                for a, r, d in zip(answer.addrs, answer.reached, answer.details, strict=False)
            ],
        }
