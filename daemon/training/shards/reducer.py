"""A reduction group's head sums the slices on the way up: the group's slices of a shard go to the server once.

Where the plan groups a stage's pipelines (``swarmd.peers.taskpool.reduction``), each cell sends
its slice of shard ``k`` to the cell of its group that heads ``k`` (``Reduce``), not to the
server. The head keeps the slices of a shard in one bucket; the bucket goes when every live
member of the group has sent one, or ``reduce_wait_s`` after the first came, and those whose
bases ``summable`` takes go as one sum at the oldest of their bases (the rest alone):

- one slice: forwarded as it came (no decoding, no second rounding);
- several: their mean weighted by micro-batches, encoded for the head's link to the server
  (int8 with error feedback kept here on a slow link), sent as one ``Contribute`` of ``parts``
  cells covering all their shares. If the server refuses the sum (``AlreadyApplied``: a member
  sent a part by itself meanwhile; or a part is malformed or too large), the parts go one by
  one, each answered as the server answers it.

A member's slice is taken only from the holder of its cell, for no more micro-batches than its
shares hold (its weight in the sum); the server screens the sum as it screens any contribution.

Every member waits for its answer: it counts its slice delivered only when the server took it,
so a head that dies mid-reduction leaves its members' requests failed, and they send their
slices straight to the server (``Contributions``), which takes each once.

The deltas go back the same way, through the head's relay (``head_relay``): the share IDs of
every sum sent are handed to it (``ask``), so that the head's pulls ask the server about them,
and those the server took (``delivered``), so that a step it drops wakes the members at once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from swarmd.peers.taskpool.cells import Cell
from swarmd.peers.taskpool.exchange import ExchangeConfig, shard_range
from swarmd.peers.taskpool.reduction import group_of, mean_factors, reduce_wait_s, summable
from swarmd.peers.taskpool.servers import Shard
from swarmd.peers.taskpool.tickets import TicketVerifier
from swarmd.peers.wire.codecs import ErrorFeedback, decode_vector
from swarmd.peers.wire.errors import AlreadyApplied, BadRequest, FrameError, NotHolder, RpcError, Stale, Unavailable
from swarmd.peers.wire.messages import MAX_SHARE_IDS, Contribute, Contributed, Reduce
from swarmd.peers.wire.sizes import codec_for
from swarmd.training.run_facts import Send
from swarmd.training.shards.contributors import ticket_error
from swarmd.training.shards.head_relay import HeadCell, HeadRelays, HeadsView, head_for

logger = logging.getLogger(__name__)

FORWARD_TIMEOUT_S = 120.0
"""A head's contribution to the server: as long as a cell's own (``contributions.DELIVER_TIMEOUT_S``)."""
STOP_WAIT_S = 10.0
"""On stop, how long the sums on their way may take before they are cancelled (their members
then send their slices to the server themselves)."""
MAX_BUCKETS = 256
"""Buckets open at once (a shard, a base version each): a group's members build on a version or
two, so more is a member that sends nonsense; past it, the oldest bucket goes at once."""


@dataclass
class _Part:
    request: Reduce
    blob: bytes
    vector: torch.Tensor
    tickets: bytes
    """Its shares' tickets, packed: they go with it, alone or in a sum."""
    waiters: list[asyncio.Future[Contributed]] = field(default_factory=list)


@dataclass
class _Bucket:
    key: tuple[int, int, int, str]
    head: int
    """The pipeline of the cell that heads this shard here."""
    parts: dict[int, _Part] = field(default_factory=dict)
    """By the sender's pipeline."""
    timer: asyncio.TimerHandle | None = None


class ReducerPool(HeadsView, Protocol):
    """What a head reads of the pool besides the plan and the cells' holders."""

    def shard_holder(self, key: Shard) -> str | None: ...

    def exchange_settings(self) -> ExchangeConfig: ...

    def ledger_keepers(self) -> Sequence[str]: ...


@dataclass
class ReducerStats:
    slices: int = 0
    """Members' slices taken."""
    sums: int = 0
    """Contributions of two slices or more sent to a server."""
    summed: int = 0
    """Slices that went in those sums."""
    singles: int = 0
    """Slices forwarded alone (nobody else's came in time, or a sum was refused)."""
    refused_sums: int = 0
    bytes_sent: int = 0


