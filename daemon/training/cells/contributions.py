"""A cell's contributions: one per round, a slice to each shard of its stage, kept until committed.

At the end of a round the cell hands its gradient (or pseudo-gradient) here. It is cut into
the stage's shard slices, each encoded in the codec its server's link calls for (int8 with
error feedback on a slow link) and sent (``Contribute``). A slice is kept until its shard
reports the round's share IDs committed (the cell's pulls ask, ``Puller``); if the shard's
holder changes first, the slice goes again to the new holder, which takes it once (share IDs).
A slice its holder reports ``unknown`` after taking it (a step it dropped as non-finite gave
the shares back) goes again to that holder too.
Once every shard of stage 0 has committed a round, its stage-0 cell tells the ledger the
shares are complete.

Where the plan groups the stage's pipelines, a slice goes to its group's head for that shard
(``Reduce``, ``swarmd.training.shards.reducer``), which answers with what the server answered the
group's sum; a slice whose head fails it goes to the server itself from then on.

A cell that stops (the plan moved it) with slices not yet delivered hands them over to
``deliver_rest``: it goes on sending them to their shards' holders as the pool shows them, for
up to ``REST_DELIVERY_S``. Before, a slice whose shard was moving at the same moment had no
holder to go to while the cell drained, and it was dropped with no word; its stage-0 twin was
committed and its shares completed, so that stage never learned from that batch (a two-daemon
run left the reference's trajectory there, and ended 0.11 nats behind it).

Backpressure: a cell may start a round only when the previous one is delivered (``room``): a
slow link slows its cell rather than piling contributions up. Rounds may wait to be committed
for long (a server steps once the whole batch is in, from every pipeline), so only the newest
``KEEP_BLOBS`` keep their slices for a resend; an older one whose server changes hands before
committing it is given up, and its shares, never reported complete, are trained again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypedDict

import torch

from swarmd.peers.taskpool.exchange import shard_range
from swarmd.peers.taskpool.tickets import TICKET_BYTES, TicketError, pack_tickets
from swarmd.peers.wire.codecs import ErrorFeedback
from swarmd.peers.wire.errors import AlreadyApplied, BadRequest, RpcError, Stale
from swarmd.peers.wire.messages import Contribute, Contributed, LedgerComplete, Reduce
from swarmd.peers.wire.sizes import codec_for
from swarmd.training.cells.cell_facts import CellFacts, Sends, Views

logger = logging.getLogger(__name__)

KEEP_BLOBS = 2
MAX_TRACKED = 256
"""Rounds waiting to be committed at most (their share IDs only: a few bytes each)."""
DELIVER_TIMEOUT_S = 120.0
RETRY_S = (0.25, 4.0)
REST_DELIVERY_S = 120.0
"""How long a stopped cell's undelivered slices are offered to their shards' holders: a shard
that moves opens at its new holder within ``OPEN_GRACE_S`` (60 s)."""
REST_POLL_S = 0.5


@dataclass
class _Round:
    share_ids: list[int]
    tickets: bytes
    """The shares' tickets, packed, in the order of ``share_ids`` (b"": some share had none)."""
    micro_batches: int
    bases: list[int]
    blobs: list[bytes]
    codecs: list[str]
    delivered_to: list[str | None]
    committed: list[bool]
    dropped: list[bool] = field(default_factory=list)
    direct: list[bool] = field(default_factory=list)
    """Slices that go straight to the server: their reduction head failed them once."""
    lost: bool = False
    """A slice could not be resent (its blob was let go): the shares are trained again."""
    unstepped: set[int] = field(default_factory=set)
    """Shards that answered the slice with no step on it: buffered it, had its shares already
    (in an earlier step), or refused it."""

    @property
    def delivered(self) -> bool:
        return all(d is not None or c for d, c in zip(self.delivered_to, self.committed, strict=True))

    @property
    def done(self) -> bool:
        return self.lost or all(self.committed)


