"""peers/task_queue.py: ordering, leases, re-queues, backpressure, memory, and what is never lost."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import pytest

from swarmd.errors import SwarmdError
from swarmd.peers.task_queue import (
    MAX_ID_CHARS,
    Lease,
    LeaseError,
    QueueFull,
    Task,
    TaskKind,
    TaskQueue,
    TaskQueueConfig,
    TaskQueueError,
    UnknownMicroBatch,
)

pytestmark = pytest.mark.timeout(60)

FWD, BWD = TaskKind.FORWARD, TaskKind.BACKWARD


def make_queue(**overrides: int | float) -> TaskQueue:
    fields: dict[str, int | float] = dict(stage=1, capacity_bytes=1000, max_attempts=3, max_lease_s=60.0)
    fields.update(overrides)
    return TaskQueue(TaskQueueConfig(**fields))  # type: ignore[arg-type]


def fwd(mb: int, payload: object = None) -> Task:
    return Task(task_id=f"f{mb}", micro_batch=mb, stage=1, kind=FWD, payload=payload or f"input{mb}")


def bwd(mb: int, version: int | None = None) -> Task:
    return Task(task_id=f"b{mb}", micro_batch=mb, stage=1, kind=BWD, payload=f"grad{mb}", weights_version=version)


def run_forward(q: TaskQueue, mb: int, now: float = 0.0, size: int = 10, version: int = 0) -> None:
    """Put micro-batch ``mb``'s forward and complete it (assumes nothing else is ready)."""
    q.put(fwd(mb), size, now)
    lease = q.claim("w", now, 10.0)
    assert lease is not None and lease.task.task_id == f"f{mb}"
    q.complete(lease.lease_id, "w", now, weights_version=version)


def claim(q: TaskQueue, worker: str = "w", now: float = 0.0, lease_s: float = 10.0) -> Lease:
    lease = q.claim(worker, now, lease_s)
    assert lease is not None
    return lease


# -- ordering and leases ------------------------------------------------------------------


def test_backward_before_forward_and_oldest_first() -> None:
    q = make_queue()
    run_forward(q, 0)
    run_forward(q, 1)
    for mb in (2, 3, 4):
        q.put(fwd(mb), 10, 1.0)
    q.put(bwd(1), 10, 2.0)
    q.put(bwd(0), 10, 3.0)
    order = [claim(q).task.task_id for _ in range(5)]
    assert order == ["b1", "b0", "f2", "f3", "f4"]
    assert q.claim("w", 4.0, 10.0) is None


def test_lease_carries_expiry_and_stage_input() -> None:
    q = make_queue()
    q.put(fwd(0, payload=b"x" * 5), 5, 0.0)
    lease = claim(q, "worker-a", now=100.0, lease_s=7.5)
    assert lease.worker_id == "worker-a" and lease.expires_at == 107.5
    assert lease.task.payload == lease.stage_input == b"x" * 5
    assert q.counters().leased == 1 and q.counters().ready == 0


def test_lease_length_is_bounded() -> None:
    q = make_queue(max_lease_s=30.0)
    q.put(fwd(0), 1, 0.0)
    for bad in (0.0, -1.0, 30.5, math.inf, math.nan):
        with pytest.raises(TaskQueueError, match="lease_s"):
            q.claim("w", 0.0, bad)
    assert claim(q, lease_s=30.0).expires_at == 30.0


def test_expired_lease_requeues_in_its_old_place() -> None:
    q = make_queue()
    q.put(fwd(0), 1, 0.0)
    q.put(fwd(1), 1, 0.0)
    first = claim(q, "a", 0.0, 10.0)
    assert q.expire(9.99) == []
    assert q.expire(10.0) == ["f0"]
    c = q.counters()
    assert (c.requeued_expired, c.ready, c.leased) == (1, 2, 0)
    again = claim(q, "b", 11.0)
    assert again.task.task_id == "f0" and again.task.attempts == 1  # still ahead of f1
    with pytest.raises(LeaseError):  # the old holder's late result is refused
        q.complete(first.lease_id, "a", 12.0)


def test_lease_is_over_at_expiry_even_unswept() -> None:
    q = make_queue()
    q.put(fwd(0), 1, 0.0)
    lease = claim(q, "a", 0.0, 5.0)
    with pytest.raises(LeaseError, match="unknown or over"):
        q.complete(lease.lease_id, "a", 5.0)
    assert q.counters().requeued_expired == 1 and q.counters().ready == 1


