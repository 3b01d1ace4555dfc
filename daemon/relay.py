"""Relaying on the data path: forwarding for others when elected, routing our own requests.

**Forwarding** (``RelayService``, the ``relay`` RPC method). A relay is elected by the
coordinator and named in the plan (``swarmd.peers.election.elect_relays``). A peer asks it to
pass one request on: ``{"to": <peer>, "inner": "stage", ...}`` with its blobs. The relay
checks that it is a relay of the plan in force, that the target is a live member other than
the two of them, and that the inner method is one it forwards. It then sends the request on
with ``on_behalf_of`` set to the asker (whom libp2p authenticated) and returns the answer as
it came. The target believes ``on_behalf_of`` only from a relay of its own view of the plan
(``swarmd.trainer.Trainer.serve``). A relay can therefore speak for the peers it serves:
relays are elected among the reliable, like parameter servers, who already hold the weights.
Sizes are bounded by the RPC server's message limit; at most ``MAX_FORWARDS`` forwards run at
once, so relaying cannot starve the relay's own serving.

**Routing** (``Router``). Every request of our worker to a stage host goes direct, unless
``swarmd.peers.wire.routing.choose_route`` picks a relay: the direct path failed to open
(remembered with back-off), the measured relay path is clearly faster, or the operator set
``[swarm] data_via_relay = "always"``. A relayed request whose relay cannot be reached falls
back to the direct path, and a direct one that cannot open falls over to a relay.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from swarmd.errors import SwarmdError
from swarmd.peers.wire.routing import DirectPaths, Matrix, choose_route
from swarmd.peers.wire.rpc import DEFAULT_TIMEOUT_S, Answer, Unreachable, call

RELAY_METHOD = "relay"
FORWARDABLE = frozenset({"stage"})
"""Inner methods a relay passes on: the worker's requests to stage hosts. Replication, probes
and control traffic go direct: a relay must not distort what a probe measures."""
MAX_FORWARDS = 16
MAX_PEER_ID_CHARS = 128
RELAY_FIELDS = ("method", "to", "inner")


@dataclass
class RelayCounters:
    forwarded: int = 0
    forwarded_bytes: int = 0
    refused: int = 0
    failed: int = 0
    """Forwards the target did not answer, or refused (its refusal goes back to the asker)."""


@dataclass
class RouteCounters:
    direct: int = 0
    relayed: int = 0
    direct_unreachable: int = 0
    """Direct dials that did not open (the peer is then avoided for a while)."""
    relay_unreachable: int = 0


def _peer_field(header: dict[str, Any], name: str) -> str:
    value = header.get(name)
    if not isinstance(value, str) or not 0 < len(value) <= MAX_PEER_ID_CHARS:
        raise SwarmdError(f"relay request: {name} must be a peer ID of at most {MAX_PEER_ID_CHARS} characters")
    return value


def speaker_of(sender: str, header: dict[str, Any], is_relay: Callable[[str], bool]) -> str:
    """For whom a request speaks: ``sender`` (authenticated by libp2p), or the peer a relay of
    the plan in force names in ``on_behalf_of``; anyone else naming one is refused."""
    proxied = header.get("on_behalf_of")
    if proxied is None:
        return sender
    if not is_relay(sender):
        raise SwarmdError(f"{sender} is not a relay of the plan in force; it may not speak for another peer")
    if not isinstance(proxied, str) or not 0 < len(proxied) <= MAX_PEER_ID_CHARS:
        raise SwarmdError(f"on_behalf_of must be a peer ID of at most {MAX_PEER_ID_CHARS} characters")
    return proxied


class RelayService:
    def __init__(
        self, own: str, is_relay: Callable[[str], bool], is_member: Callable[[str], bool],
        timeout_s: float = DEFAULT_TIMEOUT_S, max_forwards: int = MAX_FORWARDS,
    ) -> None:  # fmt: skip
        self.own, self.is_relay, self.is_member, self.timeout_s = own, is_relay, is_member, timeout_s
        self.p2p: Any = None  # set once the data path is up
        self.counters = RelayCounters()
        self._slots = asyncio.Semaphore(max_forwards)

    async def handle(self, sender: str, header: dict[str, Any], blobs: list[bytes]) -> Answer:
        try:
            target, inner = self._check(sender, header)
        except SwarmdError:
            self.counters.refused += 1
            raise
        if self._slots.locked():
            self.counters.refused += 1
            raise SwarmdError(f"relay busy: {MAX_FORWARDS} forwards in flight; retry later or go direct")
        forwarded = {k: v for k, v in header.items() if k not in RELAY_FIELDS}
        forwarded["on_behalf_of"] = sender
        async with self._slots:
            try:
                answer, out = await call(self.p2p, target, inner, forwarded, blobs, timeout_s=self.timeout_s)
            except SwarmdError:
                self.counters.failed += 1
                raise
        self.counters.forwarded += 1
        self.counters.forwarded_bytes += sum(len(b) for b in blobs) + sum(len(b) for b in out)
        return answer, out

    def _check(self, sender: str, header: dict[str, Any]) -> tuple[str, str]:
        if self.p2p is None:
            raise SwarmdError("relay: the data path is not up yet; retry later")
        if not self.is_relay(self.own):
            raise SwarmdError("this peer is not a relay of the plan in force; use one the plan names")
        if "on_behalf_of" in header:
            raise SwarmdError("relay request already carries on_behalf_of: a request is relayed once")
        target = _peer_field(header, "to")
        inner = header.get("inner")
        if inner not in FORWARDABLE:
            raise SwarmdError(f"relay does not forward method {str(inner)[:40]!r}; it forwards {sorted(FORWARDABLE)}")
        if target in (self.own, sender):
            raise SwarmdError(f"relay target {target} is the relay or the asker itself; send it direct")
        if not self.is_member(target):
            raise SwarmdError(f"relay target {target} is not a live member of this run")
        return target, inner

    def status(self) -> dict[str, Any]:
        return {"relay": self.is_relay(self.own), **asdict(self.counters)}


class Router:
    """Sends our requests direct or through a relay (module doc)."""

    def __init__(
        self, own: str, relays: Callable[[], Sequence[str]], matrix: Callable[[], Matrix | None], mode: str = "auto"
    ) -> None:
        self.own, self.relays, self.matrix, self.mode = own, relays, matrix, mode
        self.paths = DirectPaths()
        self.counters = RouteCounters()

    async def call(
        self, p2p: Any, peer: str, method: str, header: dict[str, Any], blobs: list[bytes], timeout_s: float
    ) -> Answer:
        nbytes = sum(len(b) for b in blobs)
        blocked = self.paths.blocked(peer, time.monotonic())
        via = choose_route(self.own, peer, self.relays(), self.matrix(), nbytes, direct_blocked=blocked, mode=self.mode)
        if via is not None:
            try:
                return await self._relayed(p2p, via, peer, method, header, blobs, timeout_s)
            except Unreachable:
                self.counters.relay_unreachable += 1  # the relay itself: try the direct path
        try:
            answer = await call(p2p, peer, method, header, blobs, timeout_s=timeout_s)
        except Unreachable:
            self.counters.direct_unreachable += 1
            self.paths.failed(peer, time.monotonic())
            fallback = None
            if via is None and self.mode != "never":
                fallback = choose_route(
                    self.own, peer, self.relays(), self.matrix(), nbytes, direct_blocked=True, mode=self.mode
                )
            if fallback is None:
                raise
            return await self._relayed(p2p, fallback, peer, method, header, blobs, timeout_s)
        self.paths.succeeded(peer)
        self.counters.direct += 1
        return answer

    async def _relayed(
        self, p2p: Any, relay: str, peer: str, method: str, header: dict[str, Any], blobs: list[bytes],
        timeout_s: float,
    ) -> Answer:  # fmt: skip
        answer = await call(p2p, relay, RELAY_METHOD, {**header, "to": peer, "inner": method}, blobs,
                            timeout_s=timeout_s)  # fmt: skip
        self.counters.relayed += 1
        return answer

    def status(self) -> dict[str, Any]:
        return {"mode": self.mode, "relays": list(self.relays()), **asdict(self.counters),
                "direct_blocked_peers": self.paths.count(time.monotonic())}  # fmt: skip
