"""The simulator's engine: one event queue, and every message as a flow on the shared links.

- ``at(t, handler, payload)`` runs ``handler(t, payload)`` at simulated time ``t``: a
  ``Handler[P]`` takes the time and one typed payload ``P`` (a NamedTuple or frozen dataclass
  per kind of event, declared beside its handler; None for one that carries nothing). Events
  live in a heap of (time, sequence, handler, payload): ties run in the order they were set,
  so a run is deterministic for its seed.
- ``send``: one message of ``nbytes`` from ``src`` to ``dst``, as a flow on the shared links
  (``swarmd.peers.sim.shared_links``), then the path's latency, then its handler. Through a
  relay it is stored and forwarded: a flow to the relay, and once all of it is there a flow
  on. A relay that left meanwhile never forwards it, and the sender sends it again on the
  direct path (the daemon's ``Router`` falls back to it when the relay is unreachable).
- ``stream``: the messages of one share across one pipeline boundary, as one flow. Through a
  relay both hops carry it at once: each message is forwarded as soon as it is in, so the
  slower hop sets the pace.
- ``cut``: a departed device's flows stop, and their handlers never run. A message (not a
  share's stream) that a departure cut, or that was sent while one of its ends was away, is
  **parked**: the daemon's sender retries it with backoff while the peer's lease stands, so
  if that end comes back before its departure is noticed (a network blip, its process and
  state kept) the message goes again ``RETRY_S`` after the return (``returned``); once the
  departure is noticed (``forget``) the protocol's own take-over resends what matters.
- ``route``: the relay a message takes, by the daemon's rule (``choose_route``).

A message's latency: the path's one-way latency, the stack's cost of a request
(``request_overhead_s``), the standing queue of each busy interface it crosses
(``standing_queue_s``), and the wait behind another transfer between the same two peers on
their one connection (``connection_queue_bytes``), as the calibration measures them.
"""

from __future__ import annotations

import heapq
import itertools
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, NamedTuple, TypeVar, overload

import numpy as np

from swarmd.peers.planning.scenario import interface_rates
from swarmd.peers.sim.shared_links import SharedLinks
from swarmd.peers.wire.routing import RELAY_GAIN, Matrix, choose_route

P = TypeVar("P")
Handler = Callable[[float, P], None]
"""An event's handler: ``handler(now, payload)``."""
RETRY_S = 1.0
"""After a peer comes back, when a parked message goes again: the daemon's senders retry a
broken send with backoff from 0.2-0.25 s up to 4-5 s (``contributions.RETRY_S``,
``puller.RETRY_S``), so a few retries in, about a second after the peer is reachable."""
MAX_ROUTES = 1 << 20
"""Routes cached at most (a few sizes per pair of peers that talk); the cache is then cleared."""


@dataclass(frozen=True)
class Overheads:
    request_overhead_s: float = 0.0
    """What a message between two peers costs beyond its latency and bytes: opening a stream,
    framing, the event loops at both ends (the calibration measures it on an idle connection)."""
    standing_queue_s: float = 0.0
    """The delay a busy interface's buffer adds to every packet through it (bufferbloat)."""
    connection_queue_bytes: float = 0.0
    """The bytes of another transfer between the same two peers that a message waits behind:
    libp2p carries all their streams over one connection whose send buffer is first come,
    first served."""
    coalesce_flows: int = 0
    """Past this many flows in flight, rates are re-divided at most every ``coalesce_s``
    (``SharedLinks``); 0: at every instant a flow starts or ends."""
    coalesce_s: float = 0.0


