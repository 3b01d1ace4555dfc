"""What is in flight at one cell: the share it works on, its queued work, and stage 0's window.

A cell works one share at a time (``docs/data-path.md``, "One round of one pipeline"). Its
neighbours' tensors and stage 0's own feeding wait in one bounded queue, backward items first
(1F1B). Stage 0 feeds at most ``window`` micro-batches at once: each holds a place until its
backward has run here, and dropping the share gives every place back at once.

How long recent shares took here sets how long a share may stand still before it is abandoned
(``SHARE_STALL_S``) and how long a round takes (a reduction head's wait for its members).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import deque
from dataclasses import dataclass, field

from swarmd.peers.wire.messages import CellBackward, CellForward

SHARE_STALL_S = (10.0, 30.0, 120.0)
"""A share with no progress here for this long is abandoned (its pipeline broke in a way no
epoch change showed: a neighbour dropped it after a send failed, or hangs): ten times the
slowest of the recent shares, at least the first figure; the second before any share finished
here; never more than the third. Stage 0 then feeds it again (or another pipeline does)."""
STALL_TIMES = 10.0
SHARES_TIMED = 16


@dataclass
class ShareInFlight:
    """A share as this cell works it: which try of it (``attempt``), and its micro-batches so far."""

    share_id: int
    first: int
    count: int
    round_end: bool
    epoch: str
    attempt: int
    ticket: str = ""
    """The ledger's signed ticket for the share, as stage 0 got it (``swarmd.peers.taskpool.tickets``)."""
    done: set[int] = field(default_factory=set)
    started: set[int] = field(default_factory=set)
    progress_at: float = field(default_factory=time.monotonic)
    opened_at: float = field(default_factory=time.monotonic)

    @classmethod
    def of(cls, message: CellForward) -> ShareInFlight:
        """The share a neighbour's first activation of it names."""
        return cls(
            message.share_id,
            message.share_first,
            message.share_count,
            message.round_end,
            message.epoch,
            message.attempt,
            message.ticket,
        )


@dataclass(order=True)
class Item:
    """One micro-batch's work waiting in the queue; ``message`` None: stage 0's own forward."""

    priority: int  # backward (0) before forward (1): 1F1B
    seq: int
    kind: str = field(compare=False)
    message: CellForward | CellBackward | None = field(compare=False)
    blob: bytes | None = field(compare=False)
    micro_batch: int = field(compare=False, default=-1)


class InFlight:
    def __init__(self, window: int) -> None:
        self.share: ShareInFlight | None = None
        self.abandoned_at = -1
        """The last share dropped here: stage 0 backs off when the share it fed ended so."""
        self._inbox: asyncio.PriorityQueue[Item] = asyncio.PriorityQueue(maxsize=4 * window + 8)
        self._seq = itertools.count()
        self._window = asyncio.Semaphore(window)
        self._fed: set[int] = set()  # stage 0: micro-batches in flight, each holding a place in the window
        self._settled = asyncio.Event()
        self._seconds: deque[float] = deque(maxlen=SHARES_TIMED)  # how long recent shares took here

    # --- the queue ----------------------------------------------------------------------------

    async def queue(
        self, kind: str, m: int, message: CellForward | CellBackward | None = None, blob: bytes | None = None
    ) -> None:
        item = Item(0 if kind == "backward" else 1, next(self._seq), kind, message, blob, m)
        await self._inbox.put(item)  # bounded: a flood waits here, and its sender with it

    async def next_item(self, timeout_s: float) -> Item:
        """The next work, backward first; ``TimeoutError`` when none came in ``timeout_s``."""
        return await asyncio.wait_for(self._inbox.get(), timeout_s)

    # --- the share ----------------------------------------------------------------------------

    def open(self, share: ShareInFlight) -> None:
        self.share = share
        self._settled.clear()

    async def feed(self, share: ShareInFlight, m: int) -> bool:
        """Stage 0: micro-batch ``m`` takes a place in the window (waiting for one) and is queued;
        False when the share was dropped meanwhile."""
        await self._window.acquire()
        if self.share is None or self.share.share_id != share.share_id:
            self._window.release()
            return False
        self._fed.add(m)
        await self.queue("forward", m)
        return True

    def micro_batch_done(self, share: ShareInFlight, m: int) -> bool:
        """Micro-batch ``m`` ran its backward here; True when it was the share's last (the share
        is then no longer in flight)."""
        if share is not self.share:
            return False  # abandoned while it ran (its window place came back with it)
        share.done.add(m)
        share.progress_at = time.monotonic()
        if m in self._fed:
            self._fed.discard(m)
            self._window.release()
        if len(share.done) < share.count:
            return False
        self.share = None
        self._seconds.append(time.monotonic() - share.opened_at)
        return True

    def drop(self) -> ShareInFlight | None:
        """Drop the share in flight with its queued work; the window's places of what was fed
        come back. Returns the share, None if there was none."""
        share, self.share = self.share, None
        if share is None:
            return None
        self.abandoned_at = share.share_id
        while not self._inbox.empty():
            self._inbox.get_nowait()
        for _ in self._fed:
            self._window.release()
        self._fed.clear()
        self._settled.set()
        return share

    def settle(self) -> None:
        """The share is over here (done or dropped): stage 0 may feed the next."""
        self._settled.set()

    async def settled(self) -> None:
        await self._settled.wait()

    # --- timing -------------------------------------------------------------------------------

    def round_seconds(self, local_steps: int) -> float:
        """How long a round takes here lately (H shares; 0 before the first share is done)."""
        if not self._seconds:
            return 0.0
        return local_steps * sum(self._seconds) / len(self._seconds)

    def stall_limit_s(self) -> float:
        """How long a share may make no progress here before it is abandoned (``SHARE_STALL_S``)."""
        floor, unknown, cap = SHARE_STALL_S
        if not self._seconds:
            return unknown
        return min(cap, max(floor, STALL_TIMES * max(self._seconds)))