def test_only_the_holder_renews_or_completes() -> None:
    q = make_queue()
    q.put(fwd(0), 1, 0.0)
    lease = claim(q, "a", 0.0, 10.0)
    for call in (q.renew, q.complete, q.fail):
        with pytest.raises(LeaseError, match="held by 'a', not 'b'") as info:
            call(lease.lease_id, "b", 1.0)
        assert info.value.worker_id == "b" and info.value.lease_id == lease.lease_id
    with pytest.raises(LeaseError, match="unknown"):
        q.complete("no-such-lease", "a", 1.0)
    renewed = q.renew(lease.lease_id, "a", 8.0)
    assert renewed.expires_at == 18.0
    assert q.expire(15.0) == []
    assert q.complete(lease.lease_id, "a", 17.0).task_id == "f0"
    with pytest.raises(LeaseError):  # a lease completes once
        q.complete(lease.lease_id, "a", 17.0)
    assert q.counters().completed == 1


def test_fail_requeues_at_once() -> None:
    q = make_queue()
    q.put(fwd(0), 1, 0.0)
    lease = claim(q, "a")
    q.fail(lease.lease_id, "a", 1.0)
    c = q.counters()
    assert (c.requeued_failed, c.ready, c.leased) == (1, 1, 0)
    assert claim(q, "b", 1.0).task.attempts == 1


def test_drop_worker_requeues_only_its_leases() -> None:
    q = make_queue()
    for mb in range(4):
        q.put(fwd(mb), 1, 0.0)
    a1, b1, a2 = claim(q, "a"), claim(q, "b"), claim(q, "a")
    assert sorted(q.drop_worker("a", 1.0)) == sorted([a1.task.task_id, a2.task.task_id])
    assert q.drop_worker("nobody", 1.0) == []
    c = q.counters()
    assert (c.requeued_worker_gone, c.ready, c.leased) == (2, 3, 1)
    q.complete(b1.lease_id, "b", 1.0)  # the other worker is untouched
    with pytest.raises(LeaseError):
        q.renew(a1.lease_id, "a", 1.0)


# -- memory and backpressure --------------------------------------------------------------


def test_backpressure_with_backward_reserve() -> None:
    q = make_queue(capacity_bytes=100, backward_reserve_bytes=20)
    q.put(fwd(0), 50, 0.0)
    assert q.has_room(30) and not q.has_room(31)
    assert q.has_room(50, BWD) and not q.has_room(51, BWD)
    with pytest.raises(QueueFull, match="30 more|50 of the 80 bytes") as info:
        q.put(fwd(1), 40, 0.0)
    assert (info.value.capacity_bytes, info.value.used_bytes, info.value.requested_bytes) == (100, 50, 40)
    # forwards cannot eat the reserve, so the backward that frees memory always fits
    q.put(fwd(1), 30, 0.0)
    lease = claim(q)
    q.complete(lease.lease_id, "w", 0.0)
    q.put(bwd(0), 20, 0.0)
    assert q.counters().bytes_used == 100
    lease = claim(q)
    assert lease.task.task_id == "b0"
    q.complete(lease.lease_id, "w", 0.0)
    assert q.counters().bytes_used == 30 and q.has_room(50)


def test_too_big_ever_to_fit_is_an_error_not_backpressure() -> None:
    q = make_queue(capacity_bytes=100, backward_reserve_bytes=20)
    with pytest.raises(TaskQueueError, match=r"forward size_bytes is 81; must be in \[0, 80\]") as info:
        q.put(fwd(0), 81, 0.0)
    assert not isinstance(info.value, QueueFull)
    with pytest.raises(TaskQueueError, match="size_bytes is -1"):
        q.put(fwd(0), -1, 0.0)


def test_micro_batches_in_flight_are_bounded() -> None:
    q = make_queue(max_micro_batches=2)
    q.put(fwd(0), 1, 0.0)
    q.put(fwd(1), 1, 0.0)
    assert not q.has_room(1)
    with pytest.raises(QueueFull, match="max_micro_batches"):
        q.put(fwd(2), 1, 0.0)


