"""Pausing this peer's work: the owner's ``swarmd pause [--for D]`` and ``swarmd resume``.

A paused peer stays a member (its heartbeat, its DHT node, its answers to the swarm) but
offers no work. It hands everything back as at shutdown (cells stopped, contributions
flushed, each shard's last steps logged at its standby and its checkpoint copied there, leases
released), then its heartbeat trades the ``worker`` role for ``paused``, so that the other
peers stop naming it for cells (a spare takes them), its shards' standbys take them over and
the coordinator plans it for nothing. Nothing is dropped: the ledger
issues an unfinished share again. On resume it offers work again and rejoins like a newcomer.
A pause for a duration ends by itself.

The owner outranks ``[limits]``: a ``swarmd resume`` during a pause ``[limits]`` began waives
that limit's reason (its ``[limits] key``) until it no longer holds, so the next check does not
pause again for it; another reason still pauses.
"""

from __future__ import annotations

import logging
import math
import re
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from swarmd.errors import SwarmdError

if TYPE_CHECKING:
    from swarmd.config import Config
    from swarmd.node.presence import Presence
    from swarmd.training.trainer import Trainer

logger = logging.getLogger(__name__)

MAX_PAUSE_S = 30 * 24 * 3600.0
_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*(s|m|min|h|d)?")
_UNIT_S = {None: 1.0, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}
_LIMIT_KEY = re.compile(r"\[limits\] \w+")


def limit_key(reason: str) -> str:
    """Which limit a ``[limits]`` reason comes from (``"[limits] pause_on_battery"``): what an
    owner's resume waives, whatever the reason's figures say meanwhile."""
    found = _LIMIT_KEY.search(reason)
    return found.group(0) if found else reason


def parse_duration(text: str) -> float:
    """``90``, ``90s``, ``30m``, ``2h``, ``1d`` in seconds; ValueError saying the form otherwise."""
    found = _DURATION.fullmatch(text.strip().lower())
    seconds = float(found.group(1)) * _UNIT_S[found.group(2)] if found else -1.0
    if not 0 < seconds <= MAX_PAUSE_S:
        raise ValueError(f"{text!r} is not a duration of at most 30 days: give e.g. 90s, 30m, 2h or 1d")
    return seconds


@dataclass
class Pause:
    """Whether this peer's work is paused, since when, until when and why."""

    since: float | None = None
    until: float = math.inf
    reason: str = ""

    @property
    def paused(self) -> bool:
        return self.since is not None

    def start(self, now: float, for_s: float | None, reason: str) -> None:
        self.since = self.since if self.since is not None else now
        self.until = now + for_s if for_s is not None else math.inf
        self.reason = reason

    def stop(self) -> None:
        self.since, self.until, self.reason = None, math.inf, ""

    def over(self, now: float) -> bool:
        """A timed pause whose time is up."""
        return self.paused and now >= self.until

    def status(self, now: float) -> dict[str, object] | None:
        if not self.paused:
            return None
        assert self.since is not None
        left = None if math.isinf(self.until) else round(max(0.0, self.until - now), 1)
        return {"since_s": round(now - self.since, 1), "left_s": left, "reason": self.reason}


class PausableNode(Protocol):
    """What pausing changes of a node (``swarmd.node.node.Node``)."""

    config: Config
    roles: list[str]

    @property
    def presence(self) -> Presence | None: ...

    @property
    def trainer(self) -> Trainer | None: ...


class Pausing:
    """The node's pause: the module doc's order of things, and the end of a timed pause."""

    def __init__(self, node: PausableNode) -> None:
        self.node = node
        self.pause = Pause()
        self.automatic = False
        """The pause in force is ``[limits]``'s (``swarmd.node.limits.auto_pause``), not the owner's."""
        self.waived: str | None = None
        """The limit (``limit_key``) the owner resumed over: not paused for again while it holds."""

    async def pause_work(self, for_s: float | None, reason: str) -> dict[str, Any] | None:
        """Offer no work (for ``for_s`` seconds, None: until resumed): every cell and shard is
        handed back first, then the heartbeat says so. Pausing again changes the end."""
        node = self.node
        if not node.config.compute.train:
            raise SwarmdError("this daemon does not train ([compute] train = false): there is nothing to pause")
        first = not self.pause.paused
        self.pause.start(time.time(), for_s, reason)
        if first:
            logger.info("Paused (%s): handing our cells and shards back", reason)
            # Handed back while still named: the last steps reach the standbys, which take the
            # shards over only once the heartbeat says we paused (as at shutdown, then leaving).
            if node.trainer is not None:
                await node.trainer.pause()
            node.roles = ["paused"]
            if node.presence is not None:
                await node.presence.publish_heartbeat()  # the others stop naming us at their next scan
        return self.pause.status(time.time())

    async def owner_pauses(self, for_s: float | None) -> dict[str, Any] | None:
        self.automatic = False  # the owner's now: [limits] does not end it
        return await self.pause_work(for_s, "asked by the owner")

    async def follow_limits(self, reason: str | None) -> None:
        """``[limits]``'s reason to pause now (None: none): pause for it, or end a pause it began."""
        key = None if reason is None else limit_key(reason)
        if self.waived is not None and key != self.waived:
            logger.info("%s no longer holds: it may pause this peer again", self.waived)
            self.waived = None
        if key is not None and key == self.waived:
            reason = None  # the owner resumed over it
        if reason is not None and not self.pause.paused:
            self.automatic = True
            await self.pause_work(None, reason)
        elif reason is not None and self.automatic:
            self.pause.reason = reason
        elif reason is None and self.automatic:
            await self.resume_work()

    async def owner_resumes(self) -> str | None:
        """``swarmd resume``: work again; a pause ``[limits]`` began waives its limit while it holds
        (returned, so the owner is told)."""
        if self.pause.paused and self.automatic:
            self.waived = limit_key(self.pause.reason)
            logger.info("Resumed by the owner while %s holds: not pausing for it until it ends", self.waived)
        await self.resume_work()
        return self.waived

    async def resume_work(self) -> None:
        self.automatic = False
        if not self.pause.paused:
            return
        node = self.node
        self.pause.stop()
        logger.info("Resumed: offering work again")
        node.roles = ["worker"]
        if node.trainer is not None:
            node.trainer.resume()
        if node.presence is not None:
            await node.presence.publish_heartbeat()

    async def end_timed_pause(self) -> None:
        if self.pause.over(time.time()):
            await self.resume_work()

    def status(self) -> dict[str, object] | None:
        return self.pause.status(time.time())