@dataclass
class ContributionStats:
    rounds: int = 0
    sent: int = 0
    resent: int = 0
    dropped: int = 0
    """Slices a server refused (too stale, malformed): their work is not applied."""
    committed_rounds: int = 0
    lost: int = 0
    """Rounds given up (a server changed hands before committing them): their shares are trained again."""
    bytes_sent: int = 0
    direct: int = 0
    """Slices sent to the server after their reduction head failed them."""


def _cancel_requested() -> bool:
    """Whether this task was asked to stop, even if the cancel itself was swallowed."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


class ContributingCell(Sends, Views, Protocol):
    """What the contributions use of their cell: its way to its peers, its view, whether it stopped."""


class _SliceFields(TypedDict):
    """What a slice's ``Contribute`` and ``Reduce`` share (``Reduce`` adds the pipeline)."""

    run_id: str
    stage: int
    shard: int
    shards: int
    share_ids: list[int]
    base_version: int
    micro_batches: int
    kind: str
    codec: str
    tickets: int


class Contributions:
    def __init__(self, facts: CellFacts, cell: ContributingCell, link_Bps: Callable[[str], float]) -> None:
        """``link_Bps`` is a peer's link rate: it picks each slice's codec."""
        self.facts, self.cell, self.link_Bps = facts, cell, link_Bps
        self.rounds: list[_Round] = []
        self.stats = ContributionStats()
        self._feedback = ErrorFeedback()
        self._wake = asyncio.Event()
        self._changed = asyncio.Event()
        self.progress = asyncio.Event()
        """Set whenever a slice is delivered or a round committed: what a cell waiting for room waits on."""
        self._servers: Callable[[], list[str | None]] = lambda: self.cell.view.servers
        self._rest = False  # the cell stopped: its slices go straight to the servers the pool shows

    def start(self) -> list[asyncio.Task[None]]:
        return [asyncio.create_task(self._deliver_loop(), name=f"cell {self.facts.cell} contributions")]

    # --- the cell's side ----------------------------------------------------------------------

    def add(
        self, share_ids: list[int], tickets: list[str], vector: torch.Tensor, micro_batches: int, bases: list[int]
    ) -> None:
        """A round's contribution (its shares, their tickets): cut, encode and queue one slice per shard."""
        shards = len(bases)
        try:
            packed = pack_tickets(tickets)
        except TicketError as e:  # a share fed with no ticket: its servers refuse the round
            logger.warning("cell %s: the round of shares %s lacks tickets (%s)", self.facts.cell, share_ids[:4], e)
            packed = b""
        blobs: list[bytes] = []
        codecs: list[str] = []
        for k in range(shards):
            lo, hi = shard_range(vector.numel(), shards, k)
            to = self._head(k) or (self.cell.view.servers[k] if k < len(self.cell.view.servers) else None)
            codec = codec_for("contribution", self.link_Bps(to or ""), half=self.facts.half)
            blobs.append(self._feedback.encode(k, vector[lo:hi], codec))
            codecs.append(codec)
        self.rounds.append(
            _Round(
                list(share_ids),
                packed,
                micro_batches,
                list(bases),
                blobs,
                codecs,
                [None] * shards,
                [False] * shards,
                [False] * shards,
                [False] * shards,
            )
        )
        self.stats.rounds += 1
        for old in self.rounds[:-KEEP_BLOBS]:
            if old.delivered:
                old.blobs = []  # delivered; too old to be worth a resend
        self._wake.set()

    async def room(self) -> bool:
        """Whether the cell may start another round's shares now."""
        undelivered = [r for r in self.rounds if not r.delivered]
        return not undelivered and len(self.rounds) < MAX_TRACKED

    def open_shares(self) -> list[int]:
        """Share IDs not yet committed everywhere (stage 0 keeps them leased at the ledger)."""
        return [sid for r in self.rounds for sid in r.share_ids]

    def pending_for(self, k: int) -> list[int]:
        return [sid for r in self.rounds if not r.committed[k] for sid in r.share_ids]

    def committed(self, k: int, share_ids: set[int]) -> None:
        """Shard ``k`` reports these share IDs done: rounds wholly in are settled."""
        for r in self.rounds:
            if not r.committed[k] and set(r.share_ids) <= share_ids:
                r.committed[k] = True
        self._settle()

    def unknown(self, k: int, share_ids: set[int], server: str) -> None:
        """Shard ``k``'s holder ``server`` does not hold these share IDs: rounds delivered there
        with any of them go again (a resend it has after all is refused ``AlreadyApplied`` and
        counts as delivered, so a pull answered before a delivery landed costs one send)."""
        for r in self.rounds:
            if not r.committed[k] and r.delivered_to[k] == server and not share_ids.isdisjoint(r.share_ids):
                r.delivered_to[k] = None
                r.unstepped.discard(k)  # its answer is void: the resend's counts
                self._wake.set()

    def servers_changed(self) -> None:
        """The shard holders may have changed: slices delivered to a former holder go again."""
        self._changed.set()
        self._wake.set()

    async def drain(self) -> None:
        """Wait until every round is delivered (on stop)."""
        while self._undelivered():
            await asyncio.sleep(0.1)

    def undelivered(self) -> int:
        """Rounds with a slice no shard holder has taken yet."""
        return sum(not r.delivered for r in self.rounds)

    async def deliver_rest(self, servers: Callable[[], list[str | None]], within_s: float = REST_DELIVERY_S) -> bool:
        """The cell has stopped: deliver what it left undelivered to each shard's holder as
        ``servers`` shows it now (the trainer's view of the pool; the cell's own view no longer
        changes), straight to the server, for up to ``within_s``. True once all is delivered;
        False, with a warning naming the shares, when time ran out."""
        self._servers, self._rest = servers, True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within_s
        while self._undelivered():
            if loop.time() > deadline:
                left = [sid for r in self.rounds if not r.delivered for sid in r.share_ids]
                logger.warning(
                    "cell %s stopped; its contribution for shares %s found no holder of its shards in %.0f s: "
                    "stage %d does not learn from them",
                    self.facts.cell,
                    left[:8],
                    within_s,
                    self.facts.stage,
                )
                return False
            for r in list(self.rounds):
                await self._deliver(r)
            if self._undelivered():
                await asyncio.sleep(REST_POLL_S)
        return True

    # --- delivery -----------------------------------------------------------------------------

    async def _deliver_loop(self) -> None:
        # Ends once the cell stops and its stop's drain is over (nothing left to deliver, or the
        # cell cancelled this task), not by cancel alone: on Python 3.11 ``asyncio.wait_for``
        # swallows a cancel that arrives as the awaited event is set (gh-86296), and a loop that
        # ended only by cancel then ran on and the cell's stop waited for it for ever.
        delay = RETRY_S[0]
        while not self.cell.stopped or (self._undelivered() and not _cancel_requested()):
            self._wake.clear()
            failed = False
            for r in list(self.rounds):
                failed |= not await self._deliver(r)
            if failed:
                await asyncio.sleep(delay)
                delay = min(delay * 2, RETRY_S[1])
                continue
            delay = RETRY_S[0]
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), 1.0)

    def _undelivered(self) -> bool:
        return any(not r.delivered for r in self.rounds)

    async def _deliver(self, r: _Round) -> bool:
        """Send every slice not yet at its shard's current holder; False if one failed."""
        servers = self._servers()
        todo = [
            k
            for k in range(len(r.committed))
            if not r.committed[k] and k < len(servers) and servers[k] is not None and r.delivered_to[k] != servers[k]
        ]
        if todo and not r.blobs:  # its server changed hands and we let the slices go
            r.lost = True
            self.stats.lost += 1
            self._settle()
            return True
        results = await asyncio.gather(*(self._send_slice(r, k, servers[k]) for k in todo))  # type: ignore[arg-type]
        return all(results)

    def _head(self, k: int) -> str | None:
        if self._rest:
            return None  # the group's round is over for this cell: straight to the server
        heads = self.cell.view.heads
        return heads[k] if k < len(heads) else None

    async def _send_slice(self, r: _Round, k: int, server: str) -> bool:
        """Send slice ``k`` to its reduction head (``swarmd.training.shards.reducer``), which answers
        with what the server answered, or, when there is none or it failed this slice once,
        to the server itself."""
        cell, facts = self.cell, self.facts
        fields = _SliceFields(
            run_id=facts.run_id,
            stage=facts.stage,
            shard=k,
            shards=len(r.committed),
            share_ids=r.share_ids,
            base_version=r.bases[k],
            micro_batches=r.micro_batches,
            kind="gradient" if facts.settings.mode == "gradient" else "pseudo",
            codec=r.codecs[k],
            tickets=len(r.tickets) // TICKET_BYTES,
        )
        head = None if r.direct[k] else self._head(k)
        request = Contribute(**fields) if head is None else Reduce(**fields, pipeline=facts.pipeline)
        again = r.delivered_to[k] is not None
        try:
            blobs = [r.blobs[k], r.tickets] if r.tickets else [r.blobs[k]]
            answer, _ = await cell.send(head or server, request, blobs, DELIVER_TIMEOUT_S)
        except AlreadyApplied:
            # The server has this round's shares already (our first try got there and its answer
            # was lost, or the shard's new holder took them from the old one's log): delivered;
            # the pulls report them committed.
            logger.debug("cell %s: shard %d had shares %s already", facts.cell, k, r.share_ids[:4])
            return self._delivered(r, k, server, None, again)
        except (BadRequest, Stale) as e:
            # Refused for good (malformed, or from a lineage the server cannot use): nothing to
            # wait for; the round's work on this slice is not applied.
            logger.info("cell %s: shard %d refused a contribution (%s); dropped", facts.cell, k, e)
            r.committed[k], r.dropped[k] = True, True
            r.unstepped.add(k)
            self.stats.dropped += 1
            self._settle()
            return True
        except RpcError as e:
            if head is not None:
                # The head is gone, or no longer heads this shard: the server takes the slice
                # once, whether or not the head's sum of it got there first.
                logger.debug(
                    "cell %s: reduction head %s failed slice %d (%s); sending it to the server",
                    facts.cell,
                    head[:16],
                    k,
                    e,
                )
                r.direct[k] = True
                self.stats.direct += 1
            else:
                logger.debug("cell %s: contribution to shard %d at %s failed (%s); retrying", facts.cell, k, server, e)
            return False
        return self._delivered(r, k, server, answer, again)

    def _delivered(self, r: _Round, k: int, server: str, answer: Contributed | None, again: bool) -> bool:
        r.delivered_to[k] = server
        self.progress.set()
        self.stats.sent += 1
        self.stats.resent += again
        self.stats.bytes_sent += len(r.blobs[k])
        if answer is not None and answer.committed:
            r.committed[k] = True
            self._settle()
        else:
            r.unstepped.add(k)
        return True

    def step_awaits_more(self) -> bool:
        """Whether every shard answered the newest round with no step on it: their next steps
        wait for more rounds, another pipeline's or this cell's next."""
        r = self.rounds[-1] if self.rounds else None
        return r is not None and len(r.unstepped) == len(r.committed)

    async def wait_for_room(self, timeout_s: float) -> bool:
        """Wait until ``room`` (or ``timeout_s``): woken by progress, not by polling."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while not await self.room():
            left = deadline - loop.time()
            if left <= 0:
                return False
            self.progress.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.progress.wait(), left)
        return True

    def _settle(self) -> None:
        self.progress.set()
        while self.rounds and self.rounds[0].done:
            r = self.rounds.pop(0)
            self.stats.committed_rounds += not r.lost
            ledger = self.cell.view.ledger
            if self.facts.is_first and ledger is not None and not r.lost:
                request = LedgerComplete(run_id=self.facts.run_id, pipeline=self.facts.pipeline, share_ids=r.share_ids)
                self.cell.tell(ledger, request)

    def info(self) -> dict[str, Any]:
        s = self.stats
        return {
            "waiting": len(self.rounds),
            "rounds": s.rounds,
            "sent": s.sent,
            "resent": s.resent,
            "dropped": s.dropped,
            "committed_rounds": s.committed_rounds,
            "lost": s.lost,
            "bytes_sent": s.bytes_sent,
            "direct": s.direct,
        }
