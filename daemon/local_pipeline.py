"""The whole asynchronous pipeline in one process: what a daemon alone runs (it serves every stage).

Per stage: a parameter server (authoritative weights, AdamW, versions, staleness bound), a
task queue (leases, bounded memory), and a worker. Tensors cross stage boundaries through the
same wire frames the network uses (fp16/bf16, checked against the plan), so this path and the
distributed one compute the same thing. The loop is deterministic: each tick feeds stage 0 if
the pipeline has room, then runs at most one task per stage, last stage first (backward work
finishes micro-batches and commits updates). Forwards of new micro-batches run while older
ones are still in backward, so pushes arrive with real staleness, which the servers judge.

Micro-batch ``m`` holds data indices ``[m*mb, (m+1)*mb)`` (``Dataset.micro_batch``); a server's
update ``u`` thus covers the same sequences as step ``u`` of the single-process reference
whenever each push accumulates a full step's micro-batches.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from swarmd.models.build import ModelShape, build_model
from swarmd.models.corpus import Dataset
from swarmd.models.param_server import ServerConfig, StageParameterServer, stage_checkpoint_name
from swarmd.models.stage_worker import StageWorker
from swarmd.models.stages import StageModule, split_layers, stage_input_spec, stage_output_spec
from swarmd.peers.task_queue import Lease, Task, TaskKind, TaskQueue, TaskQueueConfig
from swarmd.peers.wire.tensors import TensorSpec, decode_tensor, encode_tensor

logger = logging.getLogger(__name__)

LEASE_S = 60.0


@dataclass(frozen=True, kw_only=True)
class PipelineSettings:
    seed: int
    stages: int
    micro_batch: int
    """Sequences per micro-batch."""
    accumulate: int
    """Micro-batches a stage's worker accumulates before it pushes (one server update)."""
    lr: float
    weight_decay: float = 0.0
    max_staleness: int = 4
    staleness_policy: str = "drop"
    max_in_flight: int = 4
    """Micro-batches between entering stage 0 and finishing there: the pipeline's depth."""
    wire_dtype: str = "fp16"
    checkpoint_every: int = 50


@dataclass
class PipelineReport:
    updates: list[int]
    """Each stage's parameter-server version at the end."""
    losses: list[tuple[int, float]] = field(default_factory=list)
    """(micro-batch, loss) in the order the last stage computed them."""
    tokens: int = 0
    dropped_stale: int = 0
    seconds: dict[str, float] = field(default_factory=dict)
    """Where the time went: compute, wire (encode/decode), bookkeeping."""