class Engine:
    def __init__(
        self,
        latency_s: np.ndarray,
        bandwidth_Bps: np.ndarray,
        ids: Sequence[str],
        up: np.ndarray,
        overheads: Overheads,
        relay_mode: str,
    ) -> None:
        """``up``: the devices that are up now, the simulation's own array (read here)."""
        self.latency_s, self.bandwidth_Bps = latency_s, bandwidth_Bps
        self.ids, self.up, self.overheads, self.relay_mode = list(ids), up, overheads, relay_mode
        self.index = {p: i for i, p in enumerate(self.ids)}
        self.matrix = Matrix(self.index, latency_s, bandwidth_Bps)
        n = len(self.ids)
        self.uplink, self.downlink = interface_rates(bandwidth_Bps)
        self.links = SharedLinks(
            bandwidth_Bps,
            self.uplink,
            self.downlink,
            self._flow_event,
            self._defer,
            overheads.coalesce_s,
            overheads.coalesce_flows,
        )
        self.sent, self.received = np.zeros(n), np.zeros(n)
        self.counts: Counter[str] = Counter()
        self.relays: list[int] = []
        self._routes: dict[tuple[int, int, float], int | None] = {}
        self._events: list[tuple[float, int, Handler[Any], Any]] = []
        self._seq = itertools.count()
        self.events_run = 0
        self.now = 0.0
        self._parked: dict[int, _Message[Any]] = {}
        """Messages cut or unsent because an end was away, by ``id``, until that end comes back
        (``returned``) or its departure is noticed (``forget``)."""

    # --- events -----------------------------------------------------------------------------

    def at(self, t: float, handler: Handler[P], payload: P) -> None:
        heapq.heappush(self._events, (t, next(self._seq), handler, payload))

    def run_until(self, until: float, max_events: int) -> None:
        events = self._events
        while events and self.events_run < max_events and events[0][0] <= until:
            t, _, handler, payload = heapq.heappop(events)
            self.now = t
            handler(t, payload)
            self.events_run += 1

    def _flow_event(self, t: float, slot: int, serial: int) -> None:
        self.at(t, self._flow_due, _FlowDue(slot, serial))

    def _defer(self, t: float) -> None:
        self.at(t, self._flush_links, None)

    def _flush_links(self, now: float, _: None) -> None:
        self.links.flush(now)

    def _flow_due(self, now: float, due: _FlowDue) -> None:
        through = self.links.due(now, due.slot, due.serial)
        if through is None:
            return
        msg, hop, delay = through
        msg.slots.remove(due.slot)
        if hop == _FIRST_HOP:  # all of it is at the relay: on to its peer
            assert msg.via is not None
            self._flow(now, msg, msg.via, msg.dst, _LAST_HOP)
            return
        msg.parts -= 1
        if msg.parts == 0:
            self.at(now + delay + msg.after, msg.then, msg.payload)

    # --- messages ---------------------------------------------------------------------------

    @overload
    def send(self, now: float, src: int, dst: int, nbytes: float) -> None: ...

    @overload
    def send(
        self,
        now: float,
        src: int,
        dst: int,
        nbytes: float,
        then: Handler[P],
        payload: P,
        via: int | None = None,
        after: float = 0.0,
    ) -> None: ...

    def send(
        self,
        now: float,
        src: int,
        dst: int,
        nbytes: float,
        then: Handler[Any] | None = None,
        payload: Any = None,
        via: int | None = None,
        after: float = 0.0,
    ) -> None:
        """``nbytes`` leave ``src`` for ``dst`` at ``now``; once the last byte is through and
        the latency has passed (and ``after`` more seconds), ``then(t, payload)`` runs (no
        ``then``: nobody waits for it). Between two ends of which one is down nothing is sent
        and nothing runs: the sender finds out by other means (the peer's lease lapses)."""
        self._message(now, _Message(src, dst, nbytes, then or _nothing, payload, after, via, stream=False))

    def stream(
        self, now: float, src: int, dst: int, nbytes: float, then: Handler[P], payload: P, via: int | None = None
    ) -> None:
        """Bulk bytes of many messages; through ``via`` both hops at once (module doc)."""
        self._message(now, _Message(src, dst, nbytes, then, payload, 0.0, via, stream=True))

    def _message(self, now: float, msg: _Message[Any]) -> None:
        """Send ``msg`` afresh: its flows start, or it is parked, or (nothing to carry) its
        handler is due after its ``after``."""
        src, dst, stream = msg.src, msg.dst, msg.stream
        if src == dst or msg.nbytes <= 0:
            self.at(now + msg.after, msg.then, msg.payload)
            return
        if not (self.up[src] and self.up[dst]):
            if not stream:
                self._park(msg)
            return
        if msg.via in (src, dst):
            msg.via = None
        via = msg.via
        if via is None:
            self._flow(now, msg, src, dst, _DIRECT)
            return
        self.counts["relayed_transfers"] += 1
        if stream:
            msg.parts = 2
            self._flow(now, msg, src, via, _STREAM_HOP)
            self._flow(now, msg, via, dst, _STREAM_HOP)
        else:
            self._flow(now, msg, src, via, _FIRST_HOP)

    def _flow(self, now: float, msg: _Message[Any], a: int, b: int, hop: int) -> None:
        self.sent[a] += msg.nbytes
        self.received[b] += msg.nbytes
        msg.slots.append(self.links.start(now, a, b, msg.nbytes, (msg, hop, self.one_way(a, b, msg.nbytes))))

    def cut(self, now: float, device: int) -> None:
        """``device`` left: the flows it sends or receives stop where they are. A message it
        was relaying goes again from its sender on the direct path (the daemon's ``Router``
        falls back to it when the relay is unreachable); any other dies with its end."""
        messages = list(dict.fromkeys(self.links.payload[slot][0] for slot in self.links.flows_of(device)))
        for msg in messages:
            for slot in msg.slots:
                self._unsend(now, slot)
                self.links.cancel(now, slot)
            msg.slots.clear()
        for msg in messages:  # after every cancel: a resend may reuse a freed slot
            if msg.via == device and self.up[msg.src] and self.up[msg.dst]:
                self.counts["relay_gone"] += 1
                self._message(now, msg.again(None))
            elif not msg.stream:
                self._park(msg)

    def _park(self, msg: _Message[Any]) -> None:
        msg.parts = 1
        self._parked[id(msg)] = msg
        self.counts["parked"] += 1

    def returned(self, now: float, device: int) -> None:
        """``device`` is back before its departure was noticed: what was parked between it and
        a peer that is up goes again (the senders' retries get through)."""
        for key, msg in list(self._parked.items()):
            if device in (msg.src, msg.dst) and self.up[msg.src] and self.up[msg.dst]:
                del self._parked[key]
                self.counts["retried"] += 1
                via = msg.via if msg.via is not None and self.up[msg.via] else None
                self.at(now + RETRY_S, self._message, msg.again(via))

    def forget(self, device: int) -> None:
        """``device``'s departure is noticed: its leases lapsed, and what it held is taken over
        (contributions resent to the new holder, pulls redone there): its parked messages go."""
        for key in [k for k, m in self._parked.items() if device in (m.src, m.dst)]:
            del self._parked[key]

    def carried(self, now: float) -> tuple[np.ndarray, np.ndarray]:
        """The bytes each device sent and received by ``now``: ``sent`` and ``received`` less
        what the flows still in flight have not carried yet."""
        sent, received = self.sent.copy(), self.received.copy()
        for device in list(self.links.sending):
            for slot in self.links.sending[device]:
                left = self._left(now, slot)
                sent[int(self.links.src[slot])] -= left
                received[int(self.links.dst[slot])] -= left
        return sent, received

    def _unsend(self, now: float, slot: int) -> None:
        """A cut flow's bytes still to go never cross."""
        left = self._left(now, slot)
        self.sent[int(self.links.src[slot])] -= left
        self.received[int(self.links.dst[slot])] -= left

    def _left(self, now: float, slot: int) -> float:
        links = self.links
        return max(0.0, float(links.left[slot]) - float(links.rate[slot]) * (now - float(links.since[slot])))

    # --- paths ------------------------------------------------------------------------------

    def set_relays(self, relays: list[int]) -> None:
        if relays != self.relays:
            self.relays = relays
            self._routes.clear()

    def relay_changed(self) -> None:
        """A relay left or came back: routes avoid relays that are down."""
        self._routes.clear()

    def route(self, a: int, b: int, nbytes: float, for_speed: bool = True) -> int | None:
        """The relay a message of ``nbytes`` from ``a`` to ``b`` goes through, or None for the
        direct path: the daemon's rule on the scenario's matrix among the relays that are up.
        (The daemon tries a relay that left unnoticed and falls back to the direct path; that
        failed dial is not simulated.) Cached per pair and size until the relays change.
        ``for_speed`` False (the exchange: ``Request.RELAY_FOR_SPEED``): relayed only in mode
        always, since every direct path here opens."""
        if a == b or not self.relays or self.relay_mode == "never":
            return None
        if not for_speed and self.relay_mode != "always":
            return None
        key = (a, b, nbytes)
        if key not in self._routes:
            if len(self._routes) >= MAX_ROUTES:
                self._routes.clear()
            live = [r for r in self.relays if self.up[r] and r not in (a, b)]
            if live and self.relay_mode == "auto":
                live = self._may_win(a, b, nbytes, live)
            chosen = None
            if live:
                chosen = choose_route(
                    self.ids[a],
                    self.ids[b],
                    [self.ids[r] for r in live],
                    self.matrix,
                    nbytes,
                    direct_blocked=False,
                    mode=self.relay_mode,
                )
            self._routes[key] = None if chosen is None else self.index[chosen]
        return self._routes[key]

    def _may_win(self, a: int, b: int, nbytes: float, relays: list[int]) -> list[int]:
        """The relays whose path is within ``RELAY_GAIN`` of the direct one, all at once, in
        their order: the daemon's rule picks the best of them, or the direct path when there
        is none, and asking it relay by relay for each of a thousand cells' hundred shards was
        most of a large run's routing."""
        r = np.asarray(relays)
        via = (
            self.latency_s[a, r]
            + self.latency_s[r, b]
            + nbytes / np.minimum(self.bandwidth_Bps[a, r], self.bandwidth_Bps[r, b])
        )
        direct = float(self.latency_s[a, b]) + nbytes / float(self.bandwidth_Bps[a, b])
        return [relays[i] for i in np.flatnonzero(via <= RELAY_GAIN * direct * (1 + 1e-9))]

    def path_rate(self, a: int, b: int, via: int | None) -> float:
        """The rate a path runs at on its own: the slower hop through a relay."""
        if via is None or via in (a, b):
            return float(self.bandwidth_Bps[a, b])
        return float(min(self.bandwidth_Bps[a, via], self.bandwidth_Bps[via, b]))

    def way(self, a: int, b: int, via: int | None = None) -> float:
        """The latency from ``a`` to ``b``, through relay ``via`` if it is a third peer, with
        the stack's cost of each request on the way."""
        if a == b:
            return 0.0
        if via is None or via in (a, b):
            return self.one_way(a, b) + self.overheads.request_overhead_s
        return self.one_way(a, via) + self.one_way(via, b) + 2 * self.overheads.request_overhead_s

    def rtt(self, a: int, b: int, via: int | None = None) -> float:
        """A request's way there and its answer's way back, without their bytes."""
        return self.way(a, b, via) + self.way(b, a, via)

    def one_way(self, a: int, b: int, nbytes: float = 0.0) -> float:
        """The latency from ``a`` to ``b`` of a message of ``nbytes``, plus the standing queue
        of each end's interface that is busy with other flows (a bulk TCP flow keeps its
        bottleneck's buffer full), plus the wait behind a transfer already in flight from ``a``
        to ``b`` on their connection. That buffer is first come, first served, where the shared
        links split the rate evenly: a message larger than it loses as much by the even split
        as it would by waiting, so it waits only for the difference."""
        o = self.overheads
        queued = (a in self.links.sending) + (b in self.links.receiving)
        behind = 0.0
        if o.connection_queue_bytes and self.links.carrying(a, b):
            behind = max(0.0, o.connection_queue_bytes - nbytes) / float(self.bandwidth_Bps[a, b])
        return float(self.latency_s[a, b]) + queued * o.standing_queue_s + behind


_DIRECT, _FIRST_HOP, _LAST_HOP, _STREAM_HOP = range(4)


class _FlowDue(NamedTuple):
    """The shared links' completion event of the flow in ``slot`` (stale unless ``serial``
    is still the slot's)."""

    slot: int
    serial: int


@dataclass(eq=False)
class _Message(Generic[P]):
    """One message (or one share's stream across a boundary) and the flows that carry it."""

    src: int
    dst: int
    nbytes: float
    then: Handler[P]
    payload: P
    after: float
    via: int | None
    stream: bool
    parts: int = 1
    """Flows still to finish before ``then`` runs (a stream through a relay has two)."""
    slots: list[int] = field(default_factory=list)

    def again(self, via: int | None) -> _Message[P]:
        """The same message, to be sent afresh from its sender (through ``via``)."""
        return _Message(self.src, self.dst, self.nbytes, self.then, self.payload, self.after, via, self.stream)


def _nothing(now: float, _: None) -> None:
    """The handler of a message whose arrival nobody waits for (a checkpoint copy's bytes)."""