def test_stored_input_is_kept_until_backward_completes() -> None:
    q = make_queue()
    q.put(fwd(7, payload="in7"), 300, 0.0)
    assert q.counters().bytes_used == 300  # the forward's payload is the stored input, counted once
    lease = claim(q)
    q.complete(lease.lease_id, "w", 1.0, weights_version=4)
    assert q.counters().bytes_used == 300 and q.stored_micro_batches() == [7]
    q.put(bwd(7), 200, 2.0)
    assert q.counters().bytes_used == 500
    lease = claim(q)
    assert lease.stage_input == "in7" and lease.task.payload == "grad7"
    assert lease.task.weights_version == 4  # the forward's version (PipeDream)
    q.complete(lease.lease_id, "w", 3.0)
    c = q.counters()
    assert (c.bytes_used, c.micro_batches, c.outstanding) == (0, 0, 0)
    assert q.stored_micro_batches() == []
    with pytest.raises(UnknownMicroBatch):  # finished: a late backward is refused
        q.put(Task(task_id="b7x", micro_batch=7, stage=1, kind=BWD, payload="g"), 1, 4.0)


def test_last_stage_finishes_in_the_forward() -> None:
    q = make_queue()
    q.put(fwd(0), 100, 0.0)
    lease = claim(q)
    q.complete(lease.lease_id, "w", 1.0, finishes_micro_batch=True)
    assert q.counters().bytes_used == 0 and q.stored_micro_batches() == []


def test_backward_needs_its_forward_here() -> None:
    q = make_queue()
    with pytest.raises(UnknownMicroBatch, match="micro-batch 3") as info:
        q.put(bwd(3), 1, 0.0)
    assert info.value.micro_batch == 3
    run_forward(q, 3)
    q.put(bwd(3), 1, 0.0)
    with pytest.raises(TaskQueueError, match="already has a backward"):
        q.put(Task(task_id="b3-again", micro_batch=3, stage=1, kind=BWD, payload="g"), 1, 0.0)


# -- recompute and attempts ---------------------------------------------------------------


def test_recompute_forward_from_stored_input() -> None:
    q = make_queue()
    q.put(fwd(5, payload="in5"), 40, 0.0)
    assert q.recompute_forward(5, 0.0) is None  # its forward is still queued
    run_lease = claim(q)
    q.complete(run_lease.lease_id, "w", 1.0, weights_version=9)
    q.put(bwd(5), 10, 2.0)
    task = q.recompute_forward(5, 3.0)
    assert task is not None and task.payload == "in5" and task.weights_version == 9 and task.kind is FWD
    assert q.recompute_forward(5, 3.0) is None  # one forward per micro-batch at a time
    c = q.counters()
    assert (c.recomputed, c.put, c.bytes_used) == (1, 3, 50)  # no new bytes: the input is stored
    b, f = claim(q), claim(q)
    assert (b.task.kind, f.task.task_id) == (BWD, task.task_id)
    q.complete(b.lease_id, "w", 4.0)
    assert q.counters().bytes_used == 40  # the recomputing forward still needs the input
    q.complete(f.lease_id, "w", 5.0)
    assert q.counters().bytes_used == 0
    with pytest.raises(UnknownMicroBatch):
        q.recompute_forward(5, 6.0)


def test_attempts_cap_requeues_at_the_back_never_drops() -> None:
    q = make_queue(max_attempts=2)
    q.put(fwd(0), 1, 0.0)
    q.put(fwd(1), 1, 0.0)
    lease = claim(q, "a")
    assert lease.task.task_id == "f0"
    q.fail(lease.lease_id, "a", 1.0)
    lease = claim(q, "a")
    assert lease.task.task_id == "f0" and lease.task.attempts == 1  # first failure keeps its place
    q.fail(lease.lease_id, "a", 2.0)  # second failure: at the cap
    assert q.counters().exhausted == 1
    assert claim(q, "b").task.task_id == "f1"  # the healthy task goes first now
    for i in range(5):
        lease = claim(q, "a", float(i))
        assert lease.task.task_id == "f0" and lease.task.attempts == 2
        q.drop_worker("a", float(i))
    c = q.counters()
    assert c.exhausted == 6 and c.outstanding == 2 and c.put == c.completed + c.outstanding


# -- input validation ---------------------------------------------------------------------


