"""A reduction group's head relays the deltas down: what its cell pulled, kept for the members' pulls.

The slices go up through the head (``reducer``); the deltas come back the same way
(``PullFromHead``): the head's cell pulls each shard it heads from the server as every cell
does, and hands what came (``offer``) to a **relay** that keeps the last
``HEAD_KEEP_VERSIONS`` deltas as they came (no decoding) and the committed share IDs the
server reported; the members long-poll the relay. The head's pulls ask the server about its
members' pending share IDs too (those of the sums it sent, ``ask``, and those the members ask
about), so a member learns its commits from its head. A step the server drops gives its
shares back: the head's pull comes back with them ``unknown``, and a member's long poll that
waits on one the head had delivered ends at once (once per delivery), as the server's own long
polls end on a drop; one still on its way is unknown too, and does not end it (it would spin
the member's polls until it lands). Such a give-back also ends every member's wait once, as a
drop ends every wait at the server: a poll sent before the member's shares went up does not
name them, and the next one does. A pull the relay cannot answer (a new cell, or one further
behind than it keeps) is refused ``UNAVAILABLE``: the member pulls from the server.

``head_for`` is the check both directions share: the plan in force places the sender's cell,
and a cell here heads the shard for the sender's group.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict, deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from swarmd.peers.taskpool.assignment import Assignment
from swarmd.peers.taskpool.cells import Cell
from swarmd.peers.taskpool.reduction import HEAD_KEEP_VERSIONS, head_of
from swarmd.peers.wire.errors import NotHolder, Unavailable
from swarmd.peers.wire.messages import MAX_WAIT_S, Pulled, PullFromHead, Reduce

MAX_RELAY_IDS = 65_536
"""Share IDs a relay remembers as committed, and as asked about (oldest forgotten first)."""


class HeadCell(Protocol):
    """What the head's side reads of the cell that heads a shard here (a ``CellWorker``)."""

    def round_seconds(self) -> float: ...


class HeadsView(Protocol):
    """What a head reads of the pool: the plan in force and who holds each cell."""

    @property
    def assignment(self) -> Assignment | None: ...

    def cell_holder(self, cell: Cell) -> str | None: ...


def head_for(assignment: Assignment | None, cells: Mapping[Cell, HeadCell], request: Reduce | PullFromHead) -> int:
    """The pipeline of the cell here that heads the request's shard for the sender's group
    (``NotHolder`` when the plan in force places no such cell, or none here heads it)."""
    a = assignment
    if a is None or request.pipeline >= a.pipelines or request.stage >= a.stages:
        raise NotHolder(f"no plan here places cell ({request.pipeline}, {request.stage})")
    if request.shards != a.shard_counts()[request.stage]:
        raise NotHolder(
            f"stage {request.stage} has {a.shard_counts()[request.stage]} shards in the plan "
            f"in force here, not {request.shards}"
        )
    head = head_of(request.pipeline, a.pipelines, a.group_size(request.stage), request.shard)
    if head is None or (head, request.stage) not in cells:
        raise NotHolder(
            f"this peer does not head shard ({request.stage}, {request.shard}) for pipeline "
            f"{request.pipeline}'s group; send the slice to the shard's server"
        )
    return head


@dataclass
class _Relay:
    """One shard's deltas as the head's cell pulled them, for the group's members."""

    version: int = -1
    deltas: deque[tuple[int, bytes]] = field(default_factory=lambda: deque(maxlen=HEAD_KEEP_VERSIONS))
    committed: OrderedDict[int, None] = field(default_factory=OrderedDict)
    asked: OrderedDict[int, None] = field(default_factory=OrderedDict)
    """Members' share IDs not known committed yet: the head's pulls ask the server about them."""
    unknown: frozenset[int] = frozenset()
    """The share IDs the server did not hold at the head's last pull (a step it dropped gave
    them back): a member that asks about one is told, and sends its slice again."""
    delivered: OrderedDict[int, None] = field(default_factory=OrderedDict)
    """Share IDs the server took from this head and that have not turned up unknown since: one
    that does was given back by a step the server dropped (module doc)."""
    give_backs: int = 0
    """The head's pulls that brought such IDs back: each ends every member's wait once (a poll
    sent before its shares went up does not name them; the next one does)."""
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)


def _remember(ids: OrderedDict[int, None], new: list[int]) -> None:
    for i in new:
        ids[i] = None
        ids.move_to_end(i)
    while len(ids) > MAX_RELAY_IDS:
        ids.popitem(last=False)


@dataclass
class RelayStats:
    pulls: int = 0
    """Members' pulls answered from a relay."""
    pulls_refused: int = 0
    """Members' pulls sent to the server (the relay was new, or they were too far behind)."""


