"""One cell (pipeline p, stage s) at work: shares through the pipeline, one contribution per round.

What a cell does (``docs/data-path.md``, "One round of one pipeline"):

- **Weights.** On opening it pulls its stage's whole slices from the K shard servers; after
  that one long poll per shard (``Puller``) brings the deltas of every committed step. They are
  applied between two shares, never while a micro-batch is in flight here: gradient mode
  takes the servers' weights, local mode rebases its progress onto them.
- **Shares.** Stage 0 asks the ledger for a share and feeds its micro-batches, at most
  ``window`` in flight; each activation goes straight to the next cell, each input gradient
  straight back to the previous one (``CellForward`` / ``CellBackward``), over the router
  (a relay only when the direct path fails or is slower). A cell works backward items first
  (1F1B) and keeps the autograd graph of its own micro-batches in flight. When every
  micro-batch of the share has run its backward here, the share is done at this cell.
- **Rounds.** After the share stage 0 marked ``round_end`` (every H shares), the cell takes its
  contribution (the round's mean gradient, or its pseudo-gradient) and sends one slice to each
  shard (``Contributions``), in the codec its link calls for, then goes on at once.
- **Faults.** Every message carries the pipeline's epoch; when the epoch changes (a cell
  changed hands) the share in flight is dropped everywhere and stage 0 abandons it at the
  ledger, which issues it again. A share that makes no progress for ``SHARE_STALL_S`` is
  abandoned the same way.

The compute (``swarmd.models.cell_compute.CellCompute``) is not thread-safe: every call to it
goes through this cell's one worker thread, in order.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch

from swarmd.models.build import ModelError, ModelShape
from swarmd.models.cell_compute import CellCompute
from swarmd.models.corpus import Dataset
from swarmd.peers.taskpool.cells import Cell
from swarmd.peers.taskpool.exchange import SYNC_WAIT_S, ExchangeConfig, window
from swarmd.peers.wire.codecs import FrameSpec, decode_tensor, encode_tensor
from swarmd.peers.wire.errors import FrameError, RpcError, StreamBroken, Unavailable, Unreachable, WrongEpoch
from swarmd.peers.wire.messages import CellBackward, CellForward, LedgerAbandon, LedgerIssue
from swarmd.peers.wire.protocol import Request
from swarmd.peers.wire.sizes import codec_for
from swarmd.training.contributions import Contributions
from swarmd.training.puller import Puller
from swarmd.training.reducer import Reducer

logger = logging.getLogger(__name__)

T = TypeVar("T")

SHARE_STALL_S = (10.0, 30.0, 120.0)
"""A share with no progress here for this long is abandoned (its pipeline broke in a way no
epoch change showed: a neighbour dropped it after a send failed, or hangs): ten times the
slowest of the recent shares, at least the first figure; the second before any share finished
here; never more than the third. Stage 0 then feeds it again (or another pipeline does)."""
STALL_TIMES = 10.0
SHARES_TIMED = 16
LOAD_WAIT_S = 60.0
SEND_ATTEMPTS = 4
SEND_BACKOFF_S = 0.25
MAX_LOSSES_KEPT = 4096
ISSUE_RETRY_S = 0.5
ABANDON_BACKOFF_S = (0.25, 5.0)
"""Stage 0's wait after a share its pipeline could not finish, doubling while they fail: a
neighbour that is not ready yet is asked again soon, not hundreds of times a second."""

Send = Callable[[str, Request, list[bytes], float], Awaitable[tuple[Any, list[bytes]]]]
"""Sends a request to a peer (direct or through a relay) and returns its answer and blobs."""


@dataclass
class CellView:
    """What the trainer knows of the cell's surroundings, renewed every round of the pool."""

    epoch: str | None = None
    prev: str | None = None
    next: str | None = None
    servers: list[str | None] = field(default_factory=list)
    """The holders of this stage's shards, by shard index."""
    ledger: str | None = None
    """The holder of shard (0, 0), who keeps the share ledger."""
    heads: list[str | None] = field(default_factory=list)
    """By shard index, who reduces this cell's slice of it with its group's (this peer
    included: its own slices go through its reducer too); None: straight to the server."""
    head_pipelines: list[int | None] = field(default_factory=list)
    """By shard index, the pipeline whose cell heads it for this cell's group (None: no group)."""


