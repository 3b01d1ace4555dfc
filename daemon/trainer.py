"""The daemon's training service: claim the run's stages, train them, show progress, release.

Until the distributed data path lands, a daemon trains only when it holds *every* stage: it
claims all stages at once with one claim time, and the stage-0 lease (settled by the rule in
``swarmd.peers.stage_leases``) decides which daemon that is. The others wait, and take over
when the holder's leases are released or expire. The pipeline itself runs in a thread of its
own (torch never runs on the event loop), in chunks of one update, so a stop takes effect
within one update; its parameter servers checkpoint into the state directory and a restarted
daemon resumes from there.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from swarmd.errors import SwarmdError
from swarmd.local_pipeline import LocalPipeline, PipelineSettings
from swarmd.models.corpus import load_corpus, train_eval_split
from swarmd.peers.identity import Identity
from swarmd.peers.run_spec import SignedRunSpec
from swarmd.peers.stage_leases import StageLease, resolve_holder
from swarmd.peers.swarm_dht import SwarmDHT
from swarmd.replication import StageReplicator

logger = logging.getLogger(__name__)

LEASE_TTL_S = 30.0
THREAD_STOP_TIMEOUT_S = 20.0


def run_seed(run_id: str) -> int:
    """The run's seed for weights and data order: every peer derives the same one."""
    return int.from_bytes(hashlib.sha256(run_id.encode()).digest()[:4], "little")