class LocalPipeline:
    def __init__(
        self, shape: ModelShape, dataset: Dataset, settings: PipelineSettings, checkpoint_dir: Path | None = None
    ) -> None:
        if dataset.seq_len != shape.seq_len:
            raise ValueError(f"dataset sequences are {dataset.seq_len} tokens; the model takes {shape.seq_len}")
        self.shape, self.dataset, self.settings = shape, dataset, settings
        ranges = split_layers(shape.layers, settings.stages)
        model = build_model(shape, settings.seed)
        server_config = ServerConfig(
            lr=settings.lr, weight_decay=settings.weight_decay, max_staleness=settings.max_staleness,
            staleness_policy=settings.staleness_policy, checkpoint_every=settings.checkpoint_every,
            accumulate=settings.accumulate,
        )  # fmt: skip
        self.servers: list[StageParameterServer] = []
        self.workers: list[StageWorker] = []
        self.queues: list[TaskQueue] = []
        # Activations of one micro-batch, at the wire's width: what a queue slot costs.
        frame = shape.seq_len * shape.hidden * settings.micro_batch * 4
        capacity = frame * (2 * settings.max_in_flight + 4)
        for s in range(settings.stages):
            module = StageModule(model, ranges, s)
            path = checkpoint_dir / stage_checkpoint_name(s) if checkpoint_dir is not None else None
            self.servers.append(StageParameterServer(module.state_dict(), server_config, path))
            keep = settings.max_staleness + settings.max_in_flight + 2
            self.workers.append(StageWorker(module, keep_versions=keep, accumulate=settings.accumulate))
            config = TaskQueueConfig(stage=s, capacity_bytes=capacity, backward_reserve_bytes=capacity // 2)
            self.queues.append(TaskQueue(config))
        self._in_spec = [
            TensorSpec.like(stage_input_spec(shape, s, settings.micro_batch)) for s in range(settings.stages)
        ]
        self._out_spec = [
            TensorSpec.like(stage_output_spec(shape, s, settings.stages, settings.micro_batch))
            for s in range(settings.stages)
        ]
        # Resumed servers continue with the data after what their updates consumed.
        self._next_micro_batch = min(server.version for server in self.servers) * settings.accumulate
        self._clock = 0.0
        self._seconds = {"compute": 0.0, "wire": 0.0, "bookkeeping": 0.0}

    @property
    def last(self) -> int:
        return self.settings.stages - 1

    def run(self, updates: int, on_loss: Callable[[int, float], None] | None = None) -> PipelineReport:
        """Train until every stage's server has made ``updates`` updates."""
        report = PipelineReport(updates=[])
        while min(server.version for server in self.servers) < updates:
            self._clock += 1.0
            self._feed()
            progressed = False
            for s in reversed(range(self.settings.stages)):
                lease = self.queues[s].claim(f"local-worker-{s}", self._clock, LEASE_S)
                if lease is not None:
                    self._run_task(s, lease, report, on_loss)
                    progressed = True
            if not progressed and self.queues[0].counters().outstanding == 0 and not self._can_feed():
                raise RuntimeError("pipeline stalled: no task anywhere and no room to feed")  # an invariant
        report.updates = [server.version for server in self.servers]
        report.dropped_stale = sum(server.counters.dropped_stale for server in self.servers)
        report.seconds = dict(self._seconds)
        return report

    # --- ticks -----------------------------------------------------------------------------

    def _can_feed(self) -> bool:
        return self.queues[0].counters().micro_batches < self.settings.max_in_flight

    def _feed(self) -> None:
        if not self._can_feed():
            return
        m = self._next_micro_batch
        frame = self._encode(self.dataset.micro_batch(m, self.settings.micro_batch))
        if not self.queues[0].has_room(len(frame)):
            return  # backpressure: wait for micro-batches to finish
        self.queues[0].put(Task(task_id=f"f0-{m}", micro_batch=m, stage=0, kind=TaskKind.FORWARD, payload=frame),
                           len(frame), self._clock)  # fmt: skip
        self._next_micro_batch += 1

    def _run_task(
        self, s: int, lease: Lease, report: PipelineReport, on_loss: Callable[[int, float], None] | None
    ) -> None:
        task, worker, server = lease.task, self.workers[s], self.servers[s]
        if worker.newest_version is None or server.version > worker.newest_version:
            worker.add_weights(*server.weights())  # pull the newest weights
        m = task.micro_batch
        x = self._decode(lease.stage_input, self._in_spec[s])
        started = time.perf_counter()
        if task.kind is TaskKind.FORWARD and s < self.last:
            version = worker.newest_version
            assert version is not None
            out = worker.forward(x, version)
            self._seconds["compute"] += time.perf_counter() - started
            self._put(s + 1, TaskKind.FORWARD, m, self._encode(out))
            self.queues[s].complete(lease.lease_id, lease.worker_id, self._clock, weights_version=version)
            return
        if task.kind is TaskKind.FORWARD:  # the last stage: loss and backward at once
            version = worker.newest_version
            assert version is not None
            result = worker.train_last(x, self.dataset.micro_batch(m, self.settings.micro_batch), version)
            assert result.loss is not None
            report.losses.append((m, result.loss))
            report.tokens += self.settings.micro_batch * self.shape.seq_len
            if on_loss is not None:
                on_loss(m, result.loss)
        else:
            assert task.weights_version is not None
            grad_output = self._decode(task.payload, self._out_spec[s])
            result = worker.backward(x, grad_output, task.weights_version)
        self._seconds["compute"] += time.perf_counter() - started
        if result.grad_input is not None:
            self._put(s - 1, TaskKind.BACKWARD, m, self._encode(result.grad_input))
        self.queues[s].complete(lease.lease_id, lease.worker_id, self._clock,
                                weights_version=worker.newest_version, finishes_micro_batch=True)  # fmt: skip
        if worker.ready_to_push():
            push = worker.take_push()
            assert push is not None
            started = time.perf_counter()
            server.push(push.gradients, push.base_version, push.micro_batches)
            self._seconds["compute"] += time.perf_counter() - started

    def _put(self, s: int, kind: TaskKind, m: int, frame: bytes) -> None:
        started = time.perf_counter()
        prefix = "f" if kind is TaskKind.FORWARD else "b"
        task = Task(task_id=f"{prefix}{s}-{m}", micro_batch=m, stage=s, kind=kind, payload=frame)
        self.queues[s].put(task, len(frame), self._clock)
        self._seconds["bookkeeping"] += time.perf_counter() - started

    def _encode(self, tensor: torch.Tensor) -> bytes:
        started = time.perf_counter()
        frame = encode_tensor(tensor, self.settings.wire_dtype)
        self._seconds["wire"] += time.perf_counter() - started
        return frame

    def _decode(self, frame: object, spec: TensorSpec) -> torch.Tensor:
        started = time.perf_counter()
        assert isinstance(frame, bytes)
        tensor = decode_tensor(frame, spec)
        self._seconds["wire"] += time.perf_counter() - started
        return tensor
