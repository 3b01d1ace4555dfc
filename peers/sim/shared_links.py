"""Transfers that share the network as concurrent TCP flows do.

Every flow crosses three resources: its sender's uplink, its receiver's downlink and the path
between the two. At any moment the flows get max-min fair rates over those resources: each
resource's capacity is split evenly among its flows, and what a flow cannot use because
another of its resources holds it back goes to the others. Rates are re-divided whenever a
flow starts or ends, among the flows that share an interface with it (the ones whose fair
share that changes); flows further away keep their rates until an event reaches them, which
can leave a little capacity idle for a while but never gives a resource more than it has by
more than the floor below.

Past ``MAX_LEVELS`` levels of filling, the flows left get their tightest resource's even share
of what is left (feasible, a little under max-min): exact filling of a server shared by
hundreds of cells cost most of a large run.

This replaces queueing transfers first come, first served. Measured against real daemons on
emulated links (``tests/benchmarks/calibrate_simulator.py``), a queue lets a host's log of a
push to its standby run at the full uplink while the host is also sending weights to workers;
on real links the two share it, and the log takes as long as sharing makes it.

Flows live in arrays (a slot each) and the fair shares are computed with numpy: a host that
serves hundreds of workers re-divides hundreds of flows on every start and end.

The owner may defer the re-division to the end of the instant (``defer`` and ``flush``): the
flows that start or end at one moment are then re-divided together, once. With very many
flows in flight (an exchange of a thousand cells with a hundred shards each is a hundred
thousand), it may also wait a short while (``coalesce_s``) so that a wave of starts and ends
is re-divided once: a flow then starts up to that much late, and a finished one's capacity is
taken up that much late, which the owner accepts for transfers far longer than the wait.

Completion events are kept lazily: when a flow slows down its pending event is left in place
and, when it fires early, rescheduled; only a flow that speeds up gets a new event at once.
The owner runs the event queue: ``schedule(t, flow_id, serial)`` asks it to call
``due(t, flow_id, serial)`` at ``t``.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import numpy as np

MIN_SHARE = 1e-6
"""The least fraction of its slowest resource's capacity a flow gets, so that every flow ends
even when flows outside the re-divided set hold more than their share of one of them."""
MAX_LEVELS = 6
"""Levels of progressive filling computed exactly; past them the flows left take their tightest
resource's even share of what is left. A server's downlink shared by hundreds of cells whose
uplinks all differ has as many levels as cells, and re-dividing it at every start and end of
a flow cost most of a thousand-device run; the few flows past six levels get a little less
than their max-min rate, never more than a resource has."""
_NONE: frozenset[int] = frozenset()


class SharedLinks:
    def __init__(
        self,
        path_rate: np.ndarray,
        uplink: np.ndarray,
        downlink: np.ndarray,
        schedule: Callable[[float, int, int], None],
        defer: Callable[[float], None] | None = None,
        coalesce_s: float = 0.0,
        coalesce_flows: int = 0,
    ) -> None:
        """``path_rate[a, b]``: bytes/s from ``a`` to ``b`` on their own; ``uplink`` and
        ``downlink``: each device's interface rates in bytes/s. ``schedule(t, slot, serial)``:
        call ``due(t, slot, serial)`` at ``t``. ``defer(t)``: call ``flush(t)`` at ``t`` once the
        events of that instant are run; without it rates are re-divided at every start and end.
        With ``coalesce_flows`` flows or more in flight, the flush waits ``coalesce_s`` (module doc)."""
        self.path_rate, self.schedule, self.defer = path_rate, schedule, defer
        self.coalesce_s, self.coalesce_flows = coalesce_s, coalesce_flows
        self._dirty_up: set[int] = set()
        self._dirty_down: set[int] = set()
        self.uplink, self.downlink = np.asarray(uplink, dtype=float), np.asarray(downlink, dtype=float)
        self.n = len(self.uplink)
        self.up_load, self.down_load = np.zeros(self.n), np.zeros(self.n)  # bytes/s in use on each interface
        self.sending: dict[int, set[int]] = {}  # device -> slots of the flows it sends
        self.receiving: dict[int, set[int]] = {}
        self.pairs: dict[tuple[int, int], int] = {}  # (src, dst) -> flows in flight between them
        self._serials = itertools.count(1)
        self.clock = 0.0
        # A flow's slot in each array; a free slot is reused (its serial keeps old events apart).
        self.src, self.dst = np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        self.size, self.left, self.rate, self.since, self.eta = (np.zeros(0) for _ in range(5))
        self.serial = np.zeros(0, dtype=np.int64)
        self.payload: list[Any] = []
        self.free: list[int] = []
        self._grow(256)

    def _grow(self, size: int) -> None:
        old = len(self.payload)
        for name in ("src", "dst", "size", "left", "rate", "since", "eta", "serial"):
            array = getattr(self, name)
            grown = np.zeros(size, dtype=array.dtype)
            grown[:old] = array
            setattr(self, name, grown)
        self.payload += [None] * (size - old)
        self.free += range(size - 1, old - 1, -1)

    def __len__(self) -> int:
        return len(self.payload) - len(self.free)

    def start(self, now: float, src: int, dst: int, nbytes: float, payload: Any) -> int:
        """A flow of ``nbytes`` from ``src`` to ``dst`` starts at ``now``; ``due`` returns
        ``payload`` once its last byte is through. Returns the flow's slot."""
        if src == dst or nbytes <= 0:
            raise ValueError(f"a flow needs two ends and bytes: {src} -> {dst}, {nbytes} B")
        self._advance_clock(now)
        if not self.free:
            self._grow(2 * len(self.payload))
        slot = self.free.pop()
        self.src[slot], self.dst[slot], self.size[slot], self.left[slot] = src, dst, nbytes, nbytes
        self.rate[slot], self.since[slot], self.eta[slot], self.serial[slot] = 0.0, now, np.inf, 0
        self.payload[slot] = payload
        self.sending.setdefault(src, set()).add(slot)
        self.receiving.setdefault(dst, set()).add(slot)
        self.pairs[src, dst] = self.pairs.get((src, dst), 0) + 1
        self._share(now, src, dst)
        return slot

    def carrying(self, src: int, dst: int) -> bool:
        """Whether a flow from ``src`` to ``dst`` is in flight."""
        return (src, dst) in self.pairs

    def due(self, now: float, slot: int, serial: int) -> Any | None:
        """The flow's completion event fired: its payload if it is through, else None (the
        event was superseded, or the flow slowed down since and is rescheduled)."""
        if self.serial[slot] != serial:
            return None
        self._advance_clock(now)
        rate = float(self.rate[slot])
        left = float(self.left[slot]) - rate * (now - float(self.since[slot]))
        self.left[slot], self.since[slot] = left, now
        # Not through yet (it slowed down since the event was set): set it again. What is left
        # below a part in 1e9 of the bytes, or of the clock, is rounding.
        if left > 1e-9 * float(self.size[slot]) and left / rate > 1e-9 * max(now, 1.0):
            self._reschedule(slot, now + left / rate)
            return None
        payload = self.payload[slot]
        self._remove(now, slot)
        return payload

    def cancel(self, now: float, slot: int) -> None:
        """The flow stops part way (an end left the swarm): its bytes stop and ``due`` will
        never return its payload; the others' rates are re-divided."""
        if slot not in self.sending.get(int(self.src[slot]), _NONE):
            raise ValueError(f"flow slot {slot} is not in flight")
        self._advance_clock(now)
        self._remove(now, slot)

    def flows_of(self, device: int) -> list[int]:
        """The slots of the flows ``device`` sends or receives."""
        return sorted(self.sending.get(device, _NONE) | self.receiving.get(device, _NONE))

    def _remove(self, now: float, slot: int) -> None:
        rate = float(self.rate[slot])
        src, dst = int(self.src[slot]), int(self.dst[slot])
        for index, key in ((self.sending, src), (self.receiving, dst)):
            members = index[key]
            members.discard(slot)
            if not members:
                del index[key]
        if self.pairs[src, dst] == 1:
            del self.pairs[src, dst]
        else:
            self.pairs[src, dst] -= 1
        self.up_load[src] = max(0.0, self.up_load[src] - rate)
        self.down_load[dst] = max(0.0, self.down_load[dst] - rate)
        self.payload[slot] = None
        self.serial[slot] = 0
        self.eta[slot] = np.inf
        self.free.append(slot)
        self._share(now, src, dst)

    def _advance_clock(self, now: float) -> None:
        """Flows are advanced to ``now``: a start or an end in the past would undo bytes sent."""
        if now < self.clock:
            raise ValueError(f"a flow event at {now} s, before the last one at {self.clock} s")
        self.clock = now

    def _share(self, now: float, src: int, dst: int) -> None:
        """A flow started or ended between ``src`` and ``dst``: re-divide now, or at the
        instant's flush when the owner defers (a commit that starts a pull to every cell, or
        a cell that contributes to every shard, re-divides once, not once per flow)."""
        if self.defer is None:
            self._redivide(now, self.sending.get(src, _NONE) | self.receiving.get(dst, _NONE))
            return
        if not (self._dirty_up or self._dirty_down):
            crowded = self.coalesce_flows and len(self) >= self.coalesce_flows
            self.defer(now + self.coalesce_s if crowded else now)
        self._dirty_up.add(src)
        self._dirty_down.add(dst)

    def flush(self, now: float) -> None:
        """Re-divide the rates on every interface a flow started or ended on since the last flush."""
        self._advance_clock(now)
        touched: set[int] = set()
        for device in self._dirty_up:
            touched |= self.sending.get(device, _NONE)
        for device in self._dirty_down:
            touched |= self.receiving.get(device, _NONE)
        self._dirty_up.clear()
        self._dirty_down.clear()
        self._redivide(now, touched)

    def _redivide(self, now: float, touched: set[int] | frozenset[int]) -> None:
        """Re-divide the rates of the ``touched`` flows (those on the interfaces that changed).
        The other flows on those flows' interfaces keep their rates: what they use is taken off
        first. Every flow on a path through a changed uplink or into a changed downlink is in
        the set, so a path is shared only within it."""
        if not touched:
            return
        if len(touched) == 1:  # alone on both interfaces: what the others leave it, at most its path
            (slot,) = touched
            self._alone(now, slot)
            return
        idx = np.fromiter(touched, dtype=np.int64, count=len(touched))
        old = self.rate[idx]
        self.left[idx] -= old * (now - self.since[idx])
        self.since[idx] = now
        s, d = self.src[idx], self.dst[idx]
        np.subtract.at(self.up_load, s, old)
        np.subtract.at(self.down_load, d, old)
        ups, up_i = np.unique(s, return_inverse=True)
        downs, down_i = np.unique(d, return_inverse=True)
        pairs, pair_i = np.unique(s * self.n + d, return_inverse=True)
        up_cap, down_cap = self.uplink[ups], self.downlink[downs]
        path_cap = np.asarray(self.path_rate[pairs // self.n, pairs % self.n], dtype=float)
        capacity = np.concatenate(
            [
                np.maximum(up_cap - self.up_load[ups], MIN_SHARE * up_cap),
                np.maximum(down_cap - self.down_load[downs], MIN_SHARE * down_cap),
                path_cap,
            ]
        )
        uses = np.stack([up_i, len(ups) + down_i, len(ups) + len(downs) + pair_i], axis=1)
        floor = MIN_SHARE * np.minimum(np.minimum(up_cap[up_i], down_cap[down_i]), path_cap[pair_i])
        rates = np.maximum(max_min_rates(capacity, uses), floor)
        self.rate[idx] = rates
        np.add.at(self.up_load, s, rates)
        np.add.at(self.down_load, d, rates)
        eta = now + self.left[idx] / rates
        sooner = eta < self.eta[idx] - 1e-12 * np.maximum(eta, 1.0)
        for slot, t in zip(idx[sooner].tolist(), eta[sooner].tolist(), strict=True):
            self._reschedule(slot, t)

    def _alone(self, now: float, slot: int) -> None:
        """``_share`` for one flow, without arrays (most flows of a small swarm are alone)."""
        src, dst, old = int(self.src[slot]), int(self.dst[slot]), float(self.rate[slot])
        left = float(self.left[slot]) - old * (now - float(self.since[slot]))
        up_cap, down_cap = float(self.uplink[src]), float(self.downlink[dst])
        path_cap = float(self.path_rate[src, dst])
        up_free = max(up_cap - (float(self.up_load[src]) - old), MIN_SHARE * up_cap)
        down_free = max(down_cap - (float(self.down_load[dst]) - old), MIN_SHARE * down_cap)
        rate = max(min(up_free, down_free, path_cap), MIN_SHARE * min(up_cap, down_cap, path_cap))
        self.left[slot], self.since[slot], self.rate[slot] = left, now, rate
        self.up_load[src] += rate - old
        self.down_load[dst] += rate - old
        eta = now + left / rate
        if eta < float(self.eta[slot]) - 1e-12 * max(eta, 1.0):
            self._reschedule(slot, eta)

    def _reschedule(self, slot: int, eta: float) -> None:
        self.serial[slot] = serial = next(self._serials)
        self.eta[slot] = eta
        self.schedule(eta, slot, serial)


def max_min_rates(capacity: np.ndarray, uses: np.ndarray, max_levels: int = MAX_LEVELS) -> np.ndarray:
    """Max-min fair rates by progressive filling: ``uses[f]`` lists the resources flow ``f``
    crosses (indices into ``capacity``). All rates rise together; when a resource is full, its
    flows stop there and the rest go on. After ``max_levels`` levels the flows left each get
    their tightest resource's even share of what is left: within every capacity still, and at
    least the last level (module doc)."""
    m, k = len(capacity), len(uses)
    left = capacity.astype(float)
    count = np.bincount(uses.ravel(), minlength=m).astype(float)
    rates = np.zeros(k)
    todo = np.ones(k, dtype=bool)
    levels = 0
    while todo.any():
        share = np.full(m, np.inf)
        np.divide(left, count, out=share, where=count > 0)
        if levels == max_levels:
            rates[todo] = share[uses[todo]].min(axis=1)
            break
        levels += 1
        level = float(share.min())
        tight = share <= level * (1 + 1e-12)
        newly = todo & tight[uses].any(axis=1)
        rates[newly] = level
        todo &= ~newly
        used = np.bincount(uses[newly].ravel(), minlength=m)
        left = np.maximum(left - used * level, 0.0)
        count -= used
    return rates