class HeadRelays:
    """This peer's relays, one per shard its cells head; ``cells``: the cells this peer holds."""

    def __init__(self, pool: HeadsView, cells: Mapping[Cell, HeadCell]) -> None:
        self._pool = pool
        self._cells = cells
        self.relays: dict[tuple[int, int], _Relay] = {}
        self.stats = RelayStats()

    def _relay(self, stage: int, shard: int) -> _Relay:
        relay = self.relays.get((stage, shard))
        if relay is None:
            relay = self.relays[(stage, shard)] = _Relay()
        return relay

    def ask(self, stage: int, shard: int, share_ids: list[int]) -> None:
        """Members' share IDs sent up in a sum: the head's next pulls ask the server about them."""
        relay = self._relay(stage, shard)
        _remember(relay.asked, [i for i in share_ids if i not in relay.committed])

    def delivered(self, stage: int, shard: int, share_ids: list[int]) -> None:
        """The server took these share IDs from this head (a sum, or a slice forwarded alone)."""
        relay = self._relay(stage, shard)
        _remember(relay.delivered, share_ids)
        relay.unknown = relay.unknown.difference(share_ids)  # known there now, whatever a pull said before

    def asked(self, stage: int, shard: int) -> list[int]:
        """Members' share IDs of this shard to ask the server about (the head's pulls carry them)."""
        relay = self.relays.get((stage, shard))
        return [] if relay is None else list(relay.asked)

    async def offer(self, stage: int, shard: int, answer: Pulled, blobs: list[bytes]) -> None:
        """What the head's cell pulled of a shard it heads: kept for the members' pulls."""
        relay = self._relay(stage, shard)
        _remember(relay.committed, answer.committed)
        given_back = any(i in relay.delivered and i not in relay.unknown for i in answer.unknown)
        relay.give_backs += given_back  # news once, not at every pull that still finds them unknown
        relay.unknown = frozenset(answer.unknown)
        for i in answer.committed:
            relay.asked.pop(i, None)
        if answer.kind == "full":
            relay.deltas.clear()  # members further behind than this pull from the server
            relay.version = answer.version
        elif answer.kind == "deltas":
            if relay.version >= 0 and answer.versions[0] != relay.version + 1:
                relay.deltas.clear()
            relay.deltas.extend(zip(answer.versions, blobs, strict=True))
            relay.version = answer.versions[-1]
        elif answer.version < relay.version:  # the server is another lineage now: start over
            relay.deltas.clear()
            relay.version = -1
        async with relay.changed:
            relay.changed.notify_all()

    async def pull(self, sender: str, request: PullFromHead) -> tuple[Pulled, list[bytes]]:
        """A member's long poll of a shard this peer's cell heads, answered from its relay."""
        head_for(self._pool.assignment, self._cells, request)
        if sender != self._pool.cell_holder((request.pipeline, request.stage)):
            raise NotHolder(
                f"{sender[:16]} does not hold cell ({request.pipeline}, {request.stage}) here; "
                "pull from the shard's server"
            )
        relay = self._relay(request.stage, request.shard)
        have = request.have_version
        if have < 0:
            self.stats.pulls_refused += 1
            raise Unavailable(f"a whole slice of shard ({request.stage}, {request.shard}) comes from its server")
        pending = request.pending_share_ids
        _remember(relay.asked, [i for i in pending if i not in relay.committed])

        def given_back() -> list[int]:
            return [i for i in pending if i in relay.unknown and i in relay.delivered]

        give_backs = relay.give_backs

        def news() -> bool:
            return (
                relay.version > have
                or any(i in relay.committed for i in pending)
                or bool(given_back())
                or relay.give_backs != give_backs
            )

        if request.wait_s > 0 and not news():
            async with relay.changed:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(relay.changed.wait_for(news), min(request.wait_s, MAX_WAIT_S))
        if relay.version < have:  # this head has nothing yet, or is behind the cell: the server answers
            self.stats.pulls_refused += 1
            raise Unavailable(
                f"this head holds shard ({request.stage}, {request.shard}) at version {relay.version}, "
                f"behind the cell's {have}; pull from the shard's server"
            )
        newer = [(v, blob) for v, blob in relay.deltas if v > have]  # none when the head is at the cell's
        if relay.version > have and (not newer or newer[0][0] != have + 1):
            self.stats.pulls_refused += 1
            raise Unavailable(
                f"shard ({request.stage}, {request.shard}) at version {have} is further behind than "
                f"this head keeps (from {newer[0][0] if newer else relay.version}); pull from the "
                "shard's server"
            )
        self.stats.pulls += 1
        for i in given_back():
            relay.delivered.pop(i)  # told once: until it is delivered again, it does not end a wait
        answer = Pulled(
            version=relay.version,
            kind="deltas" if newer else "none",
            versions=[v for v, _ in newer],
            committed=[i for i in pending if i in relay.committed],
            unknown=[i for i in pending if i in relay.unknown],
        )
        return answer, [blob for _, blob in newer]

    def info(self) -> dict[str, Any]:
        return {"pulls": self.stats.pulls, "pulls_refused": self.stats.pulls_refused}
