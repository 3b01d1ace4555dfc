"""A shard server's replication at its standby: what makes a step committed.

Every step is logged at the standby (``ReplicaLog``) before pulls see it; a new standby gets a
checkpoint first, and every ``checkpoint_every`` steps a checkpoint goes to it again (the log
after it is all a take-over replays). The first copy to a standby travels under the server's
lock (no step can be logged before it); later ones travel in the background while steps go on:
the standby keeps its previous copy and the log until the new one is in, and keeps the steps
logged meanwhile after it. (Sent under the lock they held every step and pull for as long as
the shard's state takes on the standby's link, about 1 s every 10 steps at 40 Mbit/s.)

A standby that refuses because its view of the swarm lags this peer's is asked again, with
backoff, for up to ``LAGGING_STANDBY_WAIT_S`` in all, the step held: it has not read this peer's lease
of the shard yet (``NOT_HOLDER``), nor its heartbeat (``NOT_MEMBER``), or follows no assignment
yet (``UNAVAILABLE``; which also asks for a copy first). Such a refusal ends within a trainer
tick or a membership scan, and a step applied meanwhile would be lost with this peer: a server
opened after a hand-over, or copying to a new standby, met one in most runs of the four-daemon
test. A standby that cannot log a step otherwise (gone, too slow, or lagging longer) does not
stall the swarm: the step is applied unreplicated (the server counts it) and the next step
copies a checkpoint first. A standby that does not catch up in that time (paused, leaving)
holds no later step up; a closing server waits for none.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from swarmd.errors import SwarmdError
from swarmd.peers.taskpool.servers import Shard
from swarmd.peers.wire.errors import NotHolder, NotMember, Unavailable

if TYPE_CHECKING:
    from swarmd.models.parameter_shard import ShardStep

logger = logging.getLogger(__name__)

LAGGING_STANDBY_WAIT_S = 6.0
"""How long steps wait for a standby whose view lags (module doc), in all, per lag: a
membership scan (at most 5 s apart) and a trainer tick."""
LAGGING_FIRST_RETRY_S = 0.25
LAGGING_MAX_RETRY_S = 2.0
LOG_RETRY_WITHIN_S = 1.0
"""A log that fails this fast is a broken stream, tried once more at once; a slow failure is a
standby that is slow or gone."""
WARN_EVERY_S = 60.0

LogStep = Callable[["ShardStep", str], Awaitable[bool]]
"""Sends a step (and the ledger's state) to the standby; False: no standby; raises if it failed."""
SendCheckpoint = Callable[[int, bytes], Awaitable[bool]]
"""Sends a checkpoint (its version and bytes) to the standby; False: no standby."""
Checkpoint = Callable[[], Awaitable[tuple[int, bytes]]]
"""Checkpoints the shard here (under the server's lock): its version and the bytes a standby takes."""


def _lagging(error: Exception) -> bool:
    """A refusal that the standby's view catching up with ours ends (module doc)."""
    return isinstance(error, NotHolder | NotMember | Unavailable)


class StandbyLink:
    """One server's replication (module doc). ``replicate``, ``stepped`` and ``copy_now`` run
    under the server's lock; ``ledger_state`` is the share ledger's state logged with each step."""

    def __init__(
        self,
        key: Shard,
        log_step: LogStep,
        send_checkpoint: SendCheckpoint,
        checkpoint: Checkpoint,
        checkpoint_every: int,
        ledger_state: Callable[[], str],
        lagging_wait_s: float = LAGGING_STANDBY_WAIT_S,
    ) -> None:
        self.key = key
        self.log_step, self.send_checkpoint, self._checkpoint = log_step, send_checkpoint, checkpoint
        self.checkpoint_every = checkpoint_every
        self.ledger_state = ledger_state
        self.lagging_wait_s = lagging_wait_s
        self.since_copy = 0
        self.lagging_waits = 0
        """Steps that waited for a lagging standby (and were logged, or went unreplicated after all)."""
        self._ready = False
        self._generation = 0
        """Counts standby changes: a copy in flight to a standby no longer ours decides nothing."""
        self._copying: asyncio.Task[None] | None = None
        self._warned_at = -WARN_EVERY_S
        self._lag_left_s = lagging_wait_s
        """What is left of the wait for the standby's current lag (module doc)."""
        self._hurry = asyncio.Event()

    async def replicate(self, step: ShardStep) -> bool:
        """Log ``step`` at the standby, a copy first where it needs one; True once it is logged.
        A lagging standby is waited for (module doc) out of one budget per lag: a standby that
        does not catch up in it (paused, leaving) holds no later step up, until it takes a copy
        or another standby is named."""
        delay, relogged, waited = LAGGING_FIRST_RETRY_S, False, False
        copy: tuple[int, bytes] | None = None  # taken once: the shard does not change under the lock
        while True:
            started, copying = time.monotonic(), not self._ready
            try:
                if copying:
                    copy = copy or await self._take_checkpoint()
                    self._ready = await self.send_checkpoint(*copy)
                    if not self._ready:
                        return False  # no standby
                logged = await self.log_step(step, self.ledger_state())
                if logged:
                    self._lag_left_s = self.lagging_wait_s  # caught up: a later lag is a new one
                return logged
            except SwarmdError as e:
                error: SwarmdError = e
            if self._ready and not relogged and not _lagging(error) and time.monotonic() - started < LOG_RETRY_WITHIN_S:
                relogged = True  # a broken stream: the log once more, at once
                continue
            self._ready = False
            if not _lagging(error) or self._lag_left_s <= 0 or self._hurry.is_set():
                what = "copy a checkpoint to" if copying else f"log step {step.version} at"
                self._warn(f"could not {what} the standby ({error})")
                return False
            if not waited:
                waited = True
                self.lagging_waits += 1
                logger.info("shard %s: the standby's view lags (%s); step %d waits", self.key, error, step.version)
            pause = min(self._lag_left_s, delay * random.uniform(0.5, 1.0))  # jittered: servers may share a standby
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._hurry.wait(), pause)
            self._lag_left_s -= time.monotonic() - started
            delay = min(2 * delay, LAGGING_MAX_RETRY_S)

    def hurry(self) -> None:
        """The server closes: no step waits for a lagging standby any more (it hands its state
        to the next holder itself)."""
        self._hurry.set()

    async def stepped(self) -> None:
        """After a committed step: a checkpoint every ``checkpoint_every`` steps, in the
        background where the standby holds an older copy and the log since (module doc)."""
        self.since_copy += 1
        if self.since_copy < self.checkpoint_every or self._copying is not None:
            return
        version, data = await self._take_checkpoint()
        if self._ready:
            self._copying = asyncio.create_task(self._copy_in_background(version, data, self._generation))
        else:
            await self._send_copy(version, data)

    async def copy_now(self) -> bool:
        """Checkpoint here and at the standby (under the lock); True when the standby has it."""
        return await self._send_copy(*await self._take_checkpoint())

    async def settle(self) -> None:
        """Wait for a background copy in flight (its send has its own deadline)."""
        if self._copying is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(self._copying)

    def changed(self) -> None:
        """A new standby starts from a fresh copy, not from the log (called by the trainer)."""
        self._ready = False
        self._generation += 1
        self._lag_left_s = self.lagging_wait_s

    async def _take_checkpoint(self) -> tuple[int, bytes]:
        self.since_copy = 0
        return await self._checkpoint()

    async def _send_copy(self, version: int, data: bytes) -> bool:
        try:
            self._ready = await self.send_checkpoint(version, data)
        except SwarmdError as e:
            self._ready = False
            self._warn(f"could not copy a checkpoint to the standby ({e})")
        return self._ready

    async def _copy_in_background(self, version: int, data: bytes, generation: int) -> None:
        """A periodic copy while steps go on. If it fails, the standby still replays its older
        copy and the log; the next step sends a fresh copy under the lock first."""
        try:
            sent = await self.send_checkpoint(version, data)
            error = "" if sent else "no standby"
        except SwarmdError as e:
            sent, error = False, str(e)
        finally:
            self._copying = None
        if not sent and generation == self._generation:
            self._ready = False
            self._warn(f"could not copy a checkpoint to the standby ({error})")

    def _warn(self, what: str) -> None:
        if time.monotonic() - self._warned_at >= WARN_EVERY_S:
            self._warned_at = time.monotonic()
            logger.warning("shard %s: %s; applying steps unreplicated until a standby takes a copy", self.key, what)
