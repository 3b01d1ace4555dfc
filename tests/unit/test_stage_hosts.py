"""daemon/stage_host.py and daemon/pipeline_worker.py together, in one process, without a network.

Stage hosts and workers talk through the same request interface the daemons use over
``stage_rpc``, routed here by a plain function. Checked: the hosted pipeline learns like the
synchronous reference at equal data indices (mean loss over updates 40-59, nats): a
synchronous pipeline (0 batches ahead) within 0.1 (measured 0.005-0.02, fp16 on the wire), an
asynchronous one within 0.2 (measured 0.12-0.14 from gradients a version stale); several
workers share the stages; and a worker that vanishes holding leases costs no micro-batch.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from swarmd.models.build import ModelShape
from swarmd.models.corpus import Dataset, load_corpus, train_eval_split
from swarmd.models.reference import TrainSettings, train_reference
from swarmd.pipeline_worker import PipelineWorker, WorkerSettings
from swarmd.stage_host import HostSettings, StageHost

pytestmark = pytest.mark.timeout(240)

SHAPE = ModelShape(family="gpt2", layers=4, hidden=64, heads=4, vocab=256, seq_len=64)
MICRO, PER_UPDATE, UPDATES, LR = 4, 2, 60, 1e-3
EPOCH = "e1"


@pytest.fixture(scope="module")
def train() -> Dataset:
    return train_eval_split(load_corpus("builtin"), SHAPE.seq_len, seed=1)[0]


@pytest.fixture(scope="module")
def reference(train: Dataset) -> list[float]:
    settings = TrainSettings(seed=1, steps=UPDATES + 10, batch_sequences=MICRO * PER_UPDATE, micro_batch=MICRO, lr=LR)
    return [r.loss for r in train_reference(SHAPE, train, settings)[0]]


class Swarm:
    def __init__(
        self,
        train: Dataset,
        tmp: Path,
        stages: int,
        workers: int,
        lease_s: float = 30.0,
        in_flight: int = 4,
        push_every: int = 1,
        ahead: int = 1,
        epoch: Callable[[], str] = lambda: EPOCH,
    ) -> None:
        self.hosts = [
            StageHost(HostSettings(run_id="r", stage=s, stages=stages, shape=SHAPE, seed=1, micro_batch=MICRO,
                                   lr=LR, weight_decay=0.0, max_staleness=4, accumulate=PER_UPDATE,
                                   max_in_flight=in_flight, batches_ahead=ahead, max_lease_s=lease_s), tmp, train)
            for s in range(stages)
        ]  # fmt: skip
        for host in self.hosts:
            host.set_epoch(epoch())
        settings = WorkerSettings(
            shape=SHAPE, stages=stages, seed=1, micro_batch=MICRO, push_every=push_every, lease_s=lease_s
        )
        self.workers = [PipelineWorker(settings, train, f"w{i}", self._route(f"w{i}"), epoch) for i in range(workers)]

    def _route(self, worker: str) -> Any:
        async def request(stage: int, op: str, header: dict[str, Any], blobs: list[bytes]) -> Any:
            return await self.hosts[stage].handle(op, worker, header, blobs)

        return request

    def updates(self) -> int:
        return min(h.server.version for h in self.hosts)

    async def run_until(
        self, done: Any, workers: list[PipelineWorker] | None = None, timeout: float = 200, vanish: bool = False
    ) -> None:
        stop = asyncio.Event()
        tasks = [asyncio.create_task(w.run(stop)) for w in workers or self.workers]

        async def watch() -> None:
            while not done():
                await asyncio.sleep(0.01)  # sync-ok: the poll interval of a condition wait under wait_for's timeout

        try:
            await asyncio.wait_for(watch(), timeout)
        finally:
            stop.set()
            for task in tasks if vanish else []:
                task.cancel()  # dead: no push, no hand-back
            await asyncio.gather(*tasks, return_exceptions=True)


def losses_per_step(host: StageHost) -> dict[int, float]:
    by_step: dict[int, list[float]] = {}
    for m, loss in host.losses:
        by_step.setdefault(m // PER_UPDATE, []).append(loss)
    return {step: statistics.mean(v) for step, v in by_step.items()}


@pytest.mark.parametrize("stages, workers, ahead, tolerance", [(2, 3, 0, 0.1), (2, 1, 1, 0.2), (3, 3, 1, 0.2)])
def test_hosted_pipeline_learns_like_the_reference(
    train: Dataset, reference: list[float], tmp_path: Path, stages: int, workers: int, ahead: int, tolerance: float
) -> None:
    swarm = Swarm(train, tmp_path, stages, workers, in_flight=8, ahead=ahead)
    asyncio.run(swarm.run_until(lambda: swarm.updates() >= UPDATES))
    per_step = losses_per_step(swarm.hosts[-1])
    last = [s for s in sorted(per_step) if UPDATES - 20 <= s < UPDATES]
    mine, ref = statistics.mean(per_step[s] for s in last), statistics.mean(reference[s] for s in last)
    counts = [sum(w.stats.tasks.values()) for w in swarm.workers]
    print(f"\n{stages} stages, {workers} workers, {ahead} batch(es) ahead: loss {per_step[0]:.3f} -> {mine:.3f}; "
          f"reference {ref:.3f}; tasks per worker {counts}")  # fmt: skip
    assert mine < 0.7 * per_step[0]
    assert abs(mine - ref) < tolerance
    assert all(c > 0 for c in counts)
    for host in swarm.hosts:
        c = host.queue.counters()
        assert c.put == c.completed + c.outstanding


def test_a_vanished_worker_costs_no_micro_batch(train: Dataset, tmp_path: Path) -> None:
    swarm = Swarm(train, tmp_path, stages=2, workers=2, lease_s=1.0)
    quitter, stayer = swarm.workers

    # The quitter works alone for a while, then stops dead: its leases and sums are stranded.
    def quitter_holds_leases() -> bool:
        return swarm.updates() >= 3 and sum(swarm.hosts[1].queue.leases_by_worker().values()) > 0

    asyncio.run(swarm.run_until(quitter_holds_leases, [quitter], vanish=True))
    stranded = sum(h.queue.counters().leased for h in swarm.hosts)
    assert stranded > 0

    def requeued() -> int:
        return sum(h.queue.counters().requeued_expired for h in swarm.hosts)

    # The stayer trains on; the quitter's leases run out and their tasks are redone.
    before = swarm.updates()
    asyncio.run(swarm.run_until(lambda: requeued() >= stranded and swarm.updates() >= before + 10, [stayer]))
    assert not any(h.queue.leases_by_worker().get("w0") for h in swarm.hosts)
    cursor = swarm.hosts[0].info()["data_cursor"]
    finished_last = {m for m, _ in swarm.hosts[1].losses}
    assert cursor > 0 and all(m in finished_last for m in range(cursor))


def test_epoch_changes_and_a_hand_over_lose_no_gradient_and_count_any_applied_twice(
    train: Dataset, tmp_path: Path
) -> None:
    """The epoch changes three times while a worker holds a sum for the last stage that has a
    micro-batch stage 0 has finished (never to be fed again), and at the second change stage 1
    changes hands: its host stops, and a new one opens from its checkpoint. Every micro-batch
    stage 0 finished has its loss at the last stage. Each stage's server got as many micro-
    batches as it finished, plus those the hosts counted as applied twice (a recompute that got
    in before a late carried push: rare, and counted, never silent)."""
    epoch = [EPOCH]
    swarm = Swarm(train, tmp_path, stages=2, workers=2, push_every=4, epoch=lambda: epoch[0])
    last_hosts = [swarm.hosts[1]]
    summed = [0, 0]  # micro-batches each stage's servers took in

    def count_pushes(host: StageHost) -> StageHost:
        push = host.server.push

        def counted(gradients: Any, base: int, micro_batches: int) -> Any:
            summed[host.stage] += micro_batches
            return push(gradients, base, micro_batches)

        host.server.push = counted  # type: ignore[method-assign]
        return host

    for host in swarm.hosts:
        count_pushes(host)

    def exposed() -> bool:
        """A worker holds a last-stage gradient of a micro-batch that stage 0 has applied."""
        first, last = swarm.hosts
        leases = {
            (lease.worker_id, lease.lease_id): lease.task.micro_batch for lease in last.queue.live_leases(time.time())
        }
        held = [leases.get((w.worker_id, lid)) for w in swarm.workers for lid in w._held[1].lease_ids]
        return any(m is not None and first.ledger.was_applied(m) for m in held)

    async def churn() -> None:
        for i, at in enumerate((3, 6, 9)):
            while swarm.updates() < at or not exposed():
                await asyncio.sleep(0.002)  # sync-ok: the poll interval of a condition wait under wait_for's timeout
            if i == 1:  # stage 1 changes hands
                old = swarm.hosts[1]
                await old.stop()
                swarm.hosts[1] = count_pushes(StageHost(old.settings, tmp_path, train))
                last_hosts.append(swarm.hosts[1])
            epoch[0] = f"e{i + 2}"
            for host in swarm.hosts:
                host.set_epoch(epoch[0])

    async def run() -> None:
        churning = asyncio.create_task(churn())
        await swarm.run_until(lambda: churning.done() and swarm.updates() >= 14)
        await churning

    asyncio.run(run())
    # Each change found a sum held: pushed after it (by the worker at the change, or by its next
    # push under the old epoch), except one that got to the stopping host before it closed.
    assert sum(h.stats.carried_pushes for h in [swarm.hosts[0], *last_hosts]) >= 2
    first = swarm.hosts[0]
    cursor = first.info()["data_cursor"]
    done_above = [int(m) for m in first.server.metadata["data_done"].split(",") if m]
    applied_at_last = Counter(m for host in last_hosts for m, _ in host.losses)
    print(f"\ncursor {cursor}; carried pushes {[h.stats.carried_pushes for h in [first, *last_hosts]]}; run for their "
          f"output only {[w.stats.output_only for w in swarm.workers]}; flushed {first.stats.flushed}")  # fmt: skip
    assert cursor >= 20
    assert {m: applied_at_last[m] for m in range(cursor) if applied_at_last[m] != 1} == {}
    twice = [first.stats.applied_twice, sum(h.stats.applied_twice for h in last_hosts)]
    print(f"micro-batches summed by the servers {summed}; applied twice {twice}")
    assert summed[0] == cursor + len(done_above) + twice[0]
    assert summed[1] == len(applied_at_last) + twice[1]


def test_a_push_waits_for_a_gradient_carried_past_an_epoch_change_and_its_redo_runs_for_output_only(
    train: Dataset, tmp_path: Path
) -> None:
    """The last stage holds micro-batch 5's gradient on its way from before an epoch change; a
    recompute of 5 is pushed first: it must wait (its lease kept), not race in. Once the carried
    gradient is in, the recompute's push is refused and redone, and the redo is told to run for
    its output only: 5 is applied once."""
    import torch

    from swarmd.peers.wire.tensors import encode_tensor
    from swarmd.stage_host import PushMustWait, StageRequestError, serialize_tensors

    settings = HostSettings(run_id="r", stage=1, stages=2, shape=SHAPE, seed=1, micro_batch=MICRO, lr=LR,
                            weight_decay=0.0, max_staleness=4, accumulate=PER_UPDATE)  # fmt: skip
    host = StageHost(settings, tmp_path, train)
    host.set_epoch("e2")
    frame = encode_tensor(torch.zeros(host.in_spec.shape))
    gradient = serialize_tensors({name: torch.zeros(shape) for name, shape in host.param_shapes.items()})

    async def run() -> None:
        await host.handle("put", "w0", {"epoch": "e2", "kind": "forward", "micro_batch": 5}, [frame])
        claim, _ = await host.handle("claim", "w1", {"epoch": "e2", "lease_s": 30.0}, [])
        assert claim["micro_batch"] == 5 and "applied" not in claim
        host.ledger.carry("e1", [("1.0", "w2", 5)], time.time())  # w2's sum of 5, on its way
        push = {"epoch": "e2", "lease_ids": [claim["lease_id"]], "base_version": 0, "losses": [2.0]}
        with pytest.raises(PushMustWait, match="push it again shortly"):
            await host.handle("push", "w1", push, [gradient])
        assert host.queue.holds(claim["lease_id"], "w1", time.time())
        carried = {"epoch": "e1", "lease_ids": ["1.0"], "base_version": 0, "losses": [2.5]}
        await host.handle("push", "w2", carried, [gradient])  # the carried gradient arrives
        with pytest.raises(StageRequestError, match="applied already"):
            await host.handle("push", "w1", push, [gradient])
        redo, _ = await host.handle("claim", "w1", {"epoch": "e2", "lease_s": 30.0}, [])
        assert redo["micro_batch"] == 5 and redo["applied"] is True
        await host.handle("complete", "w1", {"epoch": "e2", "lease_id": redo["lease_id"], "weights_version": 0}, [])

    asyncio.run(run())
    assert list(host.losses) == [(5, 2.5)]
    assert host.stats.carried_pushes == 1 and host.stats.already_applied == 1 and host.stats.applied_twice == 0
    assert host.queue.counters().outstanding == 0


def test_a_result_the_next_stage_already_has_or_no_longer_needs_is_recognised() -> None:
    """A worker must not fail (and so redo, forever) a task whose result the next stage refuses
    because it already holds it or is past that micro-batch: the phrases are the queue's own."""
    from swarmd.peers.task_queue import Task, TaskKind, TaskQueue, TaskQueueConfig, TaskQueueError
    from swarmd.pipeline_worker import already_there, upstream_is_done

    q = TaskQueue(TaskQueueConfig(stage=0, capacity_bytes=1000))
    q.put(Task(task_id="f1", micro_batch=1, stage=0, kind=TaskKind.FORWARD, payload="x"), 10, 0.0)
    lease = q.claim("w", 0.0, 10.0)
    assert lease is not None
    q.complete(lease.lease_id, "w", 0.0, weights_version=0)
    backward = Task(task_id="b1", micro_batch=1, stage=0, kind=TaskKind.BACKWARD, payload="g")
    q.put(backward, 10, 0.0)

    def refusal(task: Task) -> TaskQueueError:
        with pytest.raises(TaskQueueError) as e:
            q.put(task, 10, 0.0)
        return e.value

    # the same task again (an earlier try's answer was lost), or another copy of its result
    assert already_there(refusal(backward))
    assert already_there(refusal(Task(task_id="b1x", micro_batch=1, stage=0, kind=TaskKind.BACKWARD, payload="g")))
    assert already_there(refusal(Task(task_id="f1x", micro_batch=1, stage=0, kind=TaskKind.FORWARD, payload="x")))
    # a gradient for a micro-batch this stage has no input for: it is past it
    assert upstream_is_done(refusal(Task(task_id="b9", micro_batch=9, stage=0, kind=TaskKind.BACKWARD, payload="g")))
    with pytest.raises(TaskQueueError) as full:
        q.put(Task(task_id="f2", micro_batch=2, stage=0, kind=TaskKind.FORWARD, payload="y"), 10_000, 0.0)
    assert not upstream_is_done(full.value) and not already_there(full.value)  # too big: hand it back