def pipeline_settings(spec: SignedRunSpec) -> PipelineSettings:
    s = spec.spec
    return PipelineSettings(
        seed=run_seed(spec.run_id), stages=s.stages, micro_batch=s.micro_batch,
        accumulate=max(1, s.batch_sequences // s.micro_batch), lr=s.lr, weight_decay=s.weight_decay,
        max_staleness=s.max_staleness,
    )  # fmt: skip


@dataclass
class Progress:
    updates: int = 0
    micro_batches: int = 0
    tokens: int = 0
    loss: float | None = None
    """Mean loss of the last 16 micro-batches."""
    tokens_per_s: float = 0.0


class Trainer:
    def __init__(
        self,
        spec: SignedRunSpec,
        identity: Identity,
        dht: SwarmDHT,
        checkpoint_dir: Path,
        replicator: StageReplicator | None = None,
        standby: Callable[[], str | None] = lambda: None,
    ) -> None:
        self.spec = spec
        self.replicator = replicator
        self.standby = standby
        self._pushed: dict[int, int] = {}
        self._push_task: asyncio.Task[None] | None = None
        self.identity = identity
        self.dht = dht
        self.checkpoint_dir = checkpoint_dir
        self.state = "waiting"
        self.holder: str | None = None
        self.progress = Progress()
        self._claimed_at: float | None = None
        self._thread: threading.Thread | None = None
        self._stop_thread = threading.Event()
        self._recent: deque[tuple[float, int, float]] = deque(maxlen=16)  # (time, tokens, loss)
        self._pipeline: LocalPipeline | None = None
        self.error: str | None = None

    # --- leases (on the event loop) ----------------------------------------------------------

    async def tick(self) -> None:
        """One round: settle who holds the stages; start or stop training accordingly."""
        now = time.time()
        holder = resolve_holder(await self.dht.scan_leases(0, now), now)
        self.holder = holder.peer_id if holder is not None else None
        mine = holder is not None and holder.peer_id == self.identity.peer_id
        if self.error is not None:
            # Training failed here (a broken corpus or checkpoint): let another peer have the stages.
            if self._claimed_at is not None:
                await self.release()
            self.state = "failed"
            return
        if holder is None or mine:
            # Claim (or renew, keeping the first claim time) every stage; the next round re-reads.
            self._claimed_at = self._claimed_at or now
            await self._publish_leases(now, released=False)
        elif self._claimed_at is not None:
            logger.info("Stages of run %s are held by %s; stopping our pipeline", self.spec.run_id, holder.peer_id)
            await self.release()
        if mine and self._thread is None:
            self._start_pipeline()
        if mine and (self._push_task is None or self._push_task.done()):
            self._push_task = asyncio.create_task(self._replicate())
        self.state = "training" if self._thread is not None and self._thread.is_alive() else (
            "claiming" if self._claimed_at is not None else "waiting")  # fmt: skip

    async def _publish_leases(self, now: float, released: bool) -> None:
        assert self._claimed_at is not None
        for stage in range(self.spec.spec.stages):
            lease = StageLease(run_id=self.spec.run_id, stage=stage, peer_id=self.identity.peer_id,
                               claimed_at=self._claimed_at, issued_at=now, expires_at=now + LEASE_TTL_S,
                               released=released)  # fmt: skip
            await self.dht.publish_lease(lease, lease.sign(self.identity))

    async def _replicate(self) -> None:
        """Copy new stage checkpoints to the standby; a failure is retried on a later round."""
        standby = self.standby()
        if self.replicator is None or standby is None:
            return
        try:
            await self.replicator.push(standby, self._pushed)
        except SwarmdError as e:
            logger.warning("Could not copy stage checkpoints to standby %s (%s); retrying next round", standby, e)

    async def release(self) -> None:
        """Stop training (checkpointing every stage), copy the final state to the standby, then
        give the stages up at once: the next holder resumes where we stopped."""
        await asyncio.to_thread(self._stop_pipeline)  # joins the training thread: never on the loop
        if self._push_task is not None:
            await asyncio.gather(self._push_task, return_exceptions=True)
        if self._claimed_at is not None and self.error is None:
            await self._replicate()
        if self._claimed_at is not None:
            await self._publish_leases(time.time(), released=True)
            self._claimed_at = None
        self.state = "waiting"

    # --- the pipeline (in its own thread) ------------------------------------------------

    def _start_pipeline(self) -> None:
        self._stop_thread.clear()
        self._thread = threading.Thread(target=self._train, name="swarmd-train", daemon=True)
        self._thread.start()
        logger.info("Holding all %d stages of run %s: training", self.spec.spec.stages, self.spec.run_id)

    def _stop_pipeline(self) -> None:
        if self._thread is None:
            return
        self._stop_thread.set()
        self._thread.join(THREAD_STOP_TIMEOUT_S)
        if self._thread.is_alive():
            logger.warning("Training thread did not stop in %.0f s", THREAD_STOP_TIMEOUT_S)
        self._thread = None

    def _train(self) -> None:
        try:
            spec = self.spec.spec
            settings = pipeline_settings(self.spec)
            train, _ = train_eval_split(load_corpus(spec.corpus), spec.model.seq_len, seed=settings.seed)
            pipeline = LocalPipeline(spec.model, train, settings, checkpoint_dir=self.checkpoint_dir)
            self._pipeline = pipeline
            tokens_per_micro_batch = spec.micro_batch * spec.model.seq_len
            while not self._stop_thread.is_set():
                pipeline.run(min(s.version for s in pipeline.servers) + 1, on_loss=self._record_loss)
                self.progress.updates = min(s.version for s in pipeline.servers)
                self.progress.tokens = self.progress.micro_batches * tokens_per_micro_batch
            for server in pipeline.servers:
                server.checkpoint()
            logger.info("Training stopped at update %d; checkpoints in %s", self.progress.updates, self.checkpoint_dir)
        except Exception as e:  # a broken corpus or checkpoint: report it in status, keep the daemon up
            logger.exception("Training failed")
            self.error = f"{type(e).__name__}: {e}"

    def _record_loss(self, micro_batch: int, loss: float) -> None:
        self.progress.micro_batches += 1
        now = time.perf_counter()
        self._recent.append((now, self.progress.micro_batches, loss))
        self.progress.loss = sum(x[2] for x in self._recent) / len(self._recent)
        if len(self._recent) >= 2 and now > self._recent[0][0]:
            span = self._recent[-1][1] - self._recent[0][1]
            tokens = span * self.spec.spec.micro_batch * self.spec.spec.model.seq_len
            self.progress.tokens_per_s = tokens / (now - self._recent[0][0])

    def status(self) -> dict[str, Any]:
        p = self.progress
        return {
            "state": self.state, "holder": self.holder, "stages": self.spec.spec.stages,
            "updates": p.updates, "micro_batches": p.micro_batches, "tokens": p.tokens,
            "loss": None if p.loss is None else round(p.loss, 4), "tokens_per_s": round(p.tokens_per_s, 1),
            "error": self.error,
        }  # fmt: skip