def test_inputs_are_validated_with_the_value_and_limit() -> None:
    q = make_queue()
    with pytest.raises(TaskQueueError, match=f"1 to {MAX_ID_CHARS} characters"):
        q.claim("x" * (MAX_ID_CHARS + 1), 0.0, 1.0)
    with pytest.raises(TaskQueueError, match="worker_id"):
        q.claim("", 0.0, 1.0)
    with pytest.raises(TaskQueueError, match="now is nan"):
        q.claim("w", math.nan, 1.0)
    with pytest.raises(TaskQueueError, match="stage 2; this queue serves 1"):
        q.put(Task(task_id="t", micro_batch=0, stage=2, kind=FWD, payload=1), 1, 0.0)
    with pytest.raises(TaskQueueError, match="micro_batch is -1"):
        q.put(Task(task_id="t", micro_batch=-1, stage=1, kind=FWD, payload=1), 1, 0.0)
    with pytest.raises(TaskQueueError, match="must be a finite integer"):
        q.put(fwd(0), 1.5, 0.0)  # type: ignore[arg-type]
    q.put(fwd(0), 1, 0.0)
    with pytest.raises(TaskQueueError, match="already queued"):
        q.put(fwd(0), 1, 0.0)
    with pytest.raises(TaskQueueError, match="already has a stored input"):
        q.put(Task(task_id="other", micro_batch=0, stage=1, kind=FWD, payload=1), 1, 0.0)
    assert issubclass(TaskQueueError, SwarmdError)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("capacity_bytes", 0, r"capacity_bytes is 0; must be >= 1"),
        ("backward_reserve_bytes", 1000, r"backward_reserve_bytes is 1000; must be in \[0, 999\]"),
        ("max_micro_batches", 0, r"max_micro_batches is 0"),
        ("max_attempts", 0, r"max_attempts is 0"),
        ("max_lease_s", 7200.0, r"max_lease_s is 7200.0; must be in"),
        ("stage", -1, r"stage is -1"),
    ],
)
def test_config_is_validated(field: str, value: float, message: str) -> None:
    with pytest.raises(TaskQueueError, match=message):
        make_queue(**{field: value})


# -- nothing is lost: random operations, invariants after every step ----------------------


@dataclass
class _Shadow:  # what the test expects, computed without the queue's own bookkeeping
    input_bytes: int
    grad_bytes: int = 0  # held while the backward is outstanding
    outstanding: int = 0
    forward_done: bool = False
    has_backward: bool = False
    finished: bool = False


MAX_GRAD = 50


