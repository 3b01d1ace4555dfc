"""One stage's micro-batch task queue, kept by the stage's reliable peer (its PS host).

Pure bookkeeping: no network, no torch; payloads are opaque objects whose size the caller
states, and time comes in as ``now``. Life of micro-batch ``m`` on this stage:

1. ``put`` a FORWARD task; its payload, the stage input, is *stored* under ``m``. A worker
   ``claim``s it (a lease with an expiry), runs it, and ``complete``s it with the weights
   version it used. The input stays stored: if the forward's activations are lost with its
   worker, ``recompute_forward(m)`` re-queues the forward from it, so nothing is lost.
2. ``put`` a BACKWARD task (the gradient of the stage's output). Its lease also carries the
   stored input, and its ``weights_version`` defaults to the forward's (PipeDream). When it
   completes, ``m`` is finished here and its bytes come back once no task of ``m`` is
   outstanding. The last stage, whose forward pass runs the loss and backward too, finishes
   ``m`` with ``complete(..., finishes_micro_batch=True)``.

Decisions:

- ``claim`` hands out BACKWARD before FORWARD tasks, oldest first within a kind: finishing a
  micro-batch frees memory and commits an update; starting one only adds load.
- A lease ends by ``complete``, ``fail``, expiry or ``drop_worker``; the last three re-queue
  the task at once, in its old place (downstream waits on it), with ``attempts + 1``. A lease
  is over at ``expires_at`` whether or not ``expire`` has swept it: a late ``complete`` gets
  ``LeaseError`` and the result is dropped (the re-queued task redoes it).
- Nothing is ever dropped: a task that reaches ``max_attempts`` is still re-queued, with
  ``attempts`` capped, but at the *back* of its kind (a task that kills every worker cannot
  block the head), counted in ``exhausted`` and logged.
- Memory: stored inputs plus backward payloads never exceed ``capacity_bytes``. FORWARD puts
  may use only ``capacity_bytes - backward_reserve_bytes``: backward completions are what free
  memory, so a backward refused for room held by forwards would deadlock the pipeline. A full
  queue raises ``QueueFull`` (backpressure: the producer waits and retries; ``has_room``
  checks first); a task too big ever to fit raises ``TaskQueueError`` instead.
- At most one forward and one backward per micro-batch are outstanding, so tasks are bounded
  by ``2 * max_micro_batches``. ``put`` counts every task entered (by ``put`` or
  ``recompute_forward``): ``put == completed + outstanding``, and ``claimed == completed +
  requeued_expired + requeued_failed + requeued_worker_gone + leased``.
"""

from __future__ import annotations

import enum
import heapq
import itertools
import logging
import math
from dataclasses import dataclass, replace

from swarmd.errors import SwarmdError

logger = logging.getLogger(__name__)

MAX_ID_CHARS = 128  # a libp2p peer ID is ~52 characters; far longer is garbage from a peer
MAX_LEASE_S = 3600.0
MAX_MICRO_BATCHES = 65536


class TaskQueueError(SwarmdError):
    """A task-queue call was invalid: bad input, duplicate task, unknown micro-batch."""


class QueueFull(TaskQueueError):
    """No room now: the producer must wait for micro-batches to finish, then retry."""

    def __init__(self, message: str, *, capacity_bytes: int, used_bytes: int, requested_bytes: int) -> None:
        super().__init__(message)
        self.capacity_bytes, self.used_bytes, self.requested_bytes = capacity_bytes, used_bytes, requested_bytes


class LeaseError(TaskQueueError):
    """The lease is unknown, over, or held by another worker: the caller's result is dropped."""

    def __init__(self, message: str, *, lease_id: str, worker_id: str) -> None:
        super().__init__(message)
        self.lease_id, self.worker_id = lease_id, worker_id


class UnknownMicroBatch(TaskQueueError):
    """No stage input is stored for this micro-batch (never put here, or finished)."""

    def __init__(self, message: str, *, micro_batch: int) -> None:
        super().__init__(message)
        self.micro_batch = micro_batch


class TaskKind(enum.Enum):
    FORWARD = "forward"
    BACKWARD = "backward"