@dataclass
class _Share:
    share_id: int
    first: int
    count: int
    round_end: bool
    epoch: str
    attempt: int
    done: set[int] = field(default_factory=set)
    started: set[int] = field(default_factory=set)
    progress_at: float = field(default_factory=time.monotonic)
    opened_at: float = field(default_factory=time.monotonic)


@dataclass(order=True)
class _Item:
    priority: int  # backward (0) before forward (1): 1F1B
    seq: int
    kind: str = field(compare=False)
    message: CellForward | CellBackward | None = field(compare=False)
    blob: bytes | None = field(compare=False)
    micro_batch: int = field(compare=False, default=-1)


def _non_finite(vector: torch.Tensor) -> int:
    """How many of the values are NaN or infinite (0 for a contribution fit to send)."""
    return int(vector.numel() - torch.isfinite(vector).sum())


@dataclass
class CellStats:
    shares: int = 0
    abandoned: int = 0
    dropped_rounds: int = 0
    """Rounds whose contribution came out NaN or infinite: never sent, their shares trained again."""
    rounds: int = 0
    forwards: int = 0
    backwards: int = 0
    refused_epoch: int = 0
    send_failures: int = 0
    sync_timeouts: int = 0
    """Rounds that went on without the step of the round before (gradient mode)."""
    seconds: dict[str, float] = field(
        default_factory=lambda: {"compute": 0.0, "codec": 0.0, "waiting": 0.0, "sync": 0.0}
    )