def _check_invariants(q: TaskQueue, shadow: dict[int, _Shadow]) -> None:
    c = q.counters()
    assert c.put == c.completed + c.outstanding
    assert c.claimed == c.completed + c.requeued_expired + c.requeued_failed + c.requeued_worker_gone + c.leased
    assert c.outstanding == c.ready + c.leased
    assert 0 <= c.bytes_used <= c.capacity_bytes
    live = {mb: s for mb, s in shadow.items() if not s.finished or s.outstanding > 0}
    assert q.stored_micro_batches() == sorted(live)
    assert c.bytes_used == sum(s.input_bytes + s.grad_bytes for s in live.values())
    assert c.outstanding == sum(s.outstanding for s in shadow.values())


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_operations_lose_nothing(seed: int) -> None:
    rng = random.Random(seed)
    max_mb = 12
    # Reserve enough for every in-flight micro-batch's gradient: backward puts must never block.
    q = make_queue(
        capacity_bytes=400 + max_mb * MAX_GRAD,
        backward_reserve_bytes=max_mb * MAX_GRAD,
        max_micro_batches=max_mb,
        max_attempts=4,
    )
    workers = [f"w{i}" for i in range(4)]
    shadow: dict[int, _Shadow] = {}
    leases: dict[str, Lease] = {}
    now, next_mb = 0.0, 0

    def finish(lease: Lease, finishes: bool = False) -> None:
        task = q.complete(lease.lease_id, lease.worker_id, now, weights_version=1, finishes_micro_batch=finishes)
        s = shadow[task.micro_batch]
        s.outstanding -= 1
        if task.kind is BWD or finishes:
            s.finished = True
            if task.kind is BWD:
                s.grad_bytes = 0
        else:
            s.forward_done = True

    def drop_stale() -> None:  # leases the queue re-queued behind our back (expiry)
        for lid in [lid for lid, lease in leases.items() if lease.expires_at <= now]:
            del leases[lid]

    for _ in range(3000):
        op = rng.random()
        if op < 0.25:
            size = rng.randint(0, 80)
            task = Task(task_id=f"f{next_mb}", micro_batch=next_mb, stage=1, kind=FWD, payload=next_mb)
            if q.has_room(size):
                q.put(task, size, now)
                shadow[next_mb] = _Shadow(input_bytes=size, outstanding=1)
                next_mb += 1
            else:
                with pytest.raises(QueueFull):
                    q.put(task, size, now)
        elif op < 0.35:
            ready = [mb for mb, s in shadow.items() if s.forward_done and not s.has_backward and not s.finished]
            if ready:
                mb, size = rng.choice(ready), rng.randint(0, MAX_GRAD)
                assert q.has_room(size, BWD)  # the reserve guarantees it
                q.put(Task(task_id=f"b{mb}", micro_batch=mb, stage=1, kind=BWD, payload=-mb), size, now)
                s = shadow[mb]
                s.has_backward, s.grad_bytes, s.outstanding = True, size, s.outstanding + 1
        elif op < 0.6:
            drop_stale()
            lease = q.claim(rng.choice(workers), now, rng.uniform(0.5, 5.0))
            if lease is not None:
                assert lease.lease_id not in leases
                leases[lease.lease_id] = lease
        elif op < 0.8:
            drop_stale()
            if leases:
                lease = leases.pop(rng.choice(sorted(leases)))
                if rng.random() < 0.1:
                    with pytest.raises(LeaseError):
                        q.complete(lease.lease_id, "intruder", now)
                finish(lease, finishes=lease.task.kind is FWD and rng.random() < 0.1)
        elif op < 0.85:
            drop_stale()
            if leases:
                lease = leases.pop(rng.choice(sorted(leases)))
                q.fail(lease.lease_id, lease.worker_id, now)
        elif op < 0.88:
            gone = rng.choice(workers)
            q.drop_worker(gone, now)
            leases = {lid: lease for lid, lease in leases.items() if lease.worker_id != gone}
        elif op < 0.92:
            if shadow:
                mb = rng.choice(sorted(shadow))
                if mb in q.stored_micro_batches():
                    if q.recompute_forward(mb, now) is not None:
                        shadow[mb].outstanding += 1
                else:
                    with pytest.raises(UnknownMicroBatch):
                        q.recompute_forward(mb, now)
        elif op < 0.97:
            now += rng.uniform(0.0, 2.0)
            if rng.random() < 0.5:
                q.expire(now)
                drop_stale()
        else:
            lease_id = rng.choice(sorted(leases)) if leases else "none"
            if leases and rng.random() < 0.5:
                drop_stale()
                if lease_id in leases:
                    leases[lease_id] = q.renew(lease_id, leases[lease_id].worker_id, now)
        _check_invariants(q, shadow)

    # Drain: everything handed out either completes or comes back; then all memory is returned.
    now += 1000.0
    q.expire(now)
    leases.clear()
    for mb, s in shadow.items():  # the backwards still to come from downstream
        if s.forward_done and not s.has_backward and not s.finished:
            q.put(Task(task_id=f"b{mb}", micro_batch=mb, stage=1, kind=BWD, payload=0), 1, now)
            s.has_backward, s.grad_bytes, s.outstanding = True, 1, s.outstanding + 1
    for _ in range(10_000):
        lease = q.claim("drainer", now, 1.0)
        if lease is None:
            break
        finish(lease)
        s = shadow[lease.task.micro_batch]
        if lease.task.kind is FWD and not s.has_backward and not s.finished:
            q.put(
                Task(
                    task_id=f"b{lease.task.micro_batch}",
                    micro_batch=lease.task.micro_batch,
                    stage=1,
                    kind=BWD,
                    payload=0,
                ),
                1,
                now,
            )
            s.has_backward, s.grad_bytes, s.outstanding = True, 1, s.outstanding + 1
        _check_invariants(q, shadow)
    c = q.counters()
    assert (c.outstanding, c.bytes_used, c.micro_batches) == (0, 0, 0)
    assert c.put == c.completed and c.claimed > c.completed > 0
    assert c.requeued_expired and c.requeued_failed and c.requeued_worker_gone and c.recomputed