_RANK = {TaskKind.BACKWARD: 0, TaskKind.FORWARD: 1}  # heap order: backward first


@dataclass(frozen=True, kw_only=True)
class Task:
    task_id: str
    micro_batch: int
    stage: int
    kind: TaskKind
    payload: object
    """FORWARD: the stage input. BACKWARD: the gradient of the stage's output."""
    weights_version: int | None = None
    """BACKWARD: the version its forward used (filled in from the forward when None)."""
    attempts: int = 0
    """Leases of this task that ended without completion (capped at ``max_attempts``)."""


@dataclass(frozen=True, kw_only=True)
class Lease:
    lease_id: str
    worker_id: str
    task: Task
    stage_input: object
    """The stored stage input of the task's micro-batch (for a forward, its own payload)."""
    expires_at: float
    lease_s: float


@dataclass(kw_only=True)
class TaskQueueConfig:
    stage: int
    """The stage this queue serves; every task put here must carry it."""
    capacity_bytes: int
    """Bound on the stored stage inputs plus backward payloads held at once."""
    backward_reserve_bytes: int = 0
    """Part of the capacity only BACKWARD tasks may use; size it for the gradients in flight."""
    max_micro_batches: int = 256
    """Micro-batches in flight on this stage (stored inputs) at once."""
    max_attempts: int = 5
    """Failed leases after which a task is re-queued at the back and counted in ``exhausted``."""
    max_lease_s: float = 300.0
    """Longest lease a worker may ask for."""

    def __post_init__(self) -> None:
        _check_range("stage", self.stage, 0, None)
        _check_range("capacity_bytes", self.capacity_bytes, 1, None)
        _check_range("backward_reserve_bytes", self.backward_reserve_bytes, 0, self.capacity_bytes - 1)
        _check_range("max_micro_batches", self.max_micro_batches, 1, MAX_MICRO_BATCHES)
        _check_range("max_attempts", self.max_attempts, 1, None)
        _check_range("max_lease_s", self.max_lease_s, 1e-3, MAX_LEASE_S)


@dataclass(kw_only=True)
class QueueCounters:
    put: int = 0
    claimed: int = 0
    completed: int = 0
    requeued_expired: int = 0
    requeued_failed: int = 0
    requeued_worker_gone: int = 0
    recomputed: int = 0
    exhausted: int = 0
    ready: int = 0
    leased: int = 0
    outstanding: int = 0
    micro_batches: int = 0
    bytes_used: int = 0
    capacity_bytes: int = 0


@dataclass
class _Entry:  # an outstanding task
    task: Task
    size_bytes: int  # bytes beyond the stored input (a backward's gradient; 0 for a forward)
    seq: int  # place in line: kept on re-queue, renewed when attempts reach the cap


@dataclass
class _Stored:  # a micro-batch's stored stage input
    payload: object
    size_bytes: int
    forward_task_id: str
    weights_version: int | None = None
    outstanding: int = 0  # its tasks not yet completed
    has_backward: bool = False
    finished: bool = False
    recomputes: int = 0