class Reducer:
    """This peer's side of the reduction groups whose shards its cells head.

    ``cells``: the cells this peer holds (a head's); ``relays``: where the deltas go down;
    ``stage_size``: a stage's parameters; ``link_Bps``: the measured link from here to a peer;
    ``half``: the wire's half precision."""

    def __init__(
        self,
        pool: ReducerPool,
        cells: Mapping[Cell, HeadCell],
        relays: HeadRelays,
        stage_size: Callable[[int], int],
        send: Send,
        link_Bps: Callable[[str], float],
        half: str,
    ) -> None:
        self._pool = pool
        self._cells = cells
        self.relays = relays
        self._stage_size = stage_size
        self._send = send
        self._link_Bps = link_Bps
        self._half = half
        self.buckets: dict[tuple[int, int, int, str], _Bucket] = {}
        self.stats = ReducerStats()
        self._feedback = ErrorFeedback()
        self._tasks: set[asyncio.Task[None]] = set()
        self.tickets = TicketVerifier()

    # --- members' slices ----------------------------------------------------------------------

    async def reduce(self, sender: str, request: Reduce, blob: bytes, tickets: bytes) -> Contributed:
        head = head_for(self._pool.assignment, self._cells, request)
        head_cell = self._cells[(head, request.stage)]
        if sender != self._pool.cell_holder((request.pipeline, request.stage)):
            raise NotHolder(
                f"{sender[:16]} does not hold cell ({request.pipeline}, {request.stage}) here; "
                "send the slice to the shard's server"
            )
        if request.parts != 1:
            raise BadRequest(f"a member sends its own slice (parts = 1), not {request.parts}")
        # A part's weight in the sum is its micro-batches: a claim its shares cannot hold would
        # outweigh the group (the server bounds the sum's claim the same way, ``ShardServer.admit``).
        settings = self._pool.exchange_settings()
        most = max(settings.share_micro_batches, settings.batch_micro_batches)
        if request.micro_batches > most * len(request.share_ids):
            raise BadRequest(
                f"a slice for {len(request.share_ids)} share(s) claims {request.micro_batches} micro-batches; "
                f"at most {most} per share"
            )
        # The server refuses a sum with one member's bad tickets, and counts it against the head:
        # the member's are checked here first (the shares of its own pipeline only).
        keepers = list(self._pool.ledger_keepers())
        if (error := await ticket_error(self.tickets, request, tickets, [request.pipeline], keepers)) is not None:
            raise BadRequest(f"slice of shard ({request.stage}, {request.shard}): {error} ({error.reason})")
        lo, hi = shard_range(self._stage_size(request.stage), request.shards, request.shard)
        try:
            vector = await asyncio.to_thread(decode_vector, blob, hi - lo, request.codec)
        except FrameError as e:
            raise BadRequest(f"slice of shard ({request.stage}, {request.shard}): {e}") from None
        key = (request.stage, request.shard, request.shards, request.kind)
        bucket = self.buckets.get(key)
        if bucket is None:
            if len(self.buckets) >= MAX_BUCKETS:
                self._flush(next(iter(self.buckets.values())))
            bucket = self.buckets[key] = _Bucket(key, head)
            loop = asyncio.get_running_loop()
            bucket.timer = loop.call_later(reduce_wait_s(head_cell.round_seconds()), self._flush, bucket)
        part = bucket.parts.get(request.pipeline)
        if part is None or part.request.share_ids != request.share_ids:
            if part is not None:  # a newer round of the same member: the older goes by itself
                self._spawn(self._send_parts([part], request.stage, request.shard))
            part = bucket.parts[request.pipeline] = _Part(request, blob, vector, tickets)
        waiter: asyncio.Future[Contributed] = asyncio.get_running_loop().create_future()
        part.waiters.append(waiter)  # a resend of the same slice waits on the same sum
        self.stats.slices += 1
        if len(bucket.parts) >= self._expected(request.stage, head):
            self._flush(bucket)
        return await waiter

    def _expected(self, stage: int, head: int) -> int:
        """The group's members whose cell of ``stage`` someone holds now."""
        a = self._pool.assignment
        if a is None:
            return 1
        members = group_of(head, a.pipelines, a.group_size(stage))
        return max(1, sum(self._pool.cell_holder((p, stage)) is not None for p in members))

    # --- sums to the server -------------------------------------------------------------------

    def _flush(self, bucket: _Bucket) -> None:
        if self.buckets.get(bucket.key) is not bucket:
            return  # gone already (full, then its timer)
        del self.buckets[bucket.key]
        if bucket.timer is not None:
            bucket.timer.cancel()
        stage, shard = bucket.key[0], bucket.key[1]
        # By pipeline, not by arrival: float addition is not associative, so a sum taken in
        # arrival order would differ in its last bits from one run to the next.
        parts = [bucket.parts[pipeline] for pipeline in sorted(bucket.parts)]
        chosen, _ = summable([p.request.base_version for p in parts])
        for i, part in enumerate(parts):
            if i not in chosen:  # too far behind the others' base to share their staleness
                self._spawn(self._send_parts([part], stage, shard))
        chunk: list[_Part] = []
        for part in [parts[i] for i in chosen]:
            if chunk and sum(len(p.request.share_ids) for p in chunk) + len(part.request.share_ids) > MAX_SHARE_IDS:
                self._spawn(self._send_parts(chunk, stage, shard))
                chunk = []
            chunk.append(part)
        if chunk:
            self._spawn(self._send_parts(chunk, stage, shard))

    def _server(self, stage: int, shard: int) -> str:
        holder = self._pool.shard_holder((stage, shard))
        if holder is None:
            raise Unavailable(f"no holder of shard ({stage}, {shard}) is known here yet")
        return holder

    def _spawn(self, coroutine: Any) -> None:
        task = asyncio.create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _send_parts(self, parts: list[_Part], stage: int, shard: int) -> None:
        share_ids = [i for p in parts for i in p.request.share_ids]
        self.relays.ask(stage, shard, share_ids)
        if len(parts) > 1:
            try:
                answer = await self._send_sum(parts, stage, shard)
            except (AlreadyApplied, BadRequest, Stale) as e:
                self.stats.refused_sums += 1
                logger.info(
                    "shard (%d, %d) refused a sum of %d slices (%s); sending them one by one",
                    stage,
                    shard,
                    len(parts),
                    e,
                )
            except RpcError as e:
                for part in parts:
                    _fail(part, e)
                return
            else:
                self.stats.sums += 1
                self.stats.summed += len(parts)
                self.relays.delivered(stage, shard, share_ids)
                for part in parts:
                    _answer(part, answer)
                return
        await asyncio.gather(*(self._send_single(part, stage, shard) for part in parts))

    async def _send_single(self, part: _Part, stage: int, shard: int) -> None:
        request = Contribute(**{k: v for k, v in part.request.to_fields().items() if k != "pipeline"})
        try:
            answer, _ = await self._send(
                self._server(stage, shard), request, [part.blob, part.tickets], FORWARD_TIMEOUT_S
            )
        except RpcError as e:
            _fail(part, e)
            return
        self.stats.singles += 1
        self.stats.bytes_sent += len(part.blob)
        self.relays.delivered(stage, shard, part.request.share_ids)
        _answer(part, answer)

    async def _send_sum(self, parts: list[_Part], stage: int, shard: int) -> Contributed:
        server = self._server(stage, shard)
        first = parts[0].request
        factors = mean_factors([p.request.micro_batches for p in parts])
        total = torch.zeros_like(parts[0].vector)
        for part, factor in zip(parts, factors, strict=True):
            total.add_(part.vector, alpha=factor)
        codec = codec_for("contribution", self._link_Bps(server), half=self._half)
        key = (stage, shard)
        before = self._feedback.residual(key)
        blob = bytes(await asyncio.to_thread(self._feedback.encode, key, total, codec))
        request = Contribute(
            run_id=first.run_id,
            stage=stage,
            shard=shard,
            shards=first.shards,
            share_ids=[i for p in parts for i in p.request.share_ids],
            base_version=min(p.request.base_version for p in parts),
            micro_batches=sum(p.request.micro_batches for p in parts),
            kind=first.kind,
            codec=codec,
            parts=len(parts),
            tickets=sum(p.request.tickets for p in parts),
        )
        tickets = b"".join(p.tickets for p in parts)
        try:
            answer, _ = await self._send(server, request, [blob, tickets], FORWARD_TIMEOUT_S)
        except RpcError:
            self._feedback.put_back(key, before)  # the sum was not taken: neither is its rounding
            raise
        self.stats.bytes_sent += len(blob)
        return answer

    async def stop(self) -> None:
        """Send what is waiting now (members are owed an answer), then end."""
        for bucket in list(self.buckets.values()):
            self._flush(bucket)
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=STOP_WAIT_S)
        for task in list(self._tasks):
            task.cancel()

    def info(self) -> dict[str, Any]:
        s = self.stats
        return {
            "waiting": sum(len(b.parts) for b in self.buckets.values()),
            "slices": s.slices,
            "sums": s.sums,
            "summed": s.summed,
            "singles": s.singles,
            "refused_sums": s.refused_sums,
            "bytes_sent": s.bytes_sent,
            **self.relays.info(),
        }


def _answer(part: _Part, answer: Contributed) -> None:
    for waiter in part.waiters:
        if not waiter.done():
            waiter.set_result(answer)


def _fail(part: _Part, error: BaseException) -> None:
    for waiter in part.waiters:
        if not waiter.done():
            waiter.set_exception(error)
