"""Reachability from outside: a peer dials this one back (``swarmd doctor``).

Whether the swarm can open a connection to this daemon decides whether it needs a relay; only
another machine can tell. ``swarmd doctor`` asks the running daemon, which asks a few members
(``DialBack``); each opens a fresh TCP connection to the addresses our signed heartbeat
announces and checks that a libp2p host answers there (the multistream-select greeting, the
first thing a libp2p listener says). A connection the peers already hold (perhaps through a
relay) proves nothing, so the check never reuses one.

What a member can make us do with it is bounded: we dial only the addresses its own heartbeat
announces (never one from the request), at most ``MAX_DIAL_ADDRS`` TCP addresses, no relayed
(``p2p-circuit``) ones, private or loopback ones only when we have an address of that scope
ourselves (so a member cannot use us to probe our LAN from the internet), one dial-back a
sender every ``PER_SENDER_INTERVAL_S``, and the answer says only whether a libp2p host answered.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Any

from swarmd.peers.wire.errors import OverQuota
from swarmd.peers.wire.messages import MAX_DIAL_ADDRS, DialBack, DialedBack
from swarmd.peers.wire.rpc import call

logger = logging.getLogger(__name__)

DIAL_TIMEOUT_S = 3.0
"""Each connection and its greeting, at most."""
PER_SENDER_INTERVAL_S = 30.0
"""A sender is dialled back at most once in this long."""
MAX_SENDERS_REMEMBERED = 1024
ASK_PEERS = 3
"""Members asked to dial us back at once."""
ASK_TIMEOUT_S = 15.0
MULTISTREAM = b"/multistream/1.0.0\n"
"""The greeting both ends of a libp2p connection send first (length-prefixed by one varint byte)."""


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


def scope(host: str) -> str:
    """``loopback``, ``private`` (RFC 1918, link-local, unique-local) or ``public``."""
    ip = ipaddress.ip_address(host)
    if ip.is_loopback:
        return "loopback"
    if ip.is_private or ip.is_link_local or not ip.is_global:
        return "private"
    return "public"


def dial_targets(announced: Iterable[str], own_scopes: set[str]) -> list[tuple[str, str, int]]:
    """The (address, host, port) of ``announced`` this peer may dial: TCP, each host and port once,
    public ones always, a private or loopback one only when we have an address of that scope."""
    seen: set[tuple[str, int]] = set()
    out = []
    for maddr in announced:
        target = tcp_target(maddr)
        if target is None or target in seen:
            continue
        if scope(target[0]) != "public" and scope(target[0]) not in own_scopes:
            continue
        seen.add(target)
        out.append((maddr, *target))
        if len(out) == MAX_DIAL_ADDRS:
            break
    return out


def own_scopes(addrs: Iterable[str]) -> set[str]:
    return {scope(t[0]) for t in map(tcp_target, addrs) if t is not None}


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
        own_addrs: Callable[[], list[str]],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``addrs_of(peer)``: the addresses a member's live heartbeat announces (None: no member);
        ``own_addrs()``: ours, as our heartbeat announces them."""
        self.run_id, self.addrs_of, self.own_addrs, self.clock = run_id, addrs_of, own_addrs, clock
        self.p2p: Any = None
        self._last: OrderedDict[str, float] = OrderedDict()

    async def handle(self, sender: str, request: DialBack, blobs: list[bytes]) -> tuple[DialedBack, list[bytes]]:
        now = self.clock()
        last = self._last.get(sender)
        if last is not None and now - last < PER_SENDER_INTERVAL_S:
            raise OverQuota(
                f"dialled back {now - last:.0f} s ago; one dial-back every {PER_SENDER_INTERVAL_S:.0f} s a peer"
            )
        self._last[sender] = now
        self._last.move_to_end(sender)
        while len(self._last) > MAX_SENDERS_REMEMBERED:
            self._last.popitem(last=False)
        targets = dial_targets(self.addrs_of(sender) or [], own_scopes(self.own_addrs()))
        results = await asyncio.gather(*(dial(host, port) for _, host, port in targets))
        return (
            DialedBack(
                addrs=[maddr for maddr, _, _ in targets],
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
