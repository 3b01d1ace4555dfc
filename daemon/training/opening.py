"""Opening what the pool gives this peer: a shard server from the newest state it may believe,
and a cell with its stage's compute.

A shard opens from, in order: this peer's own replica when it was the shard's standby (the
checkpoint, every logged delta replayed on it: the exact last committed weights); else the
state of the previous rightful holder or of the standby that holder named (``ReplicaFetch``:
they replay their replica and answer one checkpoint); else, when the swarm has never shown a
version of the shard, the run's seed weights. Every state is checked against what the
rightful holders' signed leases have shown (``SeenVersions``): one far past it is a lie and is
refused. When no believable state can be had for ``OPEN_GRACE_S``, the shard opens from the
best it has (this peer's last checkpoint, else the seed) and the versions lost are counted
and logged: a swarm must go on.
"""

from __future__ import annotations

import asyncio
import logging
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from swarmd.errors import SwarmdError
from swarmd.models.cell_compute import CellCompute, flatten_parameters
from swarmd.models.corpus import Dataset
from swarmd.models.parameter_shard import ParameterShard
from swarmd.models.shard_config import ShardConfig, ShardError
from swarmd.models.stages import StageModule, split_layers
from swarmd.peers.records.run_spec import run_seed
from swarmd.peers.taskpool.assignment import Assignment
from swarmd.peers.taskpool.cells import Cell
from swarmd.peers.taskpool.exchange import shard_range, step_micro_batches, window
from swarmd.peers.taskpool.servers import Shard, ShardLease
from swarmd.peers.wire.codecs import decode_vector, encode_vector
from swarmd.peers.wire.errors import RpcError
from swarmd.peers.wire.messages import ReplicaCheckpoint, ReplicaFetch, ReplicaLog
from swarmd.training.cell import CellWorker
from swarmd.training.ledger_host import LedgerHost
from swarmd.training.replicas import Replica
from swarmd.training.shard_server import ShardServer

if TYPE_CHECKING:
    from swarmd.models.parameter_shard import ShardStep
    from swarmd.training.trainer import Trainer

logger = logging.getLogger(__name__)

CHECKPOINT_EVERY = 10
"""Steps between the checkpoints a server sends its standby: the log a take-over replays."""
OPEN_GRACE_S = 60.0
FETCH_TIMEOUT_S = 60.0
LOG_TIMEOUT_S = 10.0


def shard_file(checkpoint_dir: Path, key: Shard, shards: int) -> Path:
    return checkpoint_dir / f"shard-{key[0]}-{key[1]}-of-{shards}.safetensors"


