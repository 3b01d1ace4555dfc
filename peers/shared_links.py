"""Transfers that share the network as concurrent TCP flows do.

Every flow crosses three resources: its sender's uplink, its receiver's downlink and the path
between the two. At any moment the flows get max-min fair rates over those resources: each
resource's capacity is split evenly among its flows, and what a flow cannot use because
another of its resources holds it back goes to the others. Rates are re-divided whenever a
flow starts or ends, among the flows that share an interface with it (the ones whose fair
share that changes); flows further away keep their rates until an event reaches them, which
can leave a little capacity idle for a while but never gives a resource more than it has by
more than the floor below.

This replaces queueing transfers first come, first served. Measured against real daemons on
emulated links (``tests/benchmarks/calibrate_simulator.py``), a queue lets a host's log of a
push to its standby run at the full uplink while the host is also sending weights to workers;
on real links the two share it, and the log takes as long as sharing makes it.

Completion events are kept lazily: when a flow slows down its pending event is left in place
and, when it fires early, rescheduled; only a flow that speeds up gets a new event at once.
The owner runs the event queue: ``schedule(t, flow_id, serial)`` asks it to call
``due(t, flow_id, serial)`` at ``t``.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from typing import Any

import numpy as np

MIN_SHARE = 1e-6
"""The least fraction of a resource's capacity a flow gets, so that every flow ends even when
flows outside the re-divided set hold more than their share of one of its resources."""
_NONE: frozenset[int] = frozenset()


class _Flow:
    __slots__ = ("src", "dst", "size", "left", "rate", "since", "eta", "serial", "payload")

    def __init__(self, src: int, dst: int, size: float, now: float, payload: Any) -> None:
        self.src, self.dst, self.size, self.left = src, dst, size, size
        self.rate, self.since, self.eta, self.serial = 0.0, now, float("inf"), 0
        self.payload = payload


class SharedLinks:
    def __init__(
        self, path_rate: np.ndarray, uplink: np.ndarray, downlink: np.ndarray,
        schedule: Callable[[float, int, int], None],
    ) -> None:  # fmt: skip
        """``path_rate[a, b]``: bytes/s from ``a`` to ``b`` on their own; ``uplink`` and
        ``downlink``: each device's interface rates in bytes/s."""
        self.path_rate, self.uplink, self.downlink, self.schedule = path_rate, uplink, downlink, schedule
        self.n = len(uplink)
        self.flows: dict[int, _Flow] = {}
        self.sending: dict[int, set[int]] = {}
        self.receiving: dict[int, set[int]] = {}
        self.on_path: dict[tuple[int, int], set[int]] = {}
        self._ids = itertools.count()

    def __len__(self) -> int:
        return len(self.flows)

    def start(self, now: float, src: int, dst: int, nbytes: float, payload: Any) -> int:
        """A flow of ``nbytes`` from ``src`` to ``dst`` starts at ``now``; ``due`` returns
        ``payload`` once its last byte is through."""
        if src == dst or nbytes <= 0:
            raise ValueError(f"a flow needs two ends and bytes: {src} -> {dst}, {nbytes} B")
        fid = next(self._ids)
        self.flows[fid] = _Flow(src, dst, float(nbytes), now, payload)
        self.sending.setdefault(src, set()).add(fid)
        self.receiving.setdefault(dst, set()).add(fid)
        self.on_path.setdefault((src, dst), set()).add(fid)
        self._share(now, src, dst)
        return fid

    def due(self, now: float, fid: int, serial: int) -> Any | None:
        """The flow's completion event fired: its payload if it is through, else None (the
        event was superseded, or the flow slowed down since and is rescheduled)."""
        flow = self.flows.get(fid)
        if flow is None or flow.serial != serial:
            return None
        flow.left -= flow.rate * (now - flow.since)
        flow.since = now
        # Not through yet (it slowed down since the event was set): set it again. What is left
        # below a part in 1e9 of the bytes, or of the clock, is rounding.
        if flow.left > 1e-9 * flow.size and flow.left / flow.rate > 1e-9 * max(now, 1.0):
            self._reschedule(fid, flow, now + flow.left / flow.rate)
            return None
        del self.flows[fid]
        for index, key in ((self.sending, flow.src), (self.receiving, flow.dst), (self.on_path, (flow.src, flow.dst))):
            members = index[key]  # type: ignore[index]
            members.discard(fid)
            if not members:
                del index[key]  # type: ignore[arg-type]
        self._share(now, flow.src, flow.dst)
        return flow.payload

    def rate(self, fid: int) -> float:
        return self.flows[fid].rate

    # --- the fair shares -----------------------------------------------------------------------

    # A resource is an int: an uplink is its device, a downlink n + its device, a path 2n plus
    # the pair's index in the n x n matrix (ints hash fast, and the three never collide).

    def _resources(self, flow: _Flow) -> tuple[int, int, int]:
        n = self.n
        return flow.src, n + flow.dst, 2 * n + flow.src * n + flow.dst

    def _capacity(self, resource: int) -> float:
        n = self.n
        if resource < n:
            return float(self.uplink[resource])
        if resource < 2 * n:
            return float(self.downlink[resource - n])
        return float(self.path_rate[divmod(resource - 2 * n, n)])

    def _members(self, resource: int) -> set[int] | frozenset[int]:
        n = self.n
        if resource < n:
            return self.sending.get(resource, _NONE)
        if resource < 2 * n:
            return self.receiving.get(resource - n, _NONE)
        return self.on_path.get(divmod(resource - 2 * n, n), _NONE)

    def _share(self, now: float, src: int, dst: int) -> None:
        """Re-divide the rates of the flows on ``src``'s uplink and ``dst``'s downlink by
        progressive filling: raise them all together; when a resource is full, the flows
        through it stop there; the others go on."""
        touched = self.sending.get(src, set()) | self.receiving.get(dst, set())
        if not touched:
            return
        left: dict[int, float] = {}
        users: dict[int, list[int]] = {}
        for fid in touched:
            flow = self.flows[fid]
            flow.left -= flow.rate * (now - flow.since)
            flow.since = now
            for r in self._resources(flow):
                if r not in left:
                    cap = self._capacity(r)
                    held = sum(self.flows[g].rate for g in self._members(r) if g not in touched)
                    left[r] = max(cap - held, MIN_SHARE * cap)
                    users[r] = []
                users[r].append(fid)
        count = {r: len(u) for r, u in users.items()}
        heap = [(left[r] / count[r], i, r) for i, r in enumerate(users)]
        order = {r: i for i, r in enumerate(users)}
        heapq.heapify(heap)
        rates: dict[int, float] = {}
        while heap:
            share, _, r = heapq.heappop(heap)
            if count[r] == 0 or abs(share - left[r] / count[r]) > 1e-12 * max(share, 1.0):
                continue  # stale: the resource's share changed since this entry
            for fid in users[r]:
                if fid in rates:
                    continue
                rates[fid] = share
                for r2 in self._resources(self.flows[fid]):
                    count[r2] -= 1
                    left[r2] = max(left[r2] - share, 0.0)
                    if count[r2] > 0 and r2 != r:
                        heapq.heappush(heap, (left[r2] / count[r2], order[r2], r2))
            count[r] = 0
        for fid, rate in rates.items():
            flow = self.flows[fid]
            flow.rate = max(rate, MIN_SHARE * min(self._capacity(r) for r in self._resources(flow)))
            eta = now + flow.left / flow.rate
            if eta < flow.eta - 1e-12 * max(eta, 1.0):
                self._reschedule(fid, flow, eta)

    def _reschedule(self, fid: int, flow: _Flow, eta: float) -> None:
        flow.serial += 1
        flow.eta = eta
        self.schedule(eta, fid, flow.serial)
