"""A daemon's worker: claims micro-batch tasks from the stage hosts, computes them, sends results on.

One loop per daemon, on the event loop; torch runs in a worker thread. Each round it asks a
stage with ready work (as the hosts last reported) for a task, its *home* stage first (the
stage it hosts, or one spread over the workers that host none: each stage's weights change
with every update, so a worker that hops stages pulls far more), backward before forward at
the host. A task's stage input (and, for a backward, its output gradient) comes
with the lease; the worker pulls the weights version the task names (PipeDream: a
micro-batch's backward recomputes its forward on the weights that forward used), or for a new
forward the host's newest (a version behind costs a measurable loss gap at equal tokens).

- A forward's output goes to the next stage's host as a forward task; then the lease is
  completed with the version used.
- A finishing task (backward; or the last stage's forward, which runs loss and backward) sends
  its input gradient upstream and adds its parameter gradient to this stage's sum. Its lease
  stays open until the sum is pushed, ``push_every`` micro-batches later, or sooner when the
  worker runs out of tasks (so that held micro-batches never starve the pipeline) or a lease
  nears its end. The host completes the leases with the push, in one step.
- When a result cannot be delivered, the leases held for that stage are failed (re-queued)
  and the sum is discarded, so nothing is applied twice; the hosts recompute those tasks.
- When the run's epoch changes (a stage changed hands), the sums held are pushed under the
  epoch their leases are from: the hosts carry finishing leases past the change, because the
  stage below may finish those micro-batches meanwhile and never feed them again. Such a push
  is retried, with backoff, until the stage's host (perhaps a new one) takes or refuses it.
- A task whose gradient the host already has (a recompute after an epoch change) runs for its
  output only and is completed without a push.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from swarmd.errors import SwarmdError
from swarmd.models.build import ModelShape, build_model
from swarmd.models.corpus import Dataset
from swarmd.models.stage_worker import StageWorker
from swarmd.models.stages import StageModule, split_layers, stage_input_spec, stage_output_spec
from swarmd.peers.idle_polling import FLUSH_IDLE_S, IDLE_MAX_S, IDLE_MIN_S  # the simulator's schedule too
from swarmd.peers.op_times import OpTimes
from swarmd.peers.wire.rpc import Answer
from swarmd.peers.wire.tensors import TensorSpec, decode_tensor, encode_tensor
from swarmd.stage_host import PUSH_AGAIN, StageRequestError, deserialize_tensors, serialize_tensors

logger = logging.getLogger(__name__)

Request = Callable[[int, str, dict[str, Any], list[bytes]], Awaitable[Answer]]

PUT_RETRY_S = 10.0
CARRIED_RETRY_S = 60.0
"""How long a sum from before an epoch change is offered to its stage's host (a new host must
open first); the hosts carry the leases for ``max_lease_s``."""
MAX_CARRIED_PUSHES = 16
CARRIED_MAX_DELAY_S = 1.0
"""Longest wait between offers of such a sum: sooner is better, a recompute may race it in."""
FINAL_CARRIED_S = 8.0
"""On stop, how long the last offers of such sums may take (within the trainer's stop timeout)."""
STAGE_BACKOFF_S = 0.5
FAILURE_BACKOFF_S, MAX_FAILURE_BACKOFF_S = 0.1, 2.0


@dataclass(frozen=True, kw_only=True)
class WorkerSettings:
    shape: ModelShape
    stages: int
    seed: int
    micro_batch: int
    push_every: int
    """Finished micro-batches summed before a push (the hosts sum pushes into full batches)."""
    wire_dtype: str = "fp16"
    lease_s: float = 30.0
    keep_versions: int = 8


ALREADY_THERE = ("is already queued", "already has a stored input", "already has a backward task")
"""How a host refuses a ``put`` of what it already holds (``swarmd.peers.task_queue``)."""
UPSTREAM_DONE = "no stage input stored for micro-batch"
"""How a host refuses a gradient for a micro-batch it has finished (or never had in this epoch)."""


CHANGING_HANDS = ("does not host stage", "has no host right now")
"""How a request is refused while its stage is between hosts: asked again, a new host may take it."""
MOVED_ON = ("this host is at", *CHANGING_HANDS)
"""How a host (or its daemon) refuses a request from an epoch that has ended."""


def epoch_moved_on(error: Exception) -> bool:
    """Whether a refused request means the run's epoch changed under it (a stage changed hands)."""
    return any(phrase in str(error) for phrase in MOVED_ON)


def already_there(error: Exception) -> bool:
    """Whether a refused ``put`` means the stage already holds that task: delivered, in effect."""
    return any(phrase in str(error) for phrase in ALREADY_THERE)


def upstream_is_done(error: Exception) -> bool:
    """Whether a refused backward ``put`` means the stage below is already past that micro-batch."""
    return UPSTREAM_DONE in str(error)


@dataclass
class WorkerStats:
    tasks: dict[str, int] = field(default_factory=lambda: {"forward": 0, "backward": 0, "last": 0})
    pushes: int = 0
    pushes_refused: int = 0
    micro_batches_pushed: int = 0
    weight_pulls: int = 0
    results_failed: int = 0
    upstream_done: int = 0
    """Backward results the stage below refused because it had finished that micro-batch."""
    already_there: int = 0
    """Results the next stage already held (an earlier try's answer was lost, or a copy won)."""
    carried_pushes: int = 0
    """Sums offered again and taken: from before an epoch change (their leases carried by the
    hosts), or held back while a host waited for a carried gradient."""
    carried_dropped: int = 0
    """Such sums no host took (refused, or no host within ``CARRIED_RETRY_S``): recomputed or lost."""
    output_only: int = 0
    """Tasks run for their output alone: the host already had their micro-batch's gradient."""
    seconds: dict[str, float] = field(
        default_factory=lambda: {"compute": 0.0, "serialise": 0.0, "requests": 0.0, "waiting": 0.0}
    )
    """compute: torch; serialise: tensor frames and safetensors; requests: to hosts (wire and
    their handling); waiting: nothing to claim."""
    losses: list[tuple[int, float]] = field(default_factory=list)
    by_op: OpTimes = field(default_factory=lambda: OpTimes())
    """Requests to hosts by operation: how many, and how long they took from here."""


@dataclass
class _Held:
    lease_ids: list[str] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    since: float = 0.0


@dataclass(eq=False)
class _CarriedPush:
    """A sum taken at an epoch change, offered to its stage's host until taken or too old."""

    stage: int
    header: dict[str, Any]
    blob: bytes
    until: float
    next_try: float = 0.0
    delay: float = 0.25


class PipelineWorker:
    def __init__(self, settings: WorkerSettings, dataset: Dataset, worker_id: str, request: Request,
                 epoch: Callable[[], str | None], home: Callable[[], int | None] = lambda: None) -> None:  # fmt: skip
        self.settings = settings
        self.dataset = dataset
        self.worker_id = worker_id
        self._request = request
        self._epoch = epoch
        self._home = home
        self.stats = WorkerStats()
        self.host_versions = [0] * settings.stages
        s, mb = settings, settings.micro_batch
        model = build_model(s.shape, s.seed)
        ranges = split_layers(s.shape.layers, s.stages)
        self._workers = [
            StageWorker(StageModule(model, ranges, i), keep_versions=s.keep_versions, accumulate=s.push_every)
            for i in range(s.stages)
        ]
        self._param_shapes = [{n: p.shape for n, p in w.module.named_parameters()} for w in self._workers]
        self._in = [TensorSpec.like(stage_input_spec(s.shape, i, mb)) for i in range(s.stages)]
        self._out = [TensorSpec.like(stage_output_spec(s.shape, i, s.stages, mb)) for i in range(s.stages)]
        self._held = [_Held() for _ in range(s.stages)]
        self._ready = [1] * s.stages
        self._backoff_until = [0.0] * s.stages
        self._current_epoch: str | None = None
        self._carried: list[_CarriedPush] = []
        self._offering: asyncio.Task[None] | None = None  # offers them off the loop: a dead host can't stall it
        self._failures = 0  # tasks failed in a row

    # --- the loop ----------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        idle_s, idle_since = IDLE_MIN_S, None
        while not stop.is_set():
            epoch = self._epoch()
            if epoch != self._current_epoch:
                # The hosts carry our finishing leases past the change: push those sums under
                # the old epoch. A stage that changed hands may have resumed at an older
                # version: weights cached here are void.
                await self._carry_held()
                for worker in self._workers:
                    worker.forget_versions()
                self._current_epoch = epoch
            if self._carried and (self._offering is None or self._offering.done()):
                self._offering = asyncio.create_task(self._push_carried())
            if epoch is None:
                await self._wait(stop, 0.2)
                continue
            await self._flush_old()
            if await self._one_task(epoch):
                idle_s, idle_since = IDLE_MIN_S, None
                continue
            now = time.monotonic()
            idle_since = idle_since or now
            if now - idle_since >= FLUSH_IDLE_S:
                for s in range(self.settings.stages):
                    await self._push(s)  # nothing to do: don't sit on micro-batches others wait for
            await self._wait(stop, idle_s)
            idle_s = min(idle_s * 2, IDLE_MAX_S)
        for s in range(self.settings.stages):
            await self._push(s)
        if self._offering is not None:
            await asyncio.gather(self._offering, return_exceptions=True)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._push_carried(final=True), FINAL_CARRIED_S)

    async def release(self) -> None:
        """Hand back what is held: push sums, fail the rest (used on stop)."""
        for s in range(self.settings.stages):
            await self._push(s)

    async def _wait(self, stop: asyncio.Event, seconds: float) -> None:
        started = time.perf_counter()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), seconds)
        self.stats.seconds["waiting"] += time.perf_counter() - started

    def _stage_order(self) -> list[int]:
        now = time.monotonic()
        stages = [s for s in range(self.settings.stages) if self._backoff_until[s] <= now]
        home = self._home()
        # Stages with work first; among them the home stage (its weights are fresh here, and
        # pulling another stage's weights for every version costs more than the task), then
        # the most backlogged; later stages break ties (they finish micro-batches).
        return sorted(stages, key=lambda s: (self._ready[s] == 0, s != home, -self._ready[s], -s))

    async def _one_task(self, epoch: str) -> bool:
        for s in self._stage_order():
            try:
                have = self._workers[s].versions
                claim = {"epoch": epoch, "lease_s": self.settings.lease_s, "have": have}
                answer, blobs = await self._call(s, "claim", claim)
            except SwarmdError as e:
                logger.debug("claim on stage %d failed: %s", s, e)
                self._backoff_until[s] = time.monotonic() + STAGE_BACKOFF_S
                continue
            self._ready[s] = int(answer.get("ready", 0))
            self.host_versions[s] = max(self.host_versions[s], int(answer.get("version", 0)))
            if "lease_id" not in answer:
                continue
            try:
                if "weights" in answer:  # the host sent the weights this task needs along with it
                    await self._add_weights(s, answer["weights"], blobs.pop())
                await self._run_task(s, epoch, answer, blobs)
                self._failures = 0
            except SwarmdError as e:
                logger.info("stage %d task %s failed: %s; handing it back", s, answer["lease_id"], e)
                await self._fail(s, epoch, [answer["lease_id"]])
                # A peer that cannot be reached fails fast: do not spin on it until the swarm
                # notices it is gone.
                self._failures += 1
                await asyncio.sleep(min(FAILURE_BACKOFF_S * 2 ** (self._failures - 1), MAX_FAILURE_BACKOFF_S))
            return True
        return False

    # --- one task ---------------------------------------------------------------------------

    async def _run_task(self, s: int, epoch: str, task: dict[str, Any], blobs: list[bytes]) -> None:
        kind, m, lease_id = task["kind"], task["micro_batch"], task["lease_id"]
        last = s == self.settings.stages - 1
        output_only = task.get("applied") is True  # the host has this micro-batch's gradient already
        if output_only and s == 0:  # and stage 0 sends nothing on: done without computing
            await self._complete(s, epoch, lease_id, 0)
            return
        if kind == "backward" or task.get("weights_version") is not None:
            version = await self._weights(s, task["weights_version"], exact=True)
        else:
            version = await self._weights(s, task["version"], exact=False)
        if len(blobs) != (2 if kind == "backward" else 1):
            raise SwarmdError(f"stage {s} sent {len(blobs)} tensors with a {kind} task")
        started = time.perf_counter()
        out_frame, loss = await asyncio.to_thread(self._compute, s, kind, m, version, blobs, not output_only)
        self.stats.seconds["compute"] += time.perf_counter() - started
        if kind == "forward" and not last:
            self.stats.tasks["forward"] += 1
            assert out_frame is not None
            await self._put(s + 1, epoch, "forward", m, out_frame, upstream_version=version)
            await self._call(s, "complete", {"epoch": epoch, "lease_id": lease_id, "weights_version": version})
            return
        self.stats.tasks["last" if last else "backward"] += 1
        held = self._held[s]
        if out_frame is not None:
            try:
                await self._put(s - 1, epoch, "backward", m, out_frame, weights_version=task.get("upstream_version"))
            except SwarmdError as e:
                if upstream_is_done(e):
                    # The stage below already finished this micro-batch (another copy of it got
                    # there first): it needs no gradient from us, but our own gradient is good.
                    # Failing the task would only redo it into the same refusal, forever.
                    self.stats.upstream_done += 1
                elif epoch_moved_on(e) and not output_only:
                    # The epoch changed under this task: its host carries the lease with the
                    # others held here, and our gradient is good. Held, it is pushed with them.
                    pass
                elif output_only:
                    raise
                else:
                    self._workers[s].discard()  # the sum holds this micro-batch: redo them all
                    await self._fail(s, epoch, [*held.lease_ids, lease_id])
                    self._held[s] = _Held()
                    raise
        if output_only:
            await self._complete(s, epoch, lease_id, version)
            return
        if not held.lease_ids:
            held.since = time.monotonic()
        held.lease_ids.append(lease_id)
        if loss is not None:
            held.losses.append(loss)
            self.stats.losses.append((m, loss))
            del self.stats.losses[:-256]
        if self._workers[s].ready_to_push():
            await self._push(s)

    async def _complete(self, s: int, epoch: str, lease_id: str, version: int) -> None:
        """Complete a task whose gradient the host already has (run, if at all, for its output)."""
        await self._call(s, "complete", {"epoch": epoch, "lease_id": lease_id, "weights_version": version})
        self.stats.output_only += 1

    def _compute(
        self, s: int, kind: str, m: int, version: int, blobs: list[bytes], accumulate: bool = True
    ) -> tuple[bytes | None, float | None]:
        worker, last = self._workers[s], s == self.settings.stages - 1
        x = decode_tensor(blobs[0], self._in[s])
        if kind == "forward" and not last:
            return encode_tensor(worker.forward(x, version), self.settings.wire_dtype), None
        if kind == "forward":
            labels = self.dataset.micro_batch(m, self.settings.micro_batch)
            result = worker.train_last(x, labels, version, accumulate=accumulate)
        else:
            result = worker.backward(x, decode_tensor(blobs[1], self._out[s]), version, accumulate=accumulate)
        grad = None if result.grad_input is None else encode_tensor(result.grad_input, self.settings.wire_dtype)
        return grad, result.loss

    async def _weights(self, s: int, version: int | None, *, exact: bool) -> int:
        """A weights version to compute with: ``version`` itself when ``exact``, else one close to it."""
        worker = self._workers[s]
        newest = worker.newest_version
        if exact and version is not None and worker.has_version(version):
            return version
        if not exact and newest is not None and version is not None and newest >= version:
            return newest
        answer, blobs = await self._call(s, "weights", {} if version is None else {"version": version})
        got = answer.get("version")
        if len(blobs) != 1:
            raise SwarmdError(f"stage {s} answered a weights request without one blob")
        await self._add_weights(s, got, blobs[0])
        return int(got)

    async def _add_weights(self, s: int, version: object, blob: bytes) -> None:
        if type(version) is not int or version < 0:
            raise SwarmdError(f"stage {s} sent weights without a version")
        started = time.perf_counter()
        weights = await asyncio.to_thread(deserialize_tensors, blob, self._param_shapes[s], "weights")
        self.stats.seconds["serialise"] += time.perf_counter() - started
        self._workers[s].add_weights(version, weights)
        self.stats.weight_pulls += 1

    async def _put(self, s: int, epoch: str, kind: str, m: int, frame: bytes, **versions: int | None) -> None:
        header = {
            "epoch": epoch,
            "kind": kind,
            "micro_batch": m,
            **{k: v for k, v in versions.items() if v is not None},
        }
        deadline, delay = time.monotonic() + PUT_RETRY_S, 0.01
        while True:
            try:
                await self._call(s, "put", header, [frame])
                return
            except SwarmdError as e:
                if already_there(e):
                    # An earlier try was queued but its answer lost (a stream broke), or another
                    # copy got there first: the stage has it. Failing our task for it would redo
                    # the task into the same refusal, forever.
                    self.stats.already_there += 1
                    return
                if "full" not in str(e) or time.monotonic() + delay > deadline:
                    self.stats.results_failed += 1
                    raise
            await asyncio.sleep(delay)  # backpressure: the next stage is full; its workers drain it
            self.stats.seconds["waiting"] += delay
            delay = min(delay * 2, 0.5)

    async def _take_sum(self, s: int) -> tuple[dict[str, Any], bytes] | None:
        """The push of stage ``s``'s held sum (its header and gradient blob); nothing is held after."""
        held, worker = self._held[s], self._workers[s]
        if not held.lease_ids:
            return None
        self._held[s] = _Held()
        push = worker.take_push()
        if push is None or self._current_epoch is None:
            return None
        started = time.perf_counter()
        blob = await asyncio.to_thread(serialize_tensors, push.gradients)
        self.stats.seconds["serialise"] += time.perf_counter() - started
        header = {"epoch": self._current_epoch, "lease_ids": held.lease_ids, "base_version": push.base_version,
                  "losses": held.losses}  # fmt: skip
        return header, blob

    async def _push(self, s: int) -> None:
        taken = await self._take_sum(s)
        if taken is None:
            return
        header, blob = taken
        try:
            answer, _ = await self._call(s, "push", header, [blob])
        except SwarmdError as e:
            if epoch_moved_on(e) or PUSH_AGAIN in str(e):  # the epoch ended under it (the hosts carry its
                # leases), or the host waits for a carried gradient of one of its micro-batches: offered again
                self._offer_later(_CarriedPush(s, header, blob, time.monotonic() + CARRIED_RETRY_S))
                return
            self.stats.pushes_refused += 1
            logger.info("push of %d micro-batch(es) to stage %d refused: %s", len(header["lease_ids"]), s, e)
            return
        self._pushed(s, header, answer)

    def _pushed(self, s: int, header: dict[str, Any], answer: dict[str, Any]) -> None:
        self.stats.pushes += 1
        self.stats.micro_batches_pushed += len(header["lease_ids"])
        self.host_versions[s] = max(self.host_versions[s], int(answer.get("version", 0)))

    async def _carry_held(self) -> None:
        """At an epoch change: take every held sum, to push under the epoch its leases are from."""
        for s in range(self.settings.stages):
            taken = await self._take_sum(s)
            if taken is not None:
                self._offer_later(_CarriedPush(s, *taken, until=time.monotonic() + CARRIED_RETRY_S))

    def _offer_later(self, carried: _CarriedPush) -> None:
        self._carried.append(carried)
        while len(self._carried) > MAX_CARRIED_PUSHES:
            self._drop_carried(self._carried.pop(0), "too many sums waiting")

    async def _push_carried(self, final: bool = False) -> None:
        """Offer each sum from before an epoch change to its stage's host; one that is not up
        yet (a stage changing hands) is asked again, with backoff, until ``CARRIED_RETRY_S``."""
        now = time.monotonic()
        for carried in [c for c in self._carried if final or c.next_try <= now]:
            try:
                answer, _ = await self._call(carried.stage, "push", carried.header, [carried.blob])
            except SwarmdError as e:
                not_now = (*CHANGING_HANDS, PUSH_AGAIN)  # the stage is changing hands, or the host waits
                host_said_no = (isinstance(e, StageRequestError) or "refused by" in str(e)) and not any(
                    phrase in str(e) for phrase in not_now
                )
                now = time.monotonic()
                if final or host_said_no or now >= carried.until:
                    self._discard_carried(carried, str(e))
                else:
                    carried.next_try, carried.delay = now + carried.delay, min(carried.delay * 2, CARRIED_MAX_DELAY_S)
                continue
            if carried not in self._carried:  # dropped meanwhile (too many waiting)
                continue
            self._carried.remove(carried)
            self.stats.carried_pushes += 1
            self._pushed(carried.stage, carried.header, answer)

    def _discard_carried(self, carried: _CarriedPush, why: str) -> None:
        if carried in self._carried:
            self._carried.remove(carried)
            self._drop_carried(carried, why)

    def _drop_carried(self, carried: _CarriedPush, why: str) -> None:
        self.stats.carried_dropped += 1
        logger.info("sum of %d micro-batch(es) offered again (an epoch change, or a wait) not taken by stage %d: %s",
                    len(carried.header["lease_ids"]), carried.stage, why)  # fmt: skip

    async def _flush_old(self) -> None:
        """Push a sum whose oldest lease has run a third of its time: it must not expire."""
        now = time.monotonic()
        for s, held in enumerate(self._held):
            if held.lease_ids and now - held.since > self.settings.lease_s / 3:
                await self._push(s)

    async def _fail(self, s: int, epoch: str, lease_ids: list[str]) -> None:
        try:
            await self._call(s, "fail", {"epoch": epoch, "lease_ids": lease_ids})
        except SwarmdError as e:
            logger.debug("could not hand back %d lease(s) on stage %d (%s); they expire", len(lease_ids), s, e)

    async def _call(self, s: int, op: str, header: dict[str, Any], blobs: list[bytes] | None = None) -> Answer:
        started = time.perf_counter()
        try:
            return await self._request(s, op, header, blobs or [])
        finally:
            elapsed = time.perf_counter() - started
            self.stats.seconds["requests"] += elapsed
            self.stats.by_op.add(op, elapsed)

    def status(self) -> dict[str, Any]:
        st = self.stats
        return {
            "tasks": dict(st.tasks), "pushes": st.pushes, "pushes_refused": st.pushes_refused,
            "micro_batches_pushed": st.micro_batches_pushed, "weight_pulls": st.weight_pulls,
            "results_failed": st.results_failed, "upstream_done": st.upstream_done, "already_there": st.already_there,
            "carried_pushes": st.carried_pushes, "carried_dropped": st.carried_dropped, "output_only": st.output_only,
            "seconds": {k: round(v, 2) for k, v in st.seconds.items()},
            "host_versions": list(self.host_versions), "requests_by_op": st.by_op.status(),
        }  # fmt: skip