class ShardOpener:
    def __init__(self, trainer: Trainer) -> None:
        self.trainer = trainer
        self._initial: dict[int, torch.Tensor] = {}
        self._waiting_since: dict[Shard, float] = {}
        self.versions_lost = 0

    # --- stage geometry -----------------------------------------------------------------------

    def initial_vector(self, stage: int) -> torch.Tensor:
        """The stage's seed weights, flattened: what every peer builds alike."""
        if stage not in self._initial:
            self._initial[stage] = flatten_parameters(stage_module(self.trainer, stage))
        return self._initial[stage]

    def config(self) -> ShardConfig:
        s = self.trainer.spec.spec
        return ShardConfig(
            mode=self.trainer.mode,
            lr=s.lr,
            weight_decay=s.weight_decay,
            outer_lr=s.outer_lr,
            outer_momentum=s.outer_momentum,
        )

    # --- opening a shard ------------------------------------------------------------------------

    async def open(self, key: Shard, assignment: Assignment) -> ShardServer | None:
        trainer = self.trainer
        shards = assignment.shard_counts()[key[0]]
        size = self.initial_vector(key[0]).numel()
        lo, hi = shard_range(size, shards, key[1])
        path = shard_file(trainer.checkpoint_dir, key, shards)
        step = step_micro_batches(trainer.exchange_settings())
        shard = await self._believable_state(key, (lo, hi), path, step)
        if shard is None:
            return None
        shard.step_micro_batches = step
        lineage = f"{trainer.own[:16]}@{trainer.books.shard_claims.get(key, time.time()):.3f}"
        server = ShardServer(
            key,
            shards,
            shard,
            trainer.exchange_settings(),
            lineage,
            path,
            log_step=lambda step_, ledger: self._log_step(key, lineage, step_, ledger),
            send_checkpoint=lambda version, data: self._send_checkpoint(key, lineage, version, data),
            checkpoint_every=CHECKPOINT_EVERY,
        )
        if key == (0, 0):
            ledger = LedgerHost.from_state(
                shard.metadata.get("ledger", ""),
                assignment.share_micro_batches,
                trainer.stage0_holder,
                lambda: trainer.exchange_settings().local_steps + 2,
            )
            trainer.handlers.ledger = ledger
            server.ledger_state = ledger.state
        self._waiting_since.pop(key, None)
        logger.info(
            "Serving shard %s (%d of stage %d's %d parameters) from version %d",
            key,
            hi - lo,
            key[0],
            size,
            shard.version,
        )
        return server

    async def _believable_state(
        self, key: Shard, span: tuple[int, int], path: Path, step: int
    ) -> ParameterShard | None:
        """The newest state this peer may believe (module doc); None: wait for a better one."""
        trainer = self.trainer
        found: list[ParameterShard] = []
        replica = trainer.replicas.newest(key)
        if replica is not None and trainer.seen.admits(key, replica.version):
            try:
                found.append(await asyncio.to_thread(replay, replica, self.config(), step, span))
            except (SwarmdError, KeyError, ValueError) as e:
                logger.warning("shard %s: our replica is unusable (%s)", key, e)
        for peer in self._sources(key):
            fetched = await self._fetch(key, peer, span, step)
            if fetched is not None:
                found.append(fetched)
        own = await asyncio.to_thread(self._own_checkpoint, path, span, step)
        if own is not None and trainer.seen.admits(key, own.version):
            found.append(own)
        seen = trainer.seen.of(key)
        best = max(found, key=lambda shard: shard.version, default=None)
        if best is not None and best.version >= seen:
            return best
        if best is None and seen == 0:  # nobody ever trained it: the run's seed weights
            return ParameterShard(
                *span, self.initial_vector(key[0])[span[0] : span[1]], self.config(), step_micro_batches=step
            )
        since = self._waiting_since.setdefault(key, time.monotonic())
        if time.monotonic() - since < OPEN_GRACE_S:
            logger.info(
                "shard %s: the newest state here is version %s, the swarm has seen %d; asking again",
                key,
                "none" if best is None else best.version,
                seen,
            )
            return None
        shard = best or ParameterShard(
            *span, self.initial_vector(key[0])[span[0] : span[1]], self.config(), step_micro_batches=step
        )
        lost = max(0, seen - shard.version)
        self.versions_lost += lost
        logger.warning(
            "shard %s: no state newer than version %d could be had in %.0f s; the swarm had seen %d: "
            "%d update(s) of this shard are lost",
            key,
            shard.version,
            OPEN_GRACE_S,
            seen,
            lost,
        )
        return shard

    def _sources(self, key: Shard) -> list[str]:
        """Whom a state is taken from: the last rightful holder and the standby it named, and the
        live members that still hold a lease of the shard (a holder the assignment has just moved
        it from) with their named standbys. Nobody else's state is asked for."""
        trainer = self.trainer
        leases: list[ShardLease] = [known[0] for known in [trainer.rightful.get(key)] if known is not None]
        leases += trainer.lease_holders.get(key, [])
        peers = [p for lease in leases for p in (lease.peer_id, lease.standby)]
        return [p for p in dict.fromkeys(peers) if p and p != trainer.own and p in trainer.live]

    async def _fetch(self, key: Shard, peer: str, span: tuple[int, int], step: int) -> ParameterShard | None:
        trainer = self.trainer
        request = ReplicaFetch(run_id=trainer.spec.run_id, stage=key[0], shard=key[1], after_version=-1)
        try:
            answer, blobs = await trainer.send(peer, request, [], FETCH_TIMEOUT_S)
        except RpcError as e:
            logger.info("shard %s: %s has no state for us (%s)", key, peer, e)
            return None
        if answer.kind != "checkpoint" or not blobs:
            return None
        if not trainer.seen.admits(key, answer.version):
            logger.warning(
                "shard %s: %s offers version %d, far past the %d the swarm has seen; refused",
                key,
                peer,
                answer.version,
                trainer.seen.of(key),
            )
            return None
        try:
            shard = await asyncio.to_thread(open_checkpoint_bytes, blobs[0], self.config(), step, span)
        except (SwarmdError, KeyError, ValueError) as e:
            logger.warning("shard %s: the state %s sent is unusable (%s)", key, peer, e)
            return None
        if shard.version != answer.version:
            logger.warning(
                "shard %s: %s said version %d but sent %d; refused", key, peer, answer.version, shard.version
            )
            return None
        return shard

    def _own_checkpoint(self, path: Path, span: tuple[int, int], step: int) -> ParameterShard | None:
        if not path.is_file():
            return None
        try:
            return ParameterShard.from_checkpoint(path, self.config(), step_micro_batches=step, expected_range=span)
        except (SwarmdError, KeyError, ValueError) as e:
            logger.warning("%s is unusable (%s); not resuming from it", path, e)
            return None

    # --- a server's replication -------------------------------------------------------------------

    async def _log_step(self, key: Shard, lineage: str, step: ShardStep, ledger: str) -> bool:
        standby = self.trainer.books.standby
        if standby is None:
            return False
        frame = await asyncio.to_thread(encode_vector, step.delta, "fp16")
        request = ReplicaLog(
            run_id=self.trainer.spec.run_id,
            stage=key[0],
            shard=key[1],
            lineage=lineage,
            version=step.version,
            share_ids=list(step.share_ids),
            ledger=ledger,
        )
        await self.trainer.send(standby, request, [frame], LOG_TIMEOUT_S)
        return True

    async def _send_checkpoint(self, key: Shard, lineage: str, version: int, data: bytes) -> bool:
        standby = self.trainer.books.standby
        if standby is None:
            return False
        request = ReplicaCheckpoint(
            run_id=self.trainer.spec.run_id, stage=key[0], shard=key[1], lineage=lineage, version=version
        )
        await self.trainer.send(standby, request, [data], FETCH_TIMEOUT_S)
        return True


