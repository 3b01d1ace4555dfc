"""The training data path's requests, as this peer serves them: to its cells, its shards, the
ledger it keeps, and the replicas it stands by for.

Each handler checks that the speaker is a live member of the run before anything else
(``NotMember``), then finds what the request is addressed to (``NotHolder`` when this peer does
not hold it any more: the caller reads the pool again). The requests arrive already checked
against their schemas (``swarmd.peers.wire.protocol``); tensors are checked where they are
decoded.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from swarmd.peers.taskpool.exchange import shard_range, step_micro_batches
from swarmd.peers.wire.errors import NotHolder, NotMember
from swarmd.peers.wire.messages import (
    Ack,
    CellBackward,
    CellForward,
    Completed,
    Contribute,
    Contributed,
    Fetched,
    Issued,
    LedgerAbandon,
    LedgerComplete,
    LedgerIssue,
    Pull,
    Pulled,
    PullFromHead,
    Reduce,
    ReplicaCheckpoint,
    ReplicaFetch,
    ReplicaLog,
)
from swarmd.peers.wire.protocol import Request
from swarmd.training.ledger_host import LedgerHost
from swarmd.training.opening import replica_checkpoint
from swarmd.training.replicas import LogEntry

if TYPE_CHECKING:
    from swarmd.training.trainer import Trainer

Handler = Callable[[str, Any, list[bytes]], Awaitable[tuple[Any, list[bytes]]]]


def _tickets(blobs: list[bytes]) -> bytes:
    """A contribution's share tickets: its second blob (none: no tickets, refused)."""
    return blobs[1] if len(blobs) > 1 else b""


