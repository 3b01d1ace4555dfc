"""Training traffic as the owner caps it: token buckets for sending and receiving, and counts.

A volunteer lends bandwidth they also use: ``[limits] upload_mbit_s`` and ``download_mbit_s``
cap what the data path (``swarmd.peers.wire.rpc``) sends and receives, and
``daily_transfer_gib`` caps both together per local day. ``TrafficShaper`` paces bytes through
one token bucket per direction and counts them by wire method, in total and for the local day
they went on. There is one instance per process, ``TRAFFIC``, as a daemon is one process; the
DHT's records and the control socket do not go through it.

A bucket is a queue in virtual time: each reservation takes the next ``n`` bytes of the line,
and may go once the bucket's allowance (refilled at the rate, banking at most a burst of about
one second) has passed its end. Reservations go in the order they were made, so concurrent
transfers share the rate chunk by chunk. A message's header goes at once, charged so that
later bytes wait for it: the other side wants a header soon. A waiter naps at most ``MAX_NAP_S`` and looks again,
so a new rate applies within that to every byte not yet sent. The counts are read from the
control socket's thread, hence the lock.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from datetime import date
from typing import Any, Literal, Protocol

__all__ = [
    "TRAFFIC",
    "TrafficBucket",
    "TrafficShaper",
    "Direction",
    "OTHER_METHOD",
    "mbit_to_Bps",
    "apply_traffic_limits",
]

Direction = Literal["sent", "received"]
BURST_S = 1.0
"""A bucket banks at most this long at its rate (or ``MIN_BURST_BYTES``, whichever is more)."""
MIN_BURST_BYTES = 1024 * 1024
"""At least one framing chunk may go at once, so a paced blob is never split below it."""
MAX_NAP_S = 0.5
"""A waiter looks again this often: how soon a changed cap reaches bytes already waiting."""
MAX_METHODS = 64
"""Methods counted apart; more (a bug, or a peer's names) are counted under ``OTHER_METHOD``."""
OTHER_METHOD = "other"
MIN_WAIT_S = 1e-6
"""A wait shorter than this is none (rounding, not a byte's worth at any cap)."""
GIB = 2**30


def mbit_to_Bps(mbit_s: float) -> float:
    """``[limits]``'s Mbit/s in bytes per second (0: no cap)."""
    return mbit_s * 1e6 / 8


class TrafficBucket:
    """One direction's token bucket, in virtual time (module doc); rate 0 is unlimited."""

    def __init__(self, now: float) -> None:
        self.rate_Bps = 0.0
        self.burst = 0.0
        self.reserved = 0.0
        """Bytes ever reserved: the end of the line."""
        self.allowed = 0.0
        """How far along the line bytes may go now (above ``reserved``: credit banked)."""
        self.last = now

    def set_rate(self, rate_Bps: float, now: float) -> None:
        """A new rate from ``now`` on; 0 lets every waiting byte go."""
        if rate_Bps < 0:
            raise ValueError(f"a rate of {rate_Bps} bytes/s: give 0 (no cap) or more")
        self._refill(now)
        was_unlimited = self.rate_Bps == 0
        self.rate_Bps = float(rate_Bps)
        self.burst = max(rate_Bps * BURST_S, MIN_BURST_BYTES) if rate_Bps else 0.0
        if rate_Bps == 0:
            self.allowed = self.reserved
        elif was_unlimited:  # a cap starts with a full bucket, as after a quiet second
            self.allowed = self.reserved + self.burst
        else:  # a smaller burst trims the credit banked under the larger one
            self.allowed = min(self.allowed, self.reserved + self.burst)

    def reserve(self, n: int, now: float) -> float:
        """Take the next ``n`` bytes of the line; returns the reservation's end (its ticket)."""
        self._refill(now)
        self.reserved += n
        if self.rate_Bps == 0:
            self.allowed = self.reserved
        return self.reserved

    def wait_s(self, ticket: float, now: float) -> float:
        """How long until the reservation ending at ``ticket`` may go, at the rate in force."""
        if self.rate_Bps == 0:
            return 0.0
        self._refill(now)
        return max(0.0, (ticket - self.allowed) / self.rate_Bps)

    def _refill(self, now: float) -> None:
        if self.rate_Bps and now > self.last:
            self.allowed = min(self.allowed + self.rate_Bps * (now - self.last), self.reserved + self.burst)
        self.last = max(self.last, now)


class TrafficShaper:
    """Paces and counts the data path's bytes (module doc). ``clock`` is monotonic seconds,
    ``wall`` epoch seconds (the local day comes from it), ``sleep`` how a waiter waits."""

    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
    ) -> None:
        self.clock, self.wall, self.sleep = clock, wall, sleep
        self._lock = threading.Lock()
        now = clock()
        self._buckets: dict[Direction, TrafficBucket] = {"sent": TrafficBucket(now), "received": TrafficBucket(now)}
        self.daily_cap_bytes = 0
        """The daily transfer cap, as ``[limits]`` set it (0: none): shown, not enforced here."""
        self._by_method: dict[str, dict[Direction, int]] = {}
        self._totals: dict[Direction, int] = {"sent": 0, "received": 0}
        self._waited_s: dict[Direction, float] = {"sent": 0.0, "received": 0.0}
        self._day = self._local_date()
        self._day_bytes = 0

    def configure(self, up_Bps: float, down_Bps: float, daily_cap_bytes: int = 0) -> None:
        """Cap sending at ``up_Bps`` and receiving at ``down_Bps`` bytes/s (0: no cap), from now
        on, bytes already waiting included; ``daily_cap_bytes`` is only reported."""
        with self._lock:
            now = self.clock()
            self._buckets["sent"].set_rate(up_Bps, now)
            self._buckets["received"].set_rate(down_Bps, now)
            self.daily_cap_bytes = int(daily_cap_bytes)

    def caps_Bps(self) -> tuple[float, float]:
        """The caps in force, (up, down) in bytes/s; 0 is no cap."""
        return self._buckets["sent"].rate_Bps, self._buckets["received"].rate_Bps

    async def pace(self, direction: Direction, n: int) -> float:
        """Wait until ``n`` more bytes may go ``direction``; returns the seconds waited."""
        with self._lock:
            start = self.clock()
            ticket = self._buckets[direction].reserve(n, start)
        napped = False
        while True:
            with self._lock:
                wait_s = self._buckets[direction].wait_s(ticket, self.clock())
            if wait_s <= MIN_WAIT_S:
                break
            await self.sleep(min(wait_s, MAX_NAP_S))
            napped = True
        if not napped:
            return 0.0
        waited = self.clock() - start  # as long as it took: a busy loop oversleeps
        with self._lock:
            self._waited_s[direction] += waited
        return waited

    def count(self, direction: Direction, method: str, n: int) -> None:
        """``n`` bytes went ``direction`` for ``method`` (a wire method name)."""
        with self._lock:
            self._roll_day()
            self._totals[direction] += n
            self._day_bytes += n
            if method not in self._by_method:
                method = method if len(self._by_method) < MAX_METHODS else OTHER_METHOD
                self._by_method.setdefault(method, {"sent": 0, "received": 0})
            self._by_method[method][direction] += n

    def charge(self, direction: Direction, method: str, n: int) -> None:
        """Count ``n`` bytes that went without waiting (a header), and make later bytes wait for them."""
        with self._lock:
            self._buckets[direction].reserve(n, self.clock())
        self.count(direction, method, n)

    async def send(self, method: str, n: int) -> float:
        """Wait for ``n`` bytes to be sent for ``method``, counted as sent; the seconds waited."""
        waited = await self.pace("sent", n)
        self.count("sent", method, n)
        return waited

    def today(self) -> tuple[str, int]:
        """The local date (ISO) and the bytes sent and received on it."""
        with self._lock:
            self._roll_day()
            return self._day, self._day_bytes

    def restore_day(self, day: str, n: int) -> None:
        """Add ``n`` bytes already moved on ``day`` (by this peer before a restart), if it is today."""
        with self._lock:
            self._roll_day()
            if day == self._day and n > 0:
                self._day_bytes += n

    def status(self) -> dict[str, Any]:
        """The caps and counts, as ``swarmd status`` and the dashboard show them (JSON-able)."""
        up, down = self.caps_Bps()
        with self._lock:
            self._roll_day()
            return {
                "up_cap_Bps": up,
                "down_cap_Bps": down,
                "daily_cap_bytes": self.daily_cap_bytes,
                "sent_bytes": self._totals["sent"],
                "received_bytes": self._totals["received"],
                "waited_s": {k: round(v, 3) for k, v in self._waited_s.items()},
                "by_method": {m: dict(c) for m, c in sorted(self._by_method.items())},
                "today": {"date": self._day, "bytes": self._day_bytes},
            }

    def _local_date(self) -> str:
        return date.fromtimestamp(self.wall()).isoformat()

    def _roll_day(self) -> None:
        today = self._local_date()
        if today != self._day:  # a new local day (or the clock set back to another): counted afresh
            self._day, self._day_bytes = today, 0


TRAFFIC = TrafficShaper()
"""This process's shaper: the data path paces and counts through it (module doc)."""


class TrafficLimits(Protocol):
    """The keys of ``[limits]`` (``swarmd.config.LimitsConfig``) the shaper takes, checked there."""

    @property
    def upload_mbit_s(self) -> float: ...

    @property
    def download_mbit_s(self) -> float: ...

    @property
    def daily_transfer_gib(self) -> float: ...


def apply_traffic_limits(limits: TrafficLimits, shaper: TrafficShaper = TRAFFIC) -> None:
    """Give the shaper ``[limits]``'s caps, at start and on every reload; bytes already waiting
    go at the new rate."""
    shaper.configure(
        mbit_to_Bps(limits.upload_mbit_s),
        mbit_to_Bps(limits.download_mbit_s),
        round(limits.daily_transfer_gib * GIB),
    )