class CellWorker:
    def __init__(
        self,
        cell: Cell,
        stages: int,
        settings: ExchangeConfig,
        compute: CellCompute,
        dataset: Dataset,
        micro_batch: int,
        run_id: str,
        send: Send,
        link_Bps: Callable[[str], float],
        *,
        shape: ModelShape,
        shards: int,
        half: str = "fp16",
    ) -> None:
        self.cell = cell
        self.pipeline, self.stage = cell
        self.stages = stages
        self.settings = settings
        self.compute = compute
        self.dataset = dataset
        self.micro_batch = micro_batch
        self.run_id = run_id
        self._send = send
        self.link_Bps = link_Bps
        self.half = half
        self.shards = shards
        self.view = CellView()
        self.stats = CellStats()
        self.losses: deque[tuple[int, float]] = deque(maxlen=MAX_LOSSES_KEPT)
        self.is_first, self.is_last = self.stage == 0, self.stage == stages - 1
        self.in_spec = FrameSpec.activation(shape, self.stage, micro_batch) if not self.is_first else None
        self.out_spec = FrameSpec.activation(shape, self.stage + 1, micro_batch) if not self.is_last else None
        self._exec = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"cell-{self.pipeline}-{self.stage}")
        self._inbox: asyncio.PriorityQueue[_Item] = asyncio.PriorityQueue(maxsize=4 * window(stages) + 8)
        self._seq = itertools.count()
        self._share: _Share | None = None
        self._round_shares: list[int] = []
        self._shares_in_round = 0
        self._window = asyncio.Semaphore(window(stages))
        self._abandoned_at = -1  # the last share abandoned here
        self._sync_after: list[int] | None = None  # gradient mode: the bases of the round just contributed
        self._attempts = 0  # stage 0: shares fed so far
        self._fed: set[int] = set()  # stage 0: micro-batches in flight, each holding a place in the window
        self._share_done = asyncio.Event()
        self._share_seconds: deque[float] = deque(maxlen=SHARES_TIMED)  # how long recent shares took here
        self._stop = asyncio.Event()
        self.failure: str | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self.puller = Puller(self)
        self.contributions = Contributions(self)
        self.reducer: Reducer | None = None
        """This peer's reducer (``swarmd.training.reducer``), set by the trainer: a cell that heads
        a shard for its group hands it what it pulls."""

    # --- the trainer's side -----------------------------------------------------------------

    def update(self, view: CellView) -> None:
        """The pool's newest view; a new epoch voids the share in flight."""
        if view.epoch != self.view.epoch and self._share is not None:
            logger.info("cell %s: pipeline epoch changed; dropping share %d", self.cell, self._share.share_id)
            self._abandon_share()
        self.view = view
        self.puller.servers_changed()
        self.contributions.servers_changed()

    async def run(self) -> None:
        """Serve until ``stop``: load the weights, then work the pipeline's shares."""
        self._tasks = [asyncio.create_task(self._work(), name=f"cell {self.cell} work")]
        if self.is_first:
            self._tasks.append(asyncio.create_task(self._drive(), name=f"cell {self.cell} shares"))
        self._tasks += self.puller.start() + self.contributions.start()
        for task in self._tasks:
            task.add_done_callback(self._task_ended)
        await self._stop.wait()

    def _task_ended(self, task: asyncio.Task[None]) -> None:
        """A task of this cell ended by itself: only a bug does that; say so, and stop the cell
        (the trainer sees it and the cell is opened afresh)."""
        if task.cancelled() or self._stop.is_set():
            return
        error = task.exception()
        logger.error("cell %s: %s ended (%r); stopping the cell", self.cell, task.get_name(), error, exc_info=error)
        self.failure = f"{task.get_name()}: {type(error).__name__}: {error}"
        self._stop.set()

    async def stop(self, timeout_s: float) -> None:
        """Stop working: send what is contributed, abandon the share in flight, end the tasks."""
        if self._share is not None:
            self._abandon_share()
        self._stop.set()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.contributions.drain(), timeout_s / 2)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._exec.shutdown(wait=False, cancel_futures=True)

    async def send(self, peer: str, request: Request, blobs: list[bytes], timeout_s: float) -> tuple[Any, list[bytes]]:
        return await self._send(peer, request, blobs, timeout_s)

    async def in_thread(self, fn: Callable[..., T], *args: Any, what: str = "compute") -> T:
        """Run ``fn`` on this cell's one worker thread (the compute is not thread-safe)."""
        started = time.perf_counter()
        try:
            return await asyncio.get_running_loop().run_in_executor(self._exec, fn, *args)
        finally:
            self.stats.seconds[what] += time.perf_counter() - started

    # --- messages from the neighbours ---------------------------------------------------------

    async def handle(self, sender: str, message: CellForward | CellBackward, blob: bytes) -> None:
        """A neighbour's activation or gradient: checked, then queued (answered at once)."""
        expected = self.view.prev if isinstance(message, CellForward) else self.view.next
        if message.epoch != self.view.epoch or sender != expected:
            self.stats.refused_epoch += 1
            raise WrongEpoch(
                f"cell {self.cell} is in epoch {str(self.view.epoch)[:12]} with neighbour {str(expected)[:16]}; "
                f"the message is from {sender[:16]} in {message.epoch[:12]}"
            )
        kind = "forward" if isinstance(message, CellForward) else "backward"
        item = _Item(0 if kind == "backward" else 1, next(self._seq), kind, message, blob, message.micro_batch)
        await self._inbox.put(item)  # bounded: a flood waits here, and its sender with it

    # --- stage 0: shares from the ledger --------------------------------------------------------

    async def _drive(self) -> None:
        backoff = 0.0  # after a share the pipeline could not finish (a neighbour not ready yet)
        while not self._stop.is_set():
            if backoff:
                await self._sleep(backoff)
            await self._between_shares()  # the first whole pull too: nothing is in flight here now
            if not await self._ready_to_feed():
                await self._idle()
                continue
            share = await self._issue()
            if share is None:
                await self._sleep(ISSUE_RETRY_S)
                continue
            if not self._round_shares:
                self.puller.round_started()  # the weights applied just now are the round's base
            self._shares_in_round += 1
            round_end = self._shares_in_round >= self.settings.local_steps
            epoch = self.view.epoch
            assert epoch is not None
            # Increasing across this cell's restarts too: a downstream cell may still hold an older try.
            self._attempts = max(self._attempts + 1, int(time.time() * 10))
            self._share = _Share(share[0], share[1], share[2], round_end, epoch, self._attempts)
            self._share_done.clear()
            for m in range(share[1], share[1] + share[2]):
                await self._window.acquire()
                if self._share is None or self._share.share_id != share[0]:
                    self._window.release()
                    break
                self._fed.add(m)
                await self._inbox.put(_Item(1, next(self._seq), "forward", None, None, m))
            await self._share_done.wait()
            finished = self._abandoned_at != share[0]
            backoff = 0.0 if finished else min(max(2 * backoff, ABANDON_BACKOFF_S[0]), ABANDON_BACKOFF_S[1])

    async def _ready_to_feed(self) -> bool:
        v = self.view
        return (
            v.epoch is not None
            and v.ledger is not None
            and (self.is_last or v.next is not None)
            and self.puller.loaded
            and await self.contributions.room()
        )

    async def _issue(self) -> tuple[int, int, int] | None:
        ledger = self.view.ledger
        if ledger is None:
            return None
        request = LedgerIssue(
            run_id=self.run_id, pipeline=self.pipeline, renew=self.contributions.open_shares(), want=1
        )
        try:
            answer, _ = await self.send(ledger, request, [], 30.0)
        except RpcError as e:
            logger.debug("cell %s: no share from the ledger at %s (%s)", self.cell, ledger, e)
            return None
        if not answer.shares:
            return None
        share_id, first, count = answer.shares[0]
        return share_id, first, count

    def _abandon_share(self) -> None:
        share, self._share = self._share, None
        if share is None:
            return
        self._abandoned_at = share.share_id
        self.stats.abandoned += 1
        self._shares_in_round = max(0, self._shares_in_round - 1)
        self._drain_inbox()
        asyncio.create_task(self.in_thread(self.compute.drop_share))
        for _ in self._fed:  # the window's places of what was in flight come back
            self._window.release()
        self._fed.clear()
        self._share_done.set()
        if self.is_first and self.view.ledger is not None:
            request = LedgerAbandon(run_id=self.run_id, pipeline=self.pipeline, share_ids=[share.share_id])
            asyncio.create_task(self._quietly(self.view.ledger, request))

    def _drop_round(self, share_ids: list[int], non_finite: int, elements: int) -> None:
        """A round whose contribution is not finite never leaves this cell (no codec carries it,
        and a server must not step on it): its shares go back to the ledger to be trained
        again. Left open there, they held the pipeline's quota until their lease lapsed
        (``LEASE_S``, ten minutes) and the pipeline stood still."""
        self.stats.dropped_rounds += 1
        logger.warning(
            "cell %s: the round of shares %s came out with %d non-finite values of %d (weights at version %s); "
            "dropping it: its shares are trained again",
            self.cell,
            share_ids,
            non_finite,
            elements,
            self.puller.version,
        )
        if self.is_first and self.view.ledger is not None:
            request = LedgerAbandon(run_id=self.run_id, pipeline=self.pipeline, share_ids=list(share_ids))
            asyncio.create_task(self._quietly(self.view.ledger, request))

    def _drain_inbox(self) -> None:
        while not self._inbox.empty():
            self._inbox.get_nowait()

    async def _quietly(self, peer: str, request: Request) -> None:
        try:
            await self.send(peer, request, [], 10.0)
        except RpcError as e:
            logger.debug("cell %s: %s to %s failed (%s)", self.cell, type(request).__name__, peer, e)

    # --- the work loop ------------------------------------------------------------------------

    async def _work(self) -> None:
        while not self._stop.is_set():
            try:
                item = await asyncio.wait_for(self._inbox.get(), 1.0)
            except TimeoutError:
                self._check_stall()
                continue
            try:
                await self._one(item)
            except (RpcError, FrameError, ModelError) as e:
                # A neighbour gone or refusing, a tensor that failed its checks: this share cannot
                # finish here; stage 0 feeds it again (or another pipeline does).
                logger.info("cell %s: micro-batch %d failed (%s); dropping the share", self.cell, item.micro_batch, e)
                self._abandon_share()

    def round_seconds(self) -> float:
        """How long a round takes here lately (H shares; 0 before the first share is done)."""
        if not self._share_seconds:
            return 0.0
        return self.settings.local_steps * sum(self._share_seconds) / len(self._share_seconds)

    def stall_limit_s(self) -> float:
        """How long a share may make no progress here before it is abandoned (``SHARE_STALL_S``)."""
        floor, unknown, cap = SHARE_STALL_S
        if not self._share_seconds:
            return unknown
        return min(cap, max(floor, STALL_TIMES * max(self._share_seconds)))

    def _check_stall(self) -> None:
        share = self._share
        limit = self.stall_limit_s()
        if share is not None and time.monotonic() - share.progress_at > limit:
            logger.warning(
                "cell %s: share %d made no progress for %.0f s; abandoning it", self.cell, share.share_id, limit
            )
            self._abandon_share()

    async def _one(self, item: _Item) -> None:
        message = item.message
        if message is not None:
            if message.epoch != self.view.epoch:
                return  # queued before the epoch changed
            current = self._share
            if item.kind == "forward" and (
                current is None or current.share_id != message.share_id or current.attempt < message.attempt
            ):
                await self._begin_share(message)
        share = self._share
        if share is None or (
            message is not None and (message.share_id, message.attempt) != (share.share_id, share.attempt)
        ):
            return  # of a share dropped since
        m = item.micro_batch
        if item.kind == "forward":
            if m in share.started:
                return  # delivered twice (the first answer was lost on the way back)
            share.started.add(m)
            await self._forward(share, m, message, item.blob)
        else:
            assert message is not None and item.blob is not None
            if m in share.done or m not in self.compute.in_flight:
                return  # delivered twice, or for a forward this cell no longer holds
            grad = await self.in_thread(decode_tensor, item.blob, self.out_spec, what="codec")
            grad_in = await self.in_thread(self.compute.backward, m, grad)
            self.stats.backwards += 1
            await self._send_back(share, m, grad_in)
            await self._done(share, m)

    async def _begin_share(self, message: CellForward) -> None:
        if self._share is not None:
            self._abandon_share()
        await self._between_shares()
        waited = 0.0
        while not self.puller.loaded:  # a new cell: its whole weights first, never the seed's
            if waited > LOAD_WAIT_S or self._stop.is_set():
                raise Unavailable(f"cell {self.cell} has not loaded its weights in {LOAD_WAIT_S:.0f} s")
            await self._sleep(0.05)
            waited += 0.05
            await self._between_shares()
        if not self._round_shares:
            self.puller.round_started()  # the weights applied just now are the round's base
        self._share = _Share(
            message.share_id,
            message.share_first,
            message.share_count,
            message.round_end,
            message.epoch,
            message.attempt,
        )

    async def _forward(self, share: _Share, m: int, message: CellForward | None, blob: bytes | None) -> None:
        if self.is_first:
            x = self.dataset.micro_batch(m, self.micro_batch)
        else:
            assert blob is not None
            x = await self.in_thread(decode_tensor, blob, self.in_spec, what="codec")
        self.stats.forwards += 1
        if self.is_last:
            labels = self.dataset.micro_batch(m, self.micro_batch)
            grad_in, loss = await self.in_thread(self.compute.forward_backward_last, m, x, labels)
            self.losses.append((m, loss))
            await self._send_back(share, m, grad_in)
            await self._done(share, m)
            return
        out = await self.in_thread(self.compute.forward, m, x)
        codec = codec_for("activation", self.link_Bps(self.view.next or ""), half=self.half)
        frame = await self.in_thread(encode_tensor, out, codec, what="codec")
        forward = CellForward(stage=self.stage + 1, **self._hop(share, m))
        await self._deliver(self.view.next, forward, frame)
        share.progress_at = time.monotonic()

    async def _send_back(self, share: _Share, m: int, grad_in: torch.Tensor | None) -> None:
        if self.is_first or grad_in is None:
            return
        codec = codec_for("activation", self.link_Bps(self.view.prev or ""), half=self.half)
        frame = await self.in_thread(encode_tensor, grad_in, codec, what="codec")
        backward = CellBackward(stage=self.stage - 1, **self._hop(share, m))
        await self._deliver(self.view.prev, backward, frame)

    def _hop(self, share: _Share, m: int) -> dict[str, Any]:
        """What a tensor sent along the pipeline says of itself: its share and micro-batch, and
        the weights' version it was computed with."""
        return {
            "run_id": self.run_id,
            "pipeline": self.pipeline,
            "epoch": share.epoch,
            "share_id": share.share_id,
            "share_first": share.first,
            "share_count": share.count,
            "round_end": share.round_end,
            "attempt": share.attempt,
            "micro_batch": m,
            "version": self.puller.version,
        }

    async def _deliver(self, peer: str | None, message: CellForward | CellBackward, frame: bytes) -> None:
        """Send to a neighbour, trying again a few times on a broken path (not on a refusal)."""
        delay = SEND_BACKOFF_S
        for attempt in range(SEND_ATTEMPTS):
            if peer is None or message.epoch != self.view.epoch:
                raise WrongEpoch(
                    f"cell {self.cell}: the pipeline changed while micro-batch {message.micro_batch} was on its way"
                )
            try:
                await self.send(peer, message, [frame], 30.0)
                return
            except (Unreachable, StreamBroken):
                self.stats.send_failures += 1
                if attempt == SEND_ATTEMPTS - 1:
                    raise
                await self._sleep(delay)
                delay *= 2

    async def _done(self, share: _Share, m: int) -> None:
        """Micro-batch ``m`` ran its backward here; the last one ends the share."""
        if share is not self._share:
            return  # abandoned while it ran (its window place came back with it)
        share.done.add(m)
        share.progress_at = time.monotonic()
        if m in self._fed:
            self._fed.discard(m)
            self._window.release()
        if len(share.done) < share.count:
            return
        self._share = None
        self._share_seconds.append(time.monotonic() - share.opened_at)
        while share.round_end and not self._stop.is_set() and not await self.contributions.room():
            await self._timed(
                self.contributions.wait_for_room(1.0)
            )  # backpressure: the last round is not delivered yet
        self.stats.shares += 1
        await self.in_thread(self.compute.end_share)
        self._round_shares.append(share.share_id)
        if share.round_end:
            vector, micro_batches = await self.in_thread(self.compute.contribution)
            self.stats.rounds += 1
            round_shares, self._round_shares, self._shares_in_round = self._round_shares, [], 0
            non_finite = await self.in_thread(_non_finite, vector)
            if non_finite:
                self._drop_round(round_shares, non_finite, vector.numel())
            else:
                bases = self.puller.round_bases()
                self.contributions.add(round_shares, vector, micro_batches, bases)
                if self.settings.mode == "gradient":
                    self._sync_after = bases
        if not self.is_first:
            await self._between_shares()
        self._share_done.set()

    async def _between_shares(self) -> None:
        """Apply the weights that arrived: no micro-batch is in flight here now. In gradient mode
        the next round waits (at most ``SYNC_WAIT_S``) for the step its contribution went into:
        H = 1 is chosen where the exchange is cheap next to the compute, and so the rounds are
        synchronous SGD, each on the weights of every pipeline's previous round, at little cost."""
        if self._sync_after is not None:
            bases, self._sync_after = self._sync_after, None
            started = time.perf_counter()
            if not await self.puller.wait_past(bases, SYNC_WAIT_S):
                self.stats.sync_timeouts += 1
            self.stats.seconds["sync"] += time.perf_counter() - started
        await self.puller.apply()

    async def _idle(self) -> None:
        """Stage 0 cannot feed yet: wait for what it lacks (room to contribute, weights, a view),
        woken as soon as the contributions move on, else after a short while."""
        if self.puller.loaded and self.view.epoch is not None and self.view.ledger is not None:
            await self._timed(self.contributions.wait_for_room(0.5))
        else:
            await self._sleep(0.2)

    async def _timed(self, wait: Awaitable[Any]) -> None:
        started = time.perf_counter()
        await wait
        self.stats.seconds["waiting"] += time.perf_counter() - started

    async def _sleep(self, seconds: float) -> None:
        started = time.perf_counter()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop.wait(), seconds)
        self.stats.seconds["waiting"] += time.perf_counter() - started

    def info(self) -> dict[str, Any]:
        s = self.stats
        recent = [loss for _, loss in list(self.losses)[-16:]]
        return {
            "pipeline": self.pipeline,
            "stage": self.stage,
            "epoch": self.view.epoch,
            "share": None if self._share is None else self._share.share_id,
            "shares": s.shares,
            "abandoned": s.abandoned,
            "dropped_rounds": s.dropped_rounds,
            "rounds": s.rounds,
            "forwards": s.forwards,
            "backwards": s.backwards,
            "refused_epoch": s.refused_epoch,
            "send_failures": s.send_failures,
            "sync_timeouts": s.sync_timeouts,
            "seconds": {k: round(v, 2) for k, v in s.seconds.items()},
            "loss": round(sum(recent) / len(recent), 4) if recent else None,
            "weights": self.puller.info(),
            "contributions": self.contributions.info(),
        }
