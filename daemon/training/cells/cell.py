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

``CellWorker`` holds the cell's tasks, its thread and the work loop (one micro-batch's forward or
backward at a time); it hands the rest to its collaborators: ``InFlight`` (the share in flight,
its queue and the window), ``Feeder`` (stage 0's shares from the ledger), ``Neighbours`` (the
tensors sent on), ``CellRounds`` (the end of a share and of a round, the sync), ``Puller`` and
``Contributions`` (the exchange with the shards). It builds each from the cell's facts, the
siblings it uses and a narrow handle on the worker (``cell_facts``), never the worker itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, TypeVar

from swarmd.data.store import DataError
from swarmd.models.build import ModelError, ModelShape
from swarmd.models.cell_compute import CellCompute
from swarmd.peers.taskpool.cells import Cell
from swarmd.peers.taskpool.exchange import ExchangeConfig, window
from swarmd.peers.wire.codecs import decode_tensor
from swarmd.peers.wire.errors import BadRequest, FrameError, RpcError, Unavailable, WrongEpoch
from swarmd.peers.wire.messages import CellBackward, CellForward
from swarmd.peers.wire.protocol import Request
from swarmd.system.tasks import cancel_all
from swarmd.training.cells.cell_facts import CellFacts, CellView
from swarmd.training.cells.cell_stats import CellStats, cell_info
from swarmd.training.cells.contributions import Contributions
from swarmd.training.cells.feeder import Feeder
from swarmd.training.cells.in_flight import InFlight, Item, ShareInFlight
from swarmd.training.cells.neighbours import Neighbours
from swarmd.training.cells.puller import Puller, PullRelay
from swarmd.training.cells.rounds import CellRounds
from swarmd.training.cells.throttle import DutyCycle

if TYPE_CHECKING:
    import torch

    from swarmd.data.training_data import TrainingData

logger = logging.getLogger(__name__)

T = TypeVar("T")

LOAD_WAIT_S = 60.0
DATA_WAIT_S = 60.0
"""How long a micro-batch waits for its shard to be fetched before its share is dropped (and
issued again): a source that is down costs a retry, not a pipeline stuck on one share."""
MAX_LOSSES_KEPT = 4096

Send = Callable[[str, Request, list[bytes], float], Awaitable[tuple[Any, list[bytes]]]]
"""Sends a request to a peer (direct or through a relay) and returns its answer and blobs."""

__all__ = ["CellView", "CellWorker"]  # CellView lives in ``cell_facts``; the trainer's side imports it here


