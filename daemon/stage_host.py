"""What a peer runs for each stage it hosts: the parameter server and the micro-batch task queue.

Workers anywhere in the swarm (this peer's own included) talk to it in requests: ``claim`` a
task, ``put`` a result for this stage, ``complete`` or ``fail`` a lease, ``push`` gradients,
pull ``weights``. Requests arrive already parsed (``swarmd.peers.wire.rpc``); everything in
them is checked here against the plan before use (task kinds, micro-batch indices, tensor
shapes and dtypes, gradient names and shapes), and a bad one is refused with a reason.

Nothing is lost to a vanished worker: a finishing task (a backward, or the last stage's
forward, which runs the loss and backward at once) stays leased until the worker's ``push``
of the gradient it went into; the push completes those leases and applies the gradient in
one step, so a task is completed exactly when its gradient is in. A worker that dies holding
leases lets them expire (or is dropped when it leaves the swarm): the tasks are re-queued
and recomputed from the stored stage input. A push whose leases are no longer all held is
refused whole (its micro-batches are being redone), never applied twice.

The stage-0 host feeds the pipeline: micro-batch ``m`` is data index ``m``, at most
``max_in_flight`` at a time. Its *cursor* (every micro-batch below it finished) is kept in the
server's checkpoint, so a successor resumes the data where this host stopped. When the run's
epoch changes (a stage changed hands), in-flight work cannot complete across the change: every
host drops its queue, and stage 0 feeds again from its cursor. That costs recomputation of
the micro-batches in flight, never data; finished ones are remembered and not fed twice.
Gradients summed for finishing leases of the old epoch are still pushed and applied, and a
micro-batch is applied once per stage though it may be recomputed: the stage's
``GradientLedger`` carries those leases (to a successor host too) and remembers what it applied.
One race remains, counted in ``applied_twice``: a carried push that arrives after a recompute
of one of its micro-batches got in (its other micro-batches would be lost otherwise).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load as load_safetensors_bytes
from safetensors.torch import save as save_safetensors_bytes

from swarmd.errors import SwarmdError
from swarmd.models.build import ModelShape
from swarmd.models.corpus import Dataset
from swarmd.models.param_server import ServerConfig, StageParameterServer, stage_checkpoint_name
from swarmd.models.stages import StageModule, split_layers, stage_input_spec, stage_output_spec
from swarmd.peers.gradient_ledger import GradientLedger
from swarmd.peers.op_times import OpTimes
from swarmd.peers.task_queue import Task, TaskKind, TaskQueue, TaskQueueConfig, TaskQueueError
from swarmd.peers.wire.rpc import Answer
from swarmd.peers.wire.tensors import TensorSpec, WireError, decode_tensor, encode_tensor

logger = logging.getLogger(__name__)

MAX_LOSSES_KEPT = 8192
MAX_FINISHED_KEPT = 4096
MIN_CHECKPOINT_GAP_S = 5.0
AWAIT_CARRIED_S = 10.0
"""How long a recompute's push waits behind a gradient of the same micro-batch carried past an
epoch change (``PushMustWait``): that gradient's worker offers it at once, and a new host opens
within seconds. Later, both are applied rather than either lost (``applied_twice``)."""


class StageRequestError(SwarmdError):
    """A request to a stage host was refused: stale epoch, unknown lease, bad tensor, full queue."""


PUSH_AGAIN = "push it again shortly"
"""How a host asks for a push to be offered again (its leases stay held)."""


class PushMustWait(StageRequestError):
    """A push holds a micro-batch whose gradient, carried past an epoch change, is on its way:
    refused for now, its leases kept; the worker offers it again (``PUSH_AGAIN``)."""


@dataclass(frozen=True)
class StageInput:
    """A queued tensor frame and the weights version the stage that made it used."""

    frame: bytes
    upstream_version: int | None


@dataclass(frozen=True, kw_only=True)
class HostSettings:
    run_id: str
    stage: int
    stages: int
    shape: ModelShape
    seed: int
    micro_batch: int
    lr: float
    weight_decay: float
    max_staleness: int
    accumulate: int
    """Micro-batches per update (the run's batch over its micro-batch)."""
    checkpoint_every: int = 50
    max_in_flight: int = 8
    batches_ahead: int = 1
    """Batches stage 0 may start beyond the one its server is summing: 0 is a synchronous
    pipeline (each batch computed on the newest weights, with fill and drain per batch); each
    more overlaps batches, at up to that much staleness."""
    wire_dtype: str = "fp16"
    keep_versions: int = 8
    """Weights versions kept for workers that recompute a backward on the forward's version."""
    max_lease_s: float = 120.0


@dataclass
class HostStats:
    micro_batches_finished: int = 0
    pushes_refused: int = 0
    """Pushes refused whole because a lease in them was over (their micro-batches are redone)."""
    duplicates: int = 0
    """Results that arrived twice (a re-queued task's first run finished after all): dropped."""
    flushed: int = 0
    """Micro-batches dropped from the queue by an epoch change (re-fed from the data)."""
    refused: int = 0
    """Requests refused for a bad tensor or field."""
    unreplicated: int = 0
    """Pushes applied without being logged at a standby (none reachable): lost if this host dies."""
    carried_pushes: int = 0
    """Pushes of leases from before an epoch change, applied after it (else their gradient was lost)."""
    already_applied: int = 0
    """Recomputed tasks of micro-batches whose gradient this stage already had: run for their output only."""
    applied_twice: int = 0
    """Micro-batches a carried push applied though a recompute of them was applied first."""


def serialize_tensors(tensors: dict[str, torch.Tensor]) -> bytes:
    return save_safetensors_bytes({k: v.detach().contiguous() for k, v in tensors.items()})


def deserialize_tensors(data: bytes, expected: dict[str, torch.Size], what: str) -> dict[str, torch.Tensor]:
    """Parse safetensors bytes and check names, shapes and float dtypes against ``expected``."""
    try:
        tensors = load_safetensors_bytes(data)
    except Exception as e:
        raise StageRequestError(f"{what} is not a safetensors blob ({type(e).__name__})") from None
    if set(tensors) != set(expected):
        missing, extra = sorted(set(expected) - set(tensors))[:3], sorted(set(tensors) - set(expected))[:3]
        raise StageRequestError(f"{what} names do not match the stage: missing {missing}, unknown {extra}")
    for name, t in tensors.items():
        if t.shape != expected[name] or not t.dtype.is_floating_point:
            raise StageRequestError(
                f"{what} {name} is {t.dtype} {list(t.shape)}; expected float {list(expected[name])}"
            )
    return {k: v.float() for k, v in tensors.items()}


LogPush = Callable[[int, dict[str, Any], bytes], Awaitable[bool]]
"""Sends push ``seq`` (its metadata and gradient blob) to the standby; False when there is no
standby (a swarm of one); raises if the standby does not take it."""
WARN_EVERY_S = 60.0
LoggedPush = tuple[int, dict[str, Any], bytes]


class StageHost:
    def __init__(
        self, settings: HostSettings, checkpoint_dir: Path, dataset: Dataset | None,
        replay: Sequence[LoggedPush] = (), log_push: LogPush | None = None,
    ) -> None:  # fmt: skip
        if settings.stage == 0 and dataset is None:
            raise SwarmdError("the stage-0 host needs the run's dataset to feed the pipeline")
        self.settings = settings
        self.stage = settings.stage
        self.is_last = settings.stage == settings.stages - 1
        self.dataset = dataset
        ranges = split_layers(settings.shape.layers, settings.stages)
        module = StageModule.from_shape(settings.shape, settings.seed, ranges, settings.stage)
        config = ServerConfig(
            lr=settings.lr, weight_decay=settings.weight_decay, max_staleness=settings.max_staleness,
            checkpoint_every=settings.checkpoint_every, accumulate=settings.accumulate,
        )  # fmt: skip
        self.server = StageParameterServer(
            module.state_dict(), config, checkpoint_dir / stage_checkpoint_name(self.stage)
        )
        self.param_shapes = {name: p.shape for name, p in self.server.params.items()}
        mb, shape = settings.micro_batch, settings.shape
        self.in_spec = TensorSpec.like(stage_input_spec(shape, self.stage, mb))
        self.out_spec = TensorSpec.like(stage_output_spec(shape, self.stage, settings.stages, mb))
        # One activation frame at fp32 bounds any stage input or output gradient.
        self._frame_bytes = mb * shape.seq_len * max(shape.hidden, 2) * 4 + 64
        self.queue = self._new_queue()
        self.epoch: str | None = None
        self.stats = HostStats()
        self.losses: deque[tuple[int, float]] = deque(maxlen=MAX_LOSSES_KEPT)
        self._history: OrderedDict[int, bytes] = OrderedDict()
        self.server_lock = asyncio.Lock()
        self.push_phases = OpTimes()  # decode, wait for the lock, log at the standby, apply: mean times
        self._warned_at = -WARN_EVERY_S
        self._last_checkpoint = -MIN_CHECKPOINT_GAP_S
        cursor = int(self.server.metadata.get("data_cursor", "0"))
        done = self.server.metadata.get("data_done", "")
        self._finished = {int(m) for m in done.split(",") if m}
        self._cursor = cursor
        self._next_feed = cursor
        self.closed = False
        self.ledger = GradientLedger(carry_s=settings.max_lease_s)
        if "gradient_ledger" in self.server.metadata:  # a predecessor's carried leases, and what it applied
            self.ledger.load_metadata(self.server.metadata["gradient_ledger"], time.time())
        self.log_push = log_push
        self.replayed = self._replay(replay)
        self._history[self.server.version] = serialize_tensors(self.server.weights()[1])

    def _replay(self, entries: Sequence[LoggedPush]) -> int:
        """Apply the pushes a dead host logged at its standby after our checkpoint, in order."""
        done = 0
        for seq, meta, blob in sorted(entries, key=lambda e: e[0]):
            if seq <= self.server.received:
                continue
            if seq != self.server.received + 1:
                logger.warning("stage %d: push log has a gap at %d (server at %d); replay stops", self.stage, seq,
                               self.server.received)  # fmt: skip
                break
            try:  # logged by a host we trusted, but check it all the same: a bad one ends the replay
                gradients = deserialize_tensors(blob, self.param_shapes, "logged gradient")
                self.server.push(gradients, int(meta["base"]), int(meta["micro_batches"]))
            except (SwarmdError, KeyError, TypeError, ValueError) as e:
                logger.warning("stage %d: logged push %d is unusable (%s); replay stops", self.stage, seq, e)
                break
            done += 1
        if done:
            logger.info("stage %d: replayed %d logged push(es); at version %d", self.stage, done, self.server.version)
        return done

    def _new_queue(self) -> TaskQueue:
        capacity = self._frame_bytes * (2 * self.settings.max_in_flight + 4)
        return TaskQueue(TaskQueueConfig(
            stage=self.stage, capacity_bytes=capacity, backward_reserve_bytes=capacity // 2,
            max_micro_batches=max(self.settings.max_in_flight * 4, 16), max_lease_s=self.settings.max_lease_s,
        ))  # fmt: skip

    # --- epochs and feeding ----------------------------------------------------------------

    def set_epoch(self, epoch: str | None) -> None:
        """Adopt the run's hosting epoch; a change drops in-flight work (re-fed from the data)."""
        if epoch == self.epoch:
            return
        self._carry_finishing()
        flushed = len(self.queue.stored_micro_batches())
        if flushed:
            logger.info("stage %d: epoch changed; dropping %d micro-batch(es) in flight", self.stage, flushed)
        self.stats.flushed += flushed
        self.queue = self._new_queue()
        self.epoch = epoch
        self._next_feed = self._cursor
        self.feed()

    def _carry_finishing(self) -> None:
        """Keep this epoch's finishing leases pushable after it ends: their workers hold gradient
        sums whose micro-batches the stage below may finish meanwhile (never to be fed again)."""
        if self.epoch is None:
            return
        now = time.time()
        finishing = [(lease.lease_id, lease.worker_id, lease.task.micro_batch)
                     for lease in self.queue.live_leases(now) if self._finishes(lease.task)]  # fmt: skip
        if finishing:
            logger.debug("stage %d: carried (lease, worker, micro-batch): %s", self.stage, finishing)
            self.ledger.carry(self.epoch, finishing, now)
            logger.info("stage %d: carrying %d finishing lease(s) past the end of epoch %s", self.stage,
                        len(finishing), self.epoch)  # fmt: skip
        self.server.metadata["gradient_ledger"] = self.ledger.to_metadata(now)

    def _finishes(self, task: Task) -> bool:
        """Whether a task's gradient goes into a push (its lease completes with that push)."""
        return task.kind is TaskKind.BACKWARD or self.is_last

    def feed(self) -> None:
        """Stage 0: put new micro-batches while the pipeline has room."""
        if self.stage != 0 or self.epoch is None:
            return
        assert self.dataset is not None
        now = time.time()
        window = self.settings.accumulate * (1 + self.settings.batches_ahead)
        while True:
            in_flight = len(self.queue.stored_micro_batches())
            if in_flight >= self.settings.max_in_flight or in_flight + self.server.pending_micro_batches >= window:
                return
            while self._next_feed in self._finished:
                self._next_feed += 1
            m = self._next_feed
            frame = encode_tensor(self.dataset.micro_batch(m, self.settings.micro_batch), self.settings.wire_dtype)
            if not self.queue.has_room(len(frame)):
                return
            task = Task(task_id=f"f0-{m}", micro_batch=m, stage=0, kind=TaskKind.FORWARD,
                        payload=StageInput(frame, None))  # fmt: skip
            self.queue.put(task, len(frame), now)
            self._next_feed += 1

    def _mark_finished(self, m: int) -> None:
        self.stats.micro_batches_finished += 1
        if self.stage != 0 or m < self._cursor or m in self._finished:
            return
        self._finished.add(m)
        while self._cursor in self._finished:
            self._finished.discard(self._cursor)
            self._cursor += 1
        if len(self._finished) > MAX_FINISHED_KEPT:  # far ahead of a stuck micro-batch: give up on it
            self._cursor = min(self._finished)
        self.server.metadata.update(data_cursor=str(self._cursor), data_done=",".join(map(str, sorted(self._finished))))

    # --- requests ----------------------------------------------------------------------------

    async def handle(self, method: str, worker: str, header: dict[str, Any], blobs: list[bytes]) -> Answer:
        if method == "weights":
            return await self._weights(header)
        if method == "info":
            return self.info(), []
        if method == "checkpoint":
            return {"version": await self.checkpoint_now()}, []
        if method == "push" and header.get("epoch") != self.epoch and self.ledger.carries(header.get("epoch")):
            return await self._push(worker, header, blobs, carried=True)
        if header.get("epoch") != self.epoch or self.epoch is None:
            raise StageRequestError(f"stage {self.stage}: request for epoch {str(header.get('epoch'))[:20]}; "
                                    f"this host is at {self.epoch}; refresh the stage holders")  # fmt: skip
        try:
            if method == "claim":
                return self._claim(worker, header)
            if method == "put":
                return self._put(header, blobs)
            if method == "complete":
                return self._complete(worker, header)
            if method == "fail":
                for lease_id in _lease_ids(header):
                    if self.queue.holds(lease_id, worker, time.time()):
                        self.queue.fail(lease_id, worker, time.time())
                self.feed()
                return {}, []
            if method == "push":
                return await self._push(worker, header, blobs)
        except (TaskQueueError, WireError) as e:
            raise StageRequestError(f"stage {self.stage}: {e}") from None
        raise StageRequestError(f"unknown stage request {method[:40]!r}")

    def drop_worker(self, worker: str) -> None:
        self.queue.drop_worker(worker, time.time())
        self.feed()

    def _claim(self, worker: str, header: dict[str, Any]) -> Answer:
        lease_s = _number(header, "lease_s", 1.0, self.settings.max_lease_s)
        self.feed()
        lease = self.queue.claim(worker, time.time(), lease_s)
        # The newest version workers can pull (a step in progress is not served yet).
        answer: dict[str, Any] = {"version": next(reversed(self._history)), "ready": self.queue.counters().ready}
        if lease is None:
            return answer, []
        stored = lease.stage_input
        assert isinstance(stored, StageInput)
        task = lease.task
        answer.update(lease_id=lease.lease_id, kind=task.kind.value, micro_batch=task.micro_batch,
                      weights_version=task.weights_version, upstream_version=stored.upstream_version)  # fmt: skip
        if self._finishes(task) and self.ledger.was_applied(task.micro_batch):
            answer["applied"] = True  # run it for its output; its gradient is in: complete, don't push
        blobs = [stored.frame]
        if task.kind is TaskKind.BACKWARD:
            assert isinstance(task.payload, StageInput)
            blobs.append(task.payload.frame)
        # The weights the task needs ride along unless the worker has them: one request, not two.
        needed = task.weights_version if task.weights_version is not None else answer["version"]
        if needed not in _have(header):
            version = needed if needed in self._history else answer["version"]
            answer["weights"] = version
            blobs.append(self._history[version])
        return answer, blobs

    def _complete(self, worker: str, header: dict[str, Any]) -> Answer:
        lease_id, now = _text(header, "lease_id"), time.time()
        version = _integer(header, "weights_version", 0, None)
        task = self.queue.lease_of(lease_id, worker, now).task
        if not self._finishes(task):
            self.queue.complete(lease_id, worker, now, weights_version=version)
            return {}, []
        if not self.ledger.was_applied(task.micro_batch):
            raise StageRequestError(f"stage {self.stage}: task {task.task_id} finishes a micro-batch; it completes "
                                    "with the push of its gradient, not on its own")  # fmt: skip
        # A recompute of a micro-batch whose gradient is in (carried over an epoch change): it ran
        # for its output only, and finishes the micro-batch here without a push.
        self.queue.complete(lease_id, worker, now, finishes_micro_batch=True)
        self.stats.already_applied += 1
        self.feed()
        return {}, []

    def _put(self, header: dict[str, Any], blobs: list[bytes]) -> Answer:
        kind = TaskKind(_choice(header, "kind", ("forward", "backward")))
        m = _integer(header, "micro_batch", 0, None)
        if len(blobs) != 1:
            raise StageRequestError(f"a put carries one tensor frame, not {len(blobs)}")
        if kind is TaskKind.FORWARD and self.stage == 0:
            raise StageRequestError("stage 0 is fed from the data, not by puts")
        if kind is TaskKind.BACKWARD and self.is_last:
            raise StageRequestError("the last stage takes no backward tasks")
        spec = self.in_spec if kind is TaskKind.FORWARD else self.out_spec
        try:
            decode_tensor(blobs[0], spec, max_bytes=self._frame_bytes)  # check before it is queued
        except WireError:
            self.stats.refused += 1
            raise
        stored = set(self.queue.stored_micro_batches())
        if kind is TaskKind.FORWARD and m in stored or kind is TaskKind.BACKWARD and m not in stored:
            self.stats.duplicates += 1  # a re-queued task's first run made it after all
            return {"duplicate": True}, []
        upstream = _integer(header, "upstream_version", 0, None, optional=True)
        version = _integer(header, "weights_version", 0, None, optional=True)
        prefix = "f" if kind is TaskKind.FORWARD else "b"
        task = Task(task_id=f"{prefix}{self.stage}-{m}", micro_batch=m, stage=self.stage, kind=kind,
                    payload=StageInput(blobs[0], upstream), weights_version=version)  # fmt: skip
        try:
            self.queue.put(task, len(blobs[0]), time.time())
        except TaskQueueError as e:
            if "already has a backward" in str(e):
                self.stats.duplicates += 1
                return {"duplicate": True}, []
            raise
        return {"duplicate": False}, []

    async def _push(self, worker: str, header: dict[str, Any], blobs: list[bytes], carried: bool = False) -> Answer:
        lease_ids = _lease_ids(header)
        base = _integer(header, "base_version", 0, None)
        losses = header.get("losses", [])
        if not isinstance(losses, list) or len(losses) != (len(lease_ids) if self.is_last else 0):
            raise StageRequestError("a push names one loss per lease on the last stage, none elsewhere")
        if not all(isinstance(x, int | float) and not isinstance(x, bool) and 0 <= x < 1e4 for x in losses):
            raise StageRequestError("losses must be finite non-negative numbers")
        if len(blobs) != 1:
            raise StageRequestError(f"a push carries one gradient blob, not {len(blobs)}")
        phase = time.perf_counter()

        def phase_done(name: str) -> None:  # where a push's time goes, for status
            nonlocal phase
            now = time.perf_counter()
            self.push_phases.add(name, now - phase)
            phase = now

        if self.closed:
            raise StageRequestError(f"this peer does not host stage {self.stage} (any more); it is closing; send "
                                    "the push to the stage's next host")  # fmt: skip
        try:
            if not carried:
                self._held_micro_batches(worker, lease_ids)  # refused early, and held through the wait
            gradients = await asyncio.to_thread(deserialize_tensors, blobs[0], self.param_shapes, "gradient")
            phase_done("decode")
            # Under the lock, so that a closing host's checkpoint has this push whole or not at all
            # (and then its leases carried to the next host).
            async with self.server_lock:
                phase_done("wait_for_lock")
                if self.closed:
                    raise StageRequestError(f"this peer does not host stage {self.stage} (any more); it closed "
                                            "while the push waited; send it to the stage's next host")  # fmt: skip
                self.server.validate(gradients, base, len(lease_ids))
                # The epoch may have changed while the push waited: its leases are carried now.
                carried = carried or header.get("epoch") != self.epoch
                micro_batches = self._carried_micro_batches(worker, header, lease_ids) if carried else \
                    self._held_micro_batches(worker, lease_ids)  # fmt: skip
                fresh = [not self.ledger.was_applied(m) for m in micro_batches]
                epoch, queue = self.epoch, self.queue
                await self._log(base, len(micro_batches), blobs[0])
                phase_done("log_at_standby")
                result = await asyncio.to_thread(self.server.push, gradients, base, len(micro_batches))
                if result.stepped:
                    await self._remember_version()
                phase_done("apply")
                if not carried and self.queue is not queue and epoch is not None:
                    # The epoch changed while this push was applied, and carried its leases: in now.
                    self.ledger.take(epoch, lease_ids, worker, time.time())
                    carried = True
                self._settle(worker, None if carried else lease_ids, micro_batches, fresh, losses)
        except PushMustWait:
            raise  # its leases stay held: offered again
        except SwarmdError:  # a bad gradient, or one on weights this server never had: redo them
            now = time.time()
            for lid in [] if carried else lease_ids:
                if self.queue.holds(lid, worker, now):
                    self.queue.fail(lid, worker, now)
            self.stats.pushes_refused += 1
            raise
        self.feed()
        return {"version": result.version, "accepted": result.accepted, "staleness": result.staleness}, []

    def _settle(
        self, worker: str, lease_ids: list[str] | None, micro_batches: list[int], fresh: list[bool], losses: list[Any]
    ) -> None:
        """After a push is applied: its leases complete (none for carried ones), its micro-batches
        are finished here (once) and in the ledger, and the last stage records their losses."""
        now = time.time()
        logger.debug("stage %d: applied %s from %s (%s)", self.stage, micro_batches, worker,
                     "carried" if lease_ids is None else lease_ids)  # fmt: skip
        for i, m in enumerate(micro_batches):
            if lease_ids is not None and self.queue.holds(lease_ids[i], worker, now):
                self.queue.complete(lease_ids[i], worker, now, finishes_micro_batch=True)
            elif lease_ids is not None:
                # Re-queued while the push was applied (its worker was dropped meanwhile): the
                # redo of the task is told its gradient is in, and completes without a push.
                self.stats.duplicates += 1
            if not fresh[i]:
                continue  # applied before (a carried push that lost the race with a recompute)
            self._mark_finished(m)
            if self.is_last:
                self.losses.append((m, float(losses[i])))
        self.ledger.note_applied(micro_batches)
        self.server.metadata["gradient_ledger"] = self.ledger.to_metadata(now)

    def _held_micro_batches(self, worker: str, lease_ids: list[str]) -> list[int]:
        """The micro-batches of a push of live leases, held through the update; a push with a
        lease that is over, or one whose gradient is already in, is refused whole (redone)."""
        now = time.time()
        held = bool(lease_ids) and all(self.queue.holds(lid, worker, now) for lid in lease_ids)
        micro_batches = [self.queue.lease_of(lid, worker, now).task.micro_batch for lid in lease_ids] if held else []
        besides = (self.epoch, lease_ids)  # (a closing host carries the push's own leases too)
        again = [m for m in micro_batches if self.ledger.was_applied(m)]
        waiting = [m for m in micro_batches if self.ledger.awaits(m, now, AWAIT_CARRIED_S, besides)]
        if held and not again:
            for lid in lease_ids:
                self.queue.renew(lid, worker, now)
            if waiting:  # don't race it in (then the carried push would apply it twice), and don't redo it
                raise PushMustWait(f"stage {self.stage}: micro-batch(es) {waiting[:8]} of this push have a gradient "
                                   f"carried past an epoch change on its way; {PUSH_AGAIN}")  # fmt: skip
            return micro_batches
        for lid in lease_ids:
            if self.queue.holds(lid, worker, now):
                self.queue.fail(lid, worker, now)  # redone at once: told, for those in `again`, not to push
        self.feed()
        if again:
            raise StageRequestError(f"stage {self.stage}: micro-batch(es) {again[:8]} of this push are applied "
                                    "already (carried past an epoch change); the rest are recomputed")  # fmt: skip
        raise StageRequestError(f"stage {self.stage}: a lease of this push is over; gradient dropped, "
                                "its micro-batches are being recomputed")  # fmt: skip

    def _carried_micro_batches(self, worker: str, header: dict[str, Any], lease_ids: list[str]) -> list[int]:
        """The micro-batches of a push of leases carried past an epoch change (once, by their worker)."""
        micro_batches = self.ledger.take(str(header.get("epoch")), lease_ids, worker, time.time())
        if micro_batches is None:
            raise StageRequestError(f"stage {self.stage}: this push is for epoch {str(header.get('epoch'))[:20]} and "
                                    "not every lease in it is carried past it; its gradient is dropped")  # fmt: skip
        again = [m for m in micro_batches if self.ledger.was_applied(m)]
        if again:  # too late: a recompute of them got in first. Applied once more rather than lose the rest
            self.stats.applied_twice += len(again)
            logger.info("stage %d: carried push applies micro-batch(es) %s a second time", self.stage, again[:8])
        self.stats.carried_pushes += 1
        return micro_batches

    async def _log(self, base: int, micro_batches: int, blob: bytes) -> None:
        """Committed means replicated: the standby logs the push before we apply it. Without a
        standby (a swarm of one) or when it fails, we apply anyway and count it."""
        try:
            logged = self.log_push is not None and await self.log_push(
                self.server.received + 1, {"base": base, "micro_batches": micro_batches}, blob
            )
        except SwarmdError as e:
            logged = False
            if time.monotonic() - self._warned_at >= WARN_EVERY_S:  # once a minute, not once a push
                self._warned_at = time.monotonic()
                logger.warning("stage %d: could not log pushes at the standby (%s); applying them unreplicated",
                               self.stage, e)  # fmt: skip
        if not logged:
            self.stats.unreplicated += 1

    async def _weights(self, header: dict[str, Any]) -> Answer:
        """The named version if still kept, else the newest (the caller tags its work with it)."""
        wanted = _integer(header, "version", 0, None, optional=True)
        version = wanted if wanted in self._history else next(reversed(self._history))
        return {"version": version}, [self._history[version]]

    async def _remember_version(self) -> None:
        """Keep the new version's weights serialized once, for every worker that pulls them."""
        version, weights = self.server.version, self.server.weights()[1]
        self._history[version] = await asyncio.to_thread(serialize_tensors, weights)
        while len(self._history) > self.settings.keep_versions:
            self._history.popitem(last=False)

    # --- state ----------------------------------------------------------------------------

    async def rebase(self) -> None:
        """For a new standby: step on what is summed and checkpoint, so that its copy needs no
        log entry from before it (those went to the old standby)."""
        async with self.server_lock:
            if self.server.flush():
                await self._remember_version()
            await asyncio.to_thread(self.server.checkpoint)
            self._last_checkpoint = time.monotonic()

    async def checkpoint_now(self) -> int:
        """Write a checkpoint now (for an export), at most once per ``MIN_CHECKPOINT_GAP_S``."""
        async with self.server_lock:
            if time.monotonic() - self._last_checkpoint >= MIN_CHECKPOINT_GAP_S:
                await asyncio.to_thread(self.server.checkpoint)
                self._last_checkpoint = time.monotonic()
            return self.server.version

    async def stop(self) -> Path | None:
        """Stop serving (the stage changes hands, or the daemon stops): after the push being
        applied, none more; then ``close``."""
        async with self.server_lock:
            self.closed = True
            self._carry_finishing()  # here on the loop, where requests change the queue
            return await asyncio.to_thread(self._flush_and_checkpoint)

    def close(self) -> Path | None:
        """Step on the gradients summed so far (none is lost), then checkpoint, with the
        finishing leases carried for the stage's next host (their workers push there)."""
        self.closed = True
        self._carry_finishing()
        return self._flush_and_checkpoint()

    def _flush_and_checkpoint(self) -> Path | None:
        self.server.flush()
        return self.server.checkpoint()

    def info(self) -> dict[str, Any]:
        c = self.queue.counters()
        s = self.server.counters
        return {
            "stage": self.stage, "version": self.server.version, "epoch": self.epoch,
            "pending_micro_batches": self.server.pending_micro_batches,
            "queue": asdict(c), "host": asdict(self.stats), "leases_by_worker": self.queue.leases_by_worker(),
            "server": {"applied": s.applied, "scaled": s.scaled, "dropped_stale": s.dropped_stale,
                       "staleness": {str(k): v for k, v in sorted(s.staleness_histogram.items())}},
            "data_cursor": self._cursor if self.stage == 0 else None, "push_phases": self.push_phases.status(),
        }  # fmt: skip


def _integer(header: dict[str, Any], name: str, low: int, high: int | None, optional: bool = False) -> Any:
    value = header.get(name)
    if value is None and optional:
        return None
    if type(value) is not int or value < low or (high is not None and value > high):
        raise StageRequestError(f"field {name} is {str(value)[:40]!r}; must be an integer >= {low}")
    return value


def _number(header: dict[str, Any], name: str, low: float, high: float) -> float:
    value = header.get(name)
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise StageRequestError(f"field {name} is {str(value)[:40]!r}; must be a number in [{low}, {high}]")
    return float(value)


def _text(header: dict[str, Any], name: str) -> str:
    value = header.get(name)
    if not isinstance(value, str) or not 0 < len(value) <= 128:
        raise StageRequestError(f"field {name} must be a string of 1 to 128 characters")
    return value


def _choice(header: dict[str, Any], name: str, options: tuple[str, ...]) -> str:
    value = header.get(name)
    if value not in options:
        raise StageRequestError(f"field {name} is {str(value)[:40]!r}; must be one of {options}")
    return str(value)


def _have(header: dict[str, Any]) -> set[int]:
    """The weights versions a claiming worker says it holds (a hint: malformed means none)."""
    have = header.get("have")
    if not isinstance(have, list) or len(have) > 64:
        return set()
    return {v for v in have if type(v) is int}


def _lease_ids(header: dict[str, Any]) -> list[str]:
    ids = header.get("lease_ids")
    if not isinstance(ids, list) or len(ids) > 1024 or not all(isinstance(x, str) and 0 < len(x) <= 128 for x in ids):
        raise StageRequestError("field lease_ids must be a list of at most 1024 lease IDs")
    return ids