class TaskQueue:
    def __init__(self, config: TaskQueueConfig) -> None:
        self.config = config
        self._tasks: dict[str, _Entry] = {}
        self._ready: list[tuple[int, int, str]] = []  # heap of (kind rank, seq, task_id)
        self._leases: dict[str, Lease] = {}
        # (expires_at, lease_id) of the leases, oldest first: a sweep looks at the expired ones
        # only. Entries of completed or renewed leases stay until their time passes (or the
        # heap is rebuilt), and are skipped then.
        self._expiry: list[tuple[float, str]] = []
        self._inputs: dict[int, _Stored] = {}
        self._seq = itertools.count()
        self._bytes = 0
        self._c = QueueCounters(capacity_bytes=config.capacity_bytes)

    def has_room(self, size_bytes: int, kind: TaskKind = TaskKind.FORWARD) -> bool:
        """Whether a ``kind`` task with a ``size_bytes`` payload would be accepted now."""
        if kind is TaskKind.FORWARD and len(self._inputs) >= self.config.max_micro_batches:
            return False
        return self._bytes + size_bytes <= self._limit(kind)

    def put(self, task: Task, size_bytes: int, now: float) -> None:
        """Enqueue ``task`` (``attempts`` start at 0). ``QueueFull``: retry after a completion."""
        _check_now(now)
        _check_id("task_id", task.task_id)
        if task.stage != self.config.stage:
            raise TaskQueueError(
                f"task {task.task_id!r} is for stage {task.stage}; this queue serves {self.config.stage}"
            )
        _check_range("micro_batch", task.micro_batch, 0, None)
        _check_range(f"{task.kind.value} size_bytes", size_bytes, 0, self._limit(task.kind))
        if task.task_id in self._tasks:
            raise TaskQueueError(f"task {task.task_id!r} is already queued")
        stored = self._inputs.get(task.micro_batch)
        if task.kind is TaskKind.FORWARD and stored is not None:
            raise TaskQueueError(f"micro-batch {task.micro_batch} already has a stored input on this stage")
        if task.kind is TaskKind.BACKWARD:
            if stored is None or stored.finished:
                msg = f"no stage input stored for micro-batch {task.micro_batch}; put its forward first"
                raise UnknownMicroBatch(msg, micro_batch=task.micro_batch)
            if stored.has_backward:
                raise TaskQueueError(f"micro-batch {task.micro_batch} already has a backward task")
        if not self.has_room(size_bytes, task.kind):
            raise self._full(size_bytes, task.kind)
        if task.attempts:
            task = replace(task, attempts=0)
        self._bytes += size_bytes
        if task.kind is TaskKind.FORWARD:  # its payload *is* the stored input: counted once, there
            stored = self._inputs[task.micro_batch] = _Stored(task.payload, size_bytes, task.task_id)
            self._add(task, 0, stored)
            return
        assert stored is not None
        stored.has_backward = True
        if task.weights_version is None:
            task = replace(task, weights_version=stored.weights_version)
        self._add(task, size_bytes, stored)

    def recompute_forward(self, micro_batch: int, now: float) -> Task | None:
        """Re-queue ``micro_batch``'s forward from its stored input and weights version; None
        when a forward of it is already queued or running, or it is finished here."""
        _check_now(now)
        stored = self._inputs.get(micro_batch)
        if stored is None:
            raise UnknownMicroBatch(f"no stage input stored for micro-batch {micro_batch}", micro_batch=micro_batch)
        busy = any(e.task.micro_batch == micro_batch and e.task.kind is TaskKind.FORWARD for e in self._tasks.values())
        if busy or stored.finished:
            return None
        stored.recomputes += 1
        while f"{stored.forward_task_id}/r{stored.recomputes}" in self._tasks:  # a producer took the name
            stored.recomputes += 1
        task = Task(
            task_id=f"{stored.forward_task_id}/r{stored.recomputes}",
            micro_batch=micro_batch,
            stage=self.config.stage,
            kind=TaskKind.FORWARD,
            payload=stored.payload,
            weights_version=stored.weights_version,
        )
        self._add(task, 0, stored)
        self._c.recomputed += 1
        logger.debug("stage %d: recomputing the forward of micro-batch %d", self.config.stage, micro_batch)
        return task

    def claim(self, worker_id: str, now: float, lease_s: float) -> Lease | None:
        """Lease the oldest ready task to ``worker_id``, backward before forward; None if none."""
        _check_now(now)
        _check_id("worker_id", worker_id)
        _check_range("lease_s", lease_s, 1e-3, self.config.max_lease_s)
        self._sweep(now)
        if not self._ready:
            return None
        task = self._tasks[heapq.heappop(self._ready)[2]].task
        lease = Lease(
            lease_id=f"{self.config.stage}.{next(self._seq)}",
            worker_id=worker_id,
            task=task,
            stage_input=self._inputs[task.micro_batch].payload,
            expires_at=now + lease_s,
            lease_s=lease_s,
        )
        self._leases[lease.lease_id] = lease
        self._track_expiry(lease)
        self._c.claimed += 1
        return lease

    def holds(self, lease_id: str, worker_id: str, now: float) -> bool:
        """Whether ``worker_id`` holds the live lease ``lease_id`` (an expired one is re-queued now)."""
        _check_now(now)
        self._sweep(now)
        lease = self._leases.get(lease_id)
        return lease is not None and lease.worker_id == worker_id

    def lease_of(self, lease_id: str, worker_id: str, now: float) -> Lease:
        """The live lease ``lease_id`` of ``worker_id``; ``LeaseError`` if it is over or another's."""
        return self._held(lease_id, worker_id, now)

    def live_leases(self, now: float) -> list[Lease]:
        """Every lease not over at ``now`` (expired ones are re-queued first)."""
        _check_now(now)
        self._sweep(now)
        return list(self._leases.values())

    def renew(self, lease_id: str, worker_id: str, now: float) -> Lease:
        """Extend a live lease by its original length; only its holder may."""
        lease = self._held(lease_id, worker_id, now)
        lease = self._leases[lease_id] = replace(lease, expires_at=now + lease.lease_s)
        self._track_expiry(lease)
        return lease

    def complete(
        self,
        lease_id: str,
        worker_id: str,
        now: float,
        *,
        weights_version: int | None = None,
        finishes_micro_batch: bool = False,
    ) -> Task:
        """The holder's result is in. A forward reports the ``weights_version`` it used (its
        backward and recomputes reuse it); ``finishes_micro_batch`` is for the last stage."""
        if weights_version is not None:
            _check_range("weights_version", weights_version, 0, None)
        lease = self._held(lease_id, worker_id, now)
        del self._leases[lease_id]
        entry = self._tasks.pop(lease.task.task_id)
        stored = self._inputs[entry.task.micro_batch]
        stored.outstanding -= 1
        self._bytes -= entry.size_bytes
        if entry.task.kind is TaskKind.BACKWARD or finishes_micro_batch:
            stored.finished = True
        elif stored.weights_version is None:
            stored.weights_version = weights_version
        if stored.finished and stored.outstanding == 0:  # the micro-batch is done here
            del self._inputs[entry.task.micro_batch]
            self._bytes -= stored.size_bytes
        self._c.completed += 1
        return entry.task

    def fail(self, lease_id: str, worker_id: str, now: float) -> None:
        """The holder gives the task up (an error, or it is stopping): re-queue it at once."""
        self._held(lease_id, worker_id, now)
        self._requeue(lease_id, "requeued_failed")

    def expire(self, now: float) -> list[str]:
        """Re-queue every task whose lease is over; return their task IDs."""
        _check_now(now)
        return self._sweep(now)

    def drop_worker(self, worker_id: str, now: float) -> list[str]:
        """A worker left the swarm: re-queue all it holds at once; return the task IDs."""
        _check_now(now)
        gone = [lid for lid, lease in self._leases.items() if lease.worker_id == worker_id]
        ids = [self._requeue(lid, "requeued_worker_gone") for lid in gone]
        if ids:
            logger.info("stage %d: worker %s left; re-queued %d task(s)", self.config.stage, worker_id, len(ids))
        return ids

    def ready_count(self) -> int:
        """Tasks ready to claim now (what a host reports to workers choosing a stage)."""
        return len(self._ready)

    def counters(self) -> QueueCounters:
        """A snapshot of the counters and current occupancy."""
        return replace(
            self._c,
            ready=len(self._ready),
            leased=len(self._leases),
            outstanding=len(self._tasks),
            micro_batches=len(self._inputs),
            bytes_used=self._bytes,
        )

    def leases_by_worker(self) -> dict[str, int]:
        """How many live leases each worker holds."""
        counts: dict[str, int] = {}
        for lease in self._leases.values():
            counts[lease.worker_id] = counts.get(lease.worker_id, 0) + 1
        return counts

    def stored_micro_batches(self) -> list[int]:
        """Micro-batches whose stage input is stored here (in flight on this stage)."""
        return sorted(self._inputs)

    def _add(self, task: Task, size_bytes: int, stored: _Stored) -> None:
        entry = self._tasks[task.task_id] = _Entry(task, size_bytes, next(self._seq))
        stored.outstanding += 1
        heapq.heappush(self._ready, (_RANK[task.kind], entry.seq, task.task_id))
        self._c.put += 1

    def _held(self, lease_id: str, worker_id: str, now: float) -> Lease:
        _check_now(now)
        self._sweep(now)  # a lease is over at its expiry, swept or not
        lease = self._leases.get(lease_id)
        if lease is None or lease.worker_id != worker_id:
            why = "is unknown or over" if lease is None else f"is held by {lease.worker_id!r}, not {worker_id!r}"
            raise LeaseError(f"lease {lease_id!r} {why}; drop the result", lease_id=lease_id, worker_id=worker_id)
        return lease

    def _track_expiry(self, lease: Lease) -> None:
        if len(self._expiry) > 4 * len(self._leases) + 64:  # mostly stale entries: rebuild
            self._expiry = [(held.expires_at, lid) for lid, held in self._leases.items()]
            heapq.heapify(self._expiry)
        heapq.heappush(self._expiry, (lease.expires_at, lease.lease_id))

    def _sweep(self, now: float) -> list[str]:
        over: dict[str, None] = {}  # a renewed lease may have two entries due: once, in order
        while self._expiry and self._expiry[0][0] <= now:
            _, lid = heapq.heappop(self._expiry)
            lease = self._leases.get(lid)
            if lease is not None and lease.expires_at <= now:  # not completed, not renewed since
                over[lid] = None
        ids = [self._requeue(lid, "requeued_expired") for lid in over]
        if ids:
            logger.warning("stage %d: %d lease(s) expired; re-queued %s", self.config.stage, len(ids), ids)
        return ids

    def _requeue(self, lease_id: str, counter: str) -> str:
        entry = self._tasks[self._leases.pop(lease_id).task.task_id]
        attempts = min(entry.task.attempts + 1, self.config.max_attempts)
        if attempts == self.config.max_attempts:  # keep it, but behind the tasks that still work
            entry.seq = next(self._seq)
            self._c.exhausted += 1
            logger.warning(
                "stage %d: task %s failed %d times; re-queued at the back",
                self.config.stage,
                entry.task.task_id,
                attempts,
            )
        entry.task = replace(entry.task, attempts=attempts)
        heapq.heappush(self._ready, (_RANK[entry.task.kind], entry.seq, entry.task.task_id))
        setattr(self._c, counter, getattr(self._c, counter) + 1)
        return entry.task.task_id

    def _limit(self, kind: TaskKind) -> int:
        reserve = self.config.backward_reserve_bytes if kind is TaskKind.FORWARD else 0
        return self.config.capacity_bytes - reserve

    def _full(self, size_bytes: int, kind: TaskKind) -> QueueFull:
        if kind is TaskKind.FORWARD and len(self._inputs) >= self.config.max_micro_batches:
            what = f"{len(self._inputs)} micro-batches in flight, the max_micro_batches limit"
        else:
            what = f"{self._bytes} of the {self._limit(kind)} bytes {kind.value} tasks may use are taken"
        return QueueFull(
            f"stage {self.config.stage} queue is full ({what}); cannot take {size_bytes} bytes now: "
            "wait for micro-batches to finish and retry",
            capacity_bytes=self.config.capacity_bytes,
            used_bytes=self._bytes,
            requested_bytes=size_bytes,
        )


def _check_now(now: float) -> None:
    if not math.isfinite(now):
        raise TaskQueueError(f"now is {now}; must be a finite time in seconds")


def _check_id(name: str, value: str) -> None:
    if not isinstance(value, str) or not 0 < len(value) <= MAX_ID_CHARS:
        raise TaskQueueError(f"{name} {str(value)[:48]!r} must be a string of 1 to {MAX_ID_CHARS} characters")


def _check_range(name: str, value: float, low: float, high: float | None) -> None:
    """``value`` in [low, high]; an integer when ``low`` is one (counts and sizes)."""
    kind = int if isinstance(low, int) else int | float
    if isinstance(value, bool) or not isinstance(value, kind) or not math.isfinite(value):
        raise TaskQueueError(f"{name} is {value!r}; must be a finite {'integer' if kind is int else 'number'}")
    if value < low or (high is not None and value > high):
        limit = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise TaskQueueError(f"{name} is {value}; must be {limit}")
