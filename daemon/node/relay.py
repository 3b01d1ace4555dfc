"""Relaying on the data path: forwarding for others when elected, routing our own requests.

**Forwarding** (``RelayService``, the ``Forward`` request). A relay is elected by the
coordinator and named in the plan (``swarmd.peers.membership.election.elect_relays``). A peer asks it to
pass one request on: ``Forward(to, header)`` with the inner request's header (JSON) and its
blobs. The relay checks that it is a relay of the plan in force, that the target is a live
member other than the two of them, and that the inner request is one relays carry
(``Request.RELAYABLE``: the data path's tensors and task records) and fits its schema, so that
garbage stops here. It sends it on as ``Relayed(on_behalf_of=asker)`` (the asker is whom
libp2p authenticated) and returns the target's answer as it came, ok or refused, in a
``Forwarded``. The target's RPC server believes ``on_behalf_of`` only from a relay of its own
view of the plan (``swarmd.peers.wire.rpc``). A relay can therefore speak for the peers it
serves: relays are elected among the reliable, like parameter servers, who already hold the
weights. At most ``MAX_FORWARDS`` forwards run at once, so relaying cannot starve the relay's
own serving.

**Routing** (``Router``). Every request of ours to another cell or a shard goes direct, unless
``swarmd.peers.wire.routing.choose_route`` picks a relay: the direct path failed to open
(remembered with back-off), the measured relay path is clearly faster (only for the requests
that ask it, ``Request.RELAY_FOR_SPEED``: a pipeline link's tensors), or the operator set
``[swarm] data_via_relay = "always"``. A relayed request whose relay cannot be reached falls
back to the direct path, and a direct one that cannot open falls over to a relay. Either way
the caller gets the target's typed answer, or the target's refusal as its own exception (a
refusal by the relay itself names the relay).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

from swarmd.peers.wire import rpc
from swarmd.peers.wire.errors import (
    BadRequest,
    Busy,
    NotMember,
    NotRelay,
    ProtocolViolation,
    RpcError,
    TooLarge,
    Unavailable,
    Unreachable,
)
from swarmd.peers.wire.messages import MAX_FORWARDED_CHARS, Forward, Forwarded, Relayed
from swarmd.peers.wire.protocol import Answer, Request, request_type
from swarmd.peers.wire.routing import DirectPaths, Matrix, choose_route

A = TypeVar("A", bound=Answer)

MAX_FORWARDS = 16


@dataclass
class RelayCounters:
    forwarded: int = 0
    forwarded_bytes: int = 0
    refused: int = 0
    failed: int = 0
    """Forwards the target did not answer (a refusal of the target's goes back as it came)."""


@dataclass
class RouteCounters:
    direct: int = 0
    relayed: int = 0
    direct_unreachable: int = 0
    """Direct dials that did not open (the peer is then avoided for a while)."""
    relay_unreachable: int = 0


def _json_object(text: str, what: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError:
        raise BadRequest(f"{what} is not JSON") from None
    if not isinstance(value, dict):
        raise BadRequest(f"{what} must be a JSON object")
    return value


class RelayService:
    def __init__(
        self,
        own: str,
        is_relay: Callable[[str], bool],
        is_member: Callable[[str], bool],
        timeout_s: float = rpc.DEFAULT_TIMEOUT_S,
        max_forwards: int = MAX_FORWARDS,
    ) -> None:
        self.own, self.is_relay, self.is_member, self.timeout_s = own, is_relay, is_member, timeout_s
        self.p2p: Any = None  # set once the data path is up
        self.counters = RelayCounters()
        self._slots = asyncio.Semaphore(max_forwards)
        self.max_forwards = max_forwards

    async def handle(self, sender: str, request: Forward, blobs: list[bytes]) -> tuple[Forwarded, list[bytes]]:
        try:
            wait_s = self._check(sender, request, blobs)
        except RpcError:
            self.counters.refused += 1
            raise
        relayed = Relayed(run_id=request.run_id, on_behalf_of=sender, header=request.header)
        async with self._slots:
            try:
                header, out = await rpc.exchange(
                    self.p2p, request.to, *relayed.encode(blobs), timeout_s=self.timeout_s + wait_s
                )
            except RpcError as e:
                self.counters.failed += 1
                raise Unavailable(f"the relay could not reach {request.to}: {e}") from None
        answer = json.dumps(header, separators=(",", ":"))
        if len(answer) > MAX_FORWARDED_CHARS:
            self.counters.failed += 1
            why = f"{request.to} answered a {len(answer)}-character header; a relay carries {MAX_FORWARDED_CHARS}"
            raise TooLarge(why)
        self.counters.forwarded += 1
        self.counters.forwarded_bytes += sum(len(b) for b in blobs) + sum(len(b) for b in out)
        return Forwarded(answer=answer), out

    def _check(self, sender: str, request: Forward, blobs: list[bytes]) -> float:
        """Refuse what must not be forwarded; returns how long the target may hold the request."""
        if self.p2p is None:
            raise Unavailable("the relay's data path is not up yet; retry later")
        if not self.is_relay(self.own):
            raise NotRelay("this peer is not a relay of the plan in force; use one the plan names")
        if request.to in (self.own, sender):
            raise BadRequest(f"relay target {request.to} is the relay or the asker itself; send it direct")
        if not self.is_member(request.to):
            raise NotMember(f"relay target {request.to} is not a live member of this run")
        header = _json_object(request.header, "the forwarded header")
        method = str(header.get("method"))
        kind = request_type(method)
        if kind is None or not kind.RELAYABLE:
            raise BadRequest(f"relays do not forward {method[:40]!r}; send it direct")
        wait_s = kind.decode(header, blobs).server_wait_s()  # a malformed request stops here
        if self._slots.locked():
            raise Busy(f"{self.max_forwards} forwards in flight at this relay; retry later or go direct")
        return wait_s

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
        self.on_transfer: Callable[[str, Request[Any], int, float], None] | None = None
        """Told of every request that went direct and succeeded: (peer, request, bytes both
        ways, seconds), so that links are measured as the data path sees them."""

    async def call(
        self,
        p2p: Any,
        peer: str,
        request: Request[A],
        blobs: Sequence[bytes] = (),
        timeout_s: float = rpc.DEFAULT_TIMEOUT_S,
    ) -> tuple[A, list[bytes]]:
        """``request`` to ``peer``, direct or relayed: its typed answer and blobs, or the
        refusal's exception (the target's, or the relay's own)."""
        header, out = request.encode(blobs)
        started = time.perf_counter()
        (answer, answer_blobs), direct = await self._send(
            p2p,
            peer,
            header,
            out,
            timeout_s + request.server_wait_s(),
            relayable=request.RELAYABLE,
            for_speed=request.RELAY_FOR_SPEED,
        )
        if self.on_transfer is not None and direct:
            moved = sum(len(b) for b in out) + sum(len(b) for b in answer_blobs)
            self.on_transfer(peer, request, moved, time.perf_counter() - started)
        return rpc.answer_of(request, peer, answer, answer_blobs)

    async def _send(
        self,
        p2p: Any,
        peer: str,
        header: dict[str, Any],
        blobs: Sequence[bytes],
        timeout_s: float,
        relayable: bool = True,
        for_speed: bool = True,
    ) -> tuple[rpc.Frame, bool]:
        """The answer, and whether it came over the direct path. A request relays refuse to pass
        on (probes, replication to a named standby) goes direct whatever the routing mode."""
        nbytes = sum(len(b) for b in blobs)
        blocked = self.paths.blocked(peer, time.monotonic())
        mode = self.mode if relayable else "never"
        via = choose_route(
            self.own, peer, self.relays(), self.matrix(), nbytes, direct_blocked=blocked, mode=mode, for_speed=for_speed
        )
        if via is not None:
            try:
                return await self._relayed(p2p, via, peer, header, blobs, timeout_s), False
            except Unreachable:
                self.counters.relay_unreachable += 1  # the relay itself: try the direct path
        try:
            answer = await rpc.exchange(p2p, peer, header, blobs, timeout_s=timeout_s)
        except Unreachable:
            self.counters.direct_unreachable += 1
            self.paths.failed(peer, time.monotonic())
            fallback = None
            if via is None and mode != "never":
                fallback = choose_route(
                    self.own, peer, self.relays(), self.matrix(), nbytes, direct_blocked=True, mode=mode
                )
            if fallback is None:
                raise
            return await self._relayed(p2p, fallback, peer, header, blobs, timeout_s), False
        self.paths.succeeded(peer)
        self.counters.direct += 1
        return answer, True

    async def _relayed(
        self, p2p: Any, relay: str, peer: str, header: dict[str, Any], blobs: Sequence[bytes], timeout_s: float
    ) -> rpc.Frame:
        forward = Forward(run_id=header["run_id"], to=peer, header=json.dumps(header, separators=(",", ":")))
        forwarded, out = await rpc.call(p2p, relay, forward, blobs, timeout_s=timeout_s)
        self.counters.relayed += 1
        try:
            answer = _json_object(forwarded.answer, "the target's answer")
        except BadRequest as e:  # the relay sent garbage as the target's answer
            raise ProtocolViolation(f"{header.get('method')} via {relay}: {e.detail}") from None
        return answer, out

    def status(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "relays": list(self.relays()),
            **asdict(self.counters),
            "direct_blocked_peers": self.paths.count(time.monotonic()),
        }