class TrainingHandlers:
    def __init__(self, trainer: Trainer) -> None:
        self.trainer = trainer
        self.ledger: LedgerHost | None = None
        """Set while this peer serves shard (0, 0), which keeps the share ledger."""

    def table(self) -> dict[type[Request[Any]], Handler]:
        return {
            CellForward: self.cell_tensor,
            CellBackward: self.cell_tensor,
            Contribute: self.contribute,
            Pull: self.pull,
            Reduce: self.reduce,
            PullFromHead: self.pull_from_head,
            LedgerIssue: self.ledger_issue,
            LedgerComplete: self.ledger_complete,
            LedgerAbandon: self.ledger_abandon,
            ReplicaLog: self.replica_log,
            ReplicaCheckpoint: self.replica_checkpoint,
            ReplicaFetch: self.replica_fetch,
        }

    def _member(self, sender: str) -> None:
        if sender not in self.trainer.live:
            raise NotMember(f"{sender[:16]} is not a live member of run {self.trainer.spec.run_id} here")

    async def cell_tensor(
        self, sender: str, request: CellForward | CellBackward, blobs: list[bytes]
    ) -> tuple[Ack, list[bytes]]:
        self._member(sender)
        await self.trainer.worker((request.pipeline, request.stage)).handle(sender, request, blobs[0])
        return Ack(), []

    async def contribute(self, sender: str, request: Contribute, blobs: list[bytes]) -> tuple[Contributed, list[bytes]]:
        self._member(sender)
        server = self.trainer.server((request.stage, request.shard))
        # Only a cell of this stage, for its pipelines' ticketed shares, before decoding.
        await server.admit(sender, request, _tickets(blobs), self.trainer)
        return await server.contribute(request, blobs[0], sender=sender), []

    async def reduce(self, sender: str, request: Reduce, blobs: list[bytes]) -> tuple[Contributed, list[bytes]]:
        self._member(sender)
        return await self.trainer.reducer.reduce(sender, request, blobs[0], _tickets(blobs)), []

    async def pull_from_head(
        self, sender: str, request: PullFromHead, blobs: list[bytes]
    ) -> tuple[Pulled, list[bytes]]:
        self._member(sender)
        return await self.trainer.reducer.pull(sender, request)

    async def pull(self, sender: str, request: Pull, blobs: list[bytes]) -> tuple[Pulled, list[bytes]]:
        # Reading a stage's committed weights is the run spec's choice: anyone's for an open
        # run's public weights (the request server admitted the stranger for this alone).
        if self.trainer.spec.spec.checkpoint_access != "public":
            self._member(sender)
        return await self.trainer.server((request.stage, request.shard)).pull(request)

    def _ledger(self) -> LedgerHost:
        if self.ledger is None:
            raise NotHolder("this peer does not keep the share ledger (any more); it is with shard (0, 0)'s holder")
        return self.ledger

    async def ledger_issue(self, sender: str, request: LedgerIssue, blobs: list[bytes]) -> tuple[Issued, list[bytes]]:
        self._member(sender)
        return self._ledger().issue(sender, request, time.time()), []

    async def ledger_complete(
        self, sender: str, request: LedgerComplete, blobs: list[bytes]
    ) -> tuple[Completed, list[bytes]]:
        self._member(sender)
        return self._ledger().complete(sender, request), []

    async def ledger_abandon(self, sender: str, request: LedgerAbandon, blobs: list[bytes]) -> tuple[Ack, list[bytes]]:
        self._member(sender)
        self._ledger().abandon(sender, request)
        return Ack(), []

    async def replica_log(self, sender: str, request: ReplicaLog, blobs: list[bytes]) -> tuple[Ack, list[bytes]]:
        self._member(sender)
        entry = LogEntry(request.version, blobs[0], tuple(request.share_ids), request.ledger)
        self.trainer.replicas.append((request.stage, request.shard), sender, request.lineage, entry)
        return Ack(), []

    async def replica_checkpoint(
        self, sender: str, request: ReplicaCheckpoint, blobs: list[bytes]
    ) -> tuple[Ack, list[bytes]]:
        self._member(sender)
        replicas, key = self.trainer.replicas, (request.stage, request.shard)
        # Its checks read the whole file (80 ms for 64 MB): off the loop; kept on it.
        length = await asyncio.to_thread(
            replicas.check_checkpoint, key, sender, request.lineage, request.version, blobs[0]
        )
        replicas.keep_checkpoint(key, sender, request.lineage, request.version, blobs[0], length)
        return Ack(), []

    async def replica_fetch(
        self, sender: str, request: ReplicaFetch, blobs: list[bytes]
    ) -> tuple[Fetched, list[bytes]]:
        """A peer taking a shard over asks for its state: the holder hands it over (closing its
        server first, so that no step is made after the state it sends), a standby replays its
        replica. Only the shard's rightful holder as the pool now resolves it, or the peer the
        assignment in force names for it, may ask (any member, of a peer paused since it served)."""
        self._member(sender)
        trainer, key = self.trainer, (request.stage, request.shard)
        named = None if trainer.assignment is None else trainer.assignment.named_shards().get(key)
        # A paused peer reads the pool no more: what it handed back goes to the member that asks
        # (which checks the state's lineage itself, ``opening``), or the steps it made last,
        # before its standby had a copy, would be lost.
        handing_back = trainer.paused and key in trainer.handed_over
        if sender not in (trainer.shard_holder(key), named) and not handing_back:
            raise NotHolder(f"{sender[:16]} does not hold shard {key} here; only its new holder takes its state")
        server = trainer.servers.get(key)
        if server is not None and named == trainer.own:  # the asker follows a newer assignment: it waits
            return Fetched(version=server.version, kind="serving", versions=[]), []
        if server is not None:
            await trainer.lifecycle.close_shard(key)  # hand its state over to the new holder
            data = await asyncio.to_thread(server.checkpoint_path.read_bytes)
            return Fetched(version=server.version, kind="checkpoint", versions=[]), [data]
        replica = trainer.replicas.newest(key)
        closed = trainer.handed_over.get(key)
        if closed is not None and (replica is None or closed[0] >= replica.version):
            data = await asyncio.to_thread(closed[1].read_bytes)  # what we served last, as we closed it
            return Fetched(version=closed[0], kind="checkpoint", versions=[]), [data]
        if replica is None:
            return Fetched(version=-1, kind="none", versions=[]), []
        opener = trainer.opener
        assert trainer.assignment is not None
        shards = trainer.assignment.shard_counts()[key[0]]
        span = shard_range(opener.initial_vector(key[0]).numel(), shards, key[1])
        version, data = await asyncio.to_thread(
            replica_checkpoint, replica, opener.config(), step_micro_batches(trainer.exchange_settings()), span
        )
        return Fetched(version=version, kind="checkpoint", versions=[]), [data]