def replay(replica: Replica, config: ShardConfig, step: int, span: tuple[int, int]) -> ParameterShard:
    """The shard a replica rebuilds: its checkpoint, then every logged step in order."""
    assert replica.checkpoint is not None
    shard = open_checkpoint_bytes(replica.checkpoint, config, step, span)
    for entry in replica.log:
        delta = decode_vector(entry.delta, span[1] - span[0], "fp16").to(torch.float16)  # exact: sent as fp16
        shard.apply_logged(entry.version, delta, entry.share_ids)
        if entry.ledger:
            shard.metadata["ledger"] = entry.ledger
    return shard


def open_checkpoint_bytes(data: bytes, config: ShardConfig, step: int, span: tuple[int, int]) -> ParameterShard:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "shard.safetensors"
        path.write_bytes(data)
        try:
            return ParameterShard.from_checkpoint(path, config, step_micro_batches=step, expected_range=span)
        except ShardError:
            raise
        except Exception as e:  # safetensors raises its own types on a corrupt file
            raise ShardError(f"not a readable shard checkpoint ({type(e).__name__}: {e})") from None


def replica_checkpoint(replica: Replica, config: ShardConfig, step: int, span: tuple[int, int]) -> tuple[int, bytes]:
    """A replica replayed into one checkpoint (for a peer taking the shard over)."""
    shard = replay(replica, config, step, span)
    with tempfile.TemporaryDirectory() as folder:
        path = shard.checkpoint(Path(folder) / "shard.safetensors")
        return shard.version, path.read_bytes()


# --- cells ----------------------------------------------------------------------------------------


def stage_module(trainer: Trainer, stage: int) -> StageModule:
    s = trainer.spec.spec
    return StageModule.from_shape(
        s.model, run_seed(trainer.spec.run_id), split_layers(s.model.layers, trainer.stages), stage
    )


def make_cell(trainer: Trainer, cell: Cell, assignment: Assignment, dataset: Dataset) -> CellWorker:
    s = trainer.spec.spec
    compute = CellCompute(
        stage_module(trainer, cell[1]),
        mode=trainer.mode,
        window=window(trainer.stages),
        lr=s.lr,
        weight_decay=s.weight_decay,
    )
    worker = CellWorker(
        cell,
        trainer.stages,
        trainer.exchange_settings(),
        compute,
        dataset,
        s.micro_batch,
        trainer.spec.run_id,
        trainer.send,
        lambda peer: trainer.roles.link_Bps(trainer.own, peer),
        shape=s.model,
        shards=assignment.shard_counts()[cell[1]],
        half=trainer.half,
    )
    worker.reducer = trainer.reducer
    return worker