class CellWorker:
    def __init__(
        self,
        cell: Cell,
        stages: int,
        settings: ExchangeConfig,
        compute: CellCompute,
        data: TrainingData,
        micro_batch: int,
        run_id: str,
        send: Send,
        link_Bps: Callable[[str], float],
        *,
        shape: ModelShape,
        shards: int,
        half: str = "fp16",
        reducer: PullRelay | None = None,
    ) -> None:
        """``reducer`` is this peer's head relays (``swarmd.training.shards.head_relay``): a cell that
        heads a shard for its group hands it what it pulls. None where no group is formed (a
        test's lone cell)."""
        self.facts = facts = CellFacts.of(
            cell, stages, settings, micro_batch, run_id, shape=shape, shards=shards, half=half
        )
        self.cell = cell
        self.pipeline, self.stage = cell
        self.compute = compute
        self.data = data
        """The run's sequences (``swarmd.data``): stage 0 reads its inputs there, the last stage its labels."""
        self._send = send
        self.view = CellView()
        self.stats = CellStats()
        self.losses: deque[tuple[int, float]] = deque(maxlen=MAX_LOSSES_KEPT)
        self._exec = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"cell-{self.pipeline}-{self.stage}")
        self.duty = DutyCycle()  # [limits] cpu_share, paid in the worker thread before each job
        self._stop = asyncio.Event()
        self.failure: str | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self.flight = InFlight(window(stages))
        # In the order they use each other; the one cycle left (a dropped round's shares go back
        # through the feeder, which itself works the rounds) goes through ``_give_back``.
        self.contributions = Contributions(facts, self, link_Bps)
        self.puller = Puller(facts, self, compute, self.contributions, reducer)
        self.rounds = CellRounds(facts, self, compute, self.stats, self.puller, self.contributions, self._give_back)
        self.neighbours = Neighbours(facts, self, self.stats, link_Bps, lambda: self.puller.version)
        self.feeder = (
            Feeder(facts, self, self.flight, self.rounds, self.contributions, lambda: self.puller.loaded)
            if facts.is_first
            else None
        )

    # --- the trainer's side -----------------------------------------------------------------

    def update(self, view: CellView) -> None:
        """The pool's newest view; a new epoch voids the share in flight."""
        share = self.flight.share
        if view.epoch != self.view.epoch and share is not None:
            logger.info("cell %s: pipeline epoch changed; dropping share %d", self.cell, share.share_id)
            self._abandon_share()
        self.view = view
        self.puller.servers_changed()
        self.contributions.servers_changed()

    async def run(self) -> None:
        """Serve until ``stop``: load the weights, then work the pipeline's shares."""
        self._tasks = [asyncio.create_task(self._work(), name=f"cell {self.cell} work")]
        if self.feeder is not None:
            self._tasks.append(asyncio.create_task(self.feeder.run(), name=f"cell {self.cell} shares"))
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
        if self.flight.share is not None:
            self._abandon_share()
        self._stop.set()
        self.duty.stop()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.contributions.drain(), timeout_s / 2)
        await cancel_all(self._tasks, timeout_s / 2, f"cell {self.cell}")
        self._exec.shutdown(wait=False, cancel_futures=True)

    def round_seconds(self) -> float:
        """How long a round takes here lately (H shares; 0 before the first share is done)."""
        return self.flight.round_seconds(self.facts.settings.local_steps)

    def info(self) -> dict[str, Any]:
        share = None if self.flight.share is None else self.flight.share.share_id
        parts = self.puller.info(), self.contributions.info()
        return cell_info(self.cell, self.view.epoch, share, self.stats, self.losses, *parts)

    # --- what the collaborators use -----------------------------------------------------------

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    async def send(self, peer: str, request: Request, blobs: list[bytes], timeout_s: float) -> tuple[Any, list[bytes]]:
        return await self._send(peer, request, blobs, timeout_s)

    def tell(self, peer: str, request: Request) -> None:
        """Send ``request`` in the background; its answer does not matter, a failure is only logged."""
        asyncio.create_task(self._quietly(peer, request))

    async def _quietly(self, peer: str, request: Request) -> None:
        try:
            await self.send(peer, request, [], 10.0)
        except RpcError as e:
            logger.debug("cell %s: %s to %s failed (%s)", self.cell, type(request).__name__, peer, e)

    async def in_thread(self, fn: Callable[..., T], *args: Any, what: str = "compute") -> T:
        """Run ``fn`` on this cell's one worker thread (the compute is not thread-safe), once
        the thread has been idle as long as ``[limits] cpu_share`` asks (counted as waiting)."""
        with self.stats.timing(what):
            result, throttled = await asyncio.get_running_loop().run_in_executor(self._exec, self.duty.run, fn, *args)
        self.stats.seconds[what] -= throttled
        self.stats.seconds["waiting"] += throttled
        return result

    async def timed(self, wait: Awaitable[Any]) -> None:
        """Await ``wait``, counted as waiting."""
        with self.stats.timing("waiting"):
            await wait

    async def sleep(self, seconds: float) -> None:
        """Wait ``seconds``, or less if the cell stops meanwhile; counted as waiting."""
        with self.stats.timing("waiting"), contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop.wait(), seconds)

    # --- messages from the neighbours ---------------------------------------------------------

    async def handle(self, sender: str, message: CellForward | CellBackward, blob: bytes) -> None:
        """A neighbour's activation or gradient: checked (its sender is this pipeline's
        neighbour in this epoch, its share no larger than the run's; the schema put its
        micro-batch inside the share, and the tensor's shape, codec and finiteness are checked
        as it is decoded), then queued (answered at once)."""
        expected = self.view.prev if isinstance(message, CellForward) else self.view.next
        if message.epoch != self.view.epoch or sender != expected:
            self.stats.refused_epoch += 1
            raise WrongEpoch(
                f"cell {self.cell} is in epoch {str(self.view.epoch)[:12]} with neighbour {str(expected)[:16]}; "
                f"the message is from {sender[:16]} in {message.epoch[:12]}"
            )
        # A share holds k micro-batches (a share issued before a re-plan keeps its k, so the
        # batch bounds it when that is more): a neighbour's claim of more is not the ledger's.
        most = max(self.facts.settings.share_micro_batches, self.facts.settings.batch_micro_batches)
        if message.share_count > most:
            self.stats.refused_share += 1
            raise BadRequest(
                f"cell {self.cell}: share {message.share_id} claims {message.share_count} micro-batches; "
                f"a share of this run holds at most {most}"
            )
        kind = "forward" if isinstance(message, CellForward) else "backward"
        await self.flight.queue(kind, message.micro_batch, message, blob)

    # --- the work loop ------------------------------------------------------------------------

    async def _work(self) -> None:
        while not self._stop.is_set():
            try:
                item = await self.flight.next_item(1.0)
            except TimeoutError:
                self._check_stall()
                continue
            try:
                await self._one(item)
            except (RpcError, FrameError, ModelError, DataError) as e:
                # A neighbour gone or refusing, a tensor that failed its checks: this share cannot
                # finish here; stage 0 feeds it again (or another pipeline does).
                logger.info("cell %s: micro-batch %d failed (%s); dropping the share", self.cell, item.micro_batch, e)
                self._abandon_share()

    def _check_stall(self) -> None:
        share = self.flight.share
        limit = self.flight.stall_limit_s()
        if share is not None and time.monotonic() - share.progress_at > limit:
            logger.warning(
                "cell %s: share %d made no progress for %.0f s; abandoning it", self.cell, share.share_id, limit
            )
            self._abandon_share()

    def _abandon_share(self) -> None:
        """Drop the share in flight here; stage 0 gives it back to the ledger, which issues it again."""
        share = self.flight.drop()
        if share is None:
            return
        self.stats.abandoned += 1
        self.rounds.abandoned()
        asyncio.create_task(self.in_thread(self.compute.drop_share))
        self._give_back([share.share_id])

    def _give_back(self, share_ids: list[int]) -> None:
        """Shares this pipeline will not finish go back to the ledger (stage 0's feeder took them from it)."""
        if self.feeder is not None:
            self.feeder.give_back(share_ids)

    async def _one(self, item: Item) -> None:
        message = item.message
        if message is not None:
            if message.epoch != self.view.epoch:
                return  # queued before the epoch changed
            current = self.flight.share
            if isinstance(message, CellForward) and (
                current is None or current.share_id != message.share_id or current.attempt < message.attempt
            ):
                await self._begin_share(message)
        share = self.flight.share
        if share is None or (
            message is not None and (message.share_id, message.attempt) != (share.share_id, share.attempt)
        ):
            return  # of a share dropped since
        m = item.micro_batch
        if item.kind == "forward":
            if m in share.started:
                return  # delivered twice (the first answer was lost on the way back)
            share.started.add(m)
            await self._forward(share, m, item.blob)
        else:
            assert message is not None and item.blob is not None
            if m in share.done or m not in self.compute.in_flight:
                return  # delivered twice, or for a forward this cell no longer holds
            grad = await self.in_thread(decode_tensor, item.blob, self.facts.out_spec, what="codec")
            grad_in = await self.in_thread(self.compute.backward, m, grad)
            self.stats.backwards += 1
            await self.neighbours.backward(share, m, grad_in)
            await self._done(share, m)

    async def _begin_share(self, message: CellForward) -> None:
        if self.flight.share is not None:
            self._abandon_share()
        await self.rounds.between_shares()
        waited = 0.0
        while not self.puller.loaded:  # a new cell: its whole weights first, never the seed's
            if waited > LOAD_WAIT_S or self._stop.is_set():
                raise Unavailable(f"cell {self.cell} has not loaded its weights in {LOAD_WAIT_S:.0f} s")
            await self.sleep(0.05)
            waited += 0.05
            await self.rounds.between_shares()
        self.rounds.share_begins()
        self.flight.open(ShareInFlight.of(message))

    async def _tokens(self, m: int) -> torch.Tensor:
        """Micro-batch ``m``'s tokens: its shard fetched first if it is not here (rarely: the
        shards training reads next are fetched ahead), then read on the worker thread."""
        with self.stats.timing("waiting"):
            await self.data.ready(m, 1, self.facts.micro_batch, DATA_WAIT_S)
        return await self.in_thread(self.data.micro_batch, m, self.facts.micro_batch, what="codec")

    async def _forward(self, share: ShareInFlight, m: int, blob: bytes | None) -> None:
        if self.facts.is_first:
            x = await self._tokens(m)
        else:
            assert blob is not None
            x = await self.in_thread(decode_tensor, blob, self.facts.in_spec, what="codec")
        self.stats.forwards += 1
        if self.facts.is_last:
            labels = await self._tokens(m)
            grad_in, loss = await self.in_thread(self.compute.forward_backward_last, m, x, labels)
            self.losses.append((m, loss))
            await self.neighbours.backward(share, m, grad_in)
            await self._done(share, m)
            return
        out = await self.in_thread(self.compute.forward, m, x)
        await self.neighbours.forward(share, m, out)
        share.progress_at = time.monotonic()

    async def _done(self, share: ShareInFlight, m: int) -> None:
        """Micro-batch ``m`` ran its backward here; the last one ends the share (and its round)."""
        if not self.flight.micro_batch_done(share, m):
            return
        await self.rounds.share_done(share)
        if not self.facts.is_first:
            await self.rounds.between_shares()
        self.flight.settle()
