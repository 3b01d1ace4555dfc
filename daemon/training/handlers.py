"""The training data path's requests, as this peer serves them.

The requests to its cells, its shards, the ledger it keeps, and the replicas it stands by for.

Each handler checks that the speaker is a live member of the run before anything else
(``NotMember``), then finds what the request is addressed to (``NotHolder`` when this peer does
not hold it any more: the caller reads the pool again). The requests arrive already checked
against their schemas (``swarmd.peers.wire.protocol``); tensors are checked where they are
decoded.

The handlers are given what they route to, not the trainer (``run_facts``): the pool view,
what this peer holds, its replicas, its reducer and head relays, and ``close_shard``
(``Lifecycle.close_shard``: a shard handed over is closed first).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from swarmd.peers.taskpool.cells import Cell
from swarmd.peers.taskpool.exchange import shard_range, step_micro_batches
from swarmd.peers.taskpool.servers import Shard
from swarmd.peers.wire.errors import Busy, NotHolder, NotMember
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
from swarmd.training.cells.cell import CellWorker
from swarmd.training.held import Held
from swarmd.training.run_facts import RunFacts
from swarmd.training.shards.head_relay import HeadRelays
from swarmd.training.shards.ledger_host import LedgerHost
from swarmd.training.shards.pool_view import PoolView
from swarmd.training.shards.reducer import Reducer
from swarmd.training.shards.replicas import LogEntry, ReplicaStore
from swarmd.training.shards.shard_server import ShardServer
from swarmd.training.shards.shard_sources import StageGeometry, replica_checkpoint

Handler = Callable[[str, Any, list[bytes]], Awaitable[tuple[Any, list[bytes]]]]


def _tickets(blobs: list[bytes]) -> bytes:
    """A contribution's share tickets: its second blob (none: no tickets, refused)."""
    return blobs[1] if len(blobs) > 1 else b""


class TrainingHandlers:
    """The handlers of the module doc. ``paused``: whether this peer has handed everything back."""

    def __init__(
        self,
        facts: RunFacts,
        pool: PoolView,
        held: Held,
        replicas: ReplicaStore,
        geometry: StageGeometry,
        reducer: Reducer,
        relays: HeadRelays,
        close_shard: Callable[[Shard], Awaitable[None]],
        paused: Callable[[], bool],
    ) -> None:
        self._facts = facts
        self._pool = pool
        self._held = held
        self._replicas = replicas
        self._geometry = geometry
        self._reducer = reducer
        self._relays = relays
        self._close_shard = close_shard
        self._paused = paused

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
        if sender not in self._pool.books.live:
            raise NotMember(f"{sender[:16]} is not a live member of run {self._facts.run_id} here")

    def _standing_by(self, sender: str) -> None:
        """A standby takes a holder's replication: not while paused. A paused peer reads the pool
        no more, and its frozen view would refuse a new holder as "not its holder" for good,
        which the holder takes for a view that lags and waits out (``standby_link``)."""
        self._member(sender)
        if self._paused():
            raise Busy("this peer is paused by its owner and stands by for no shard; another standby takes over")

    def _worker(self, cell: Cell) -> CellWorker:
        worker = self._held.cells.get(cell)
        if worker is None:
            raise NotHolder(f"this peer does not work cell {cell} (any more); read the cell leases again")
        return worker

    def _server(self, key: Shard) -> ShardServer:
        server = self._held.servers.get(key)
        if server is None:
            raise NotHolder(f"this peer does not serve shard {key} (any more); read the shard leases again")
        return server

    async def cell_tensor(
        self, sender: str, request: CellForward | CellBackward, blobs: list[bytes]
    ) -> tuple[Ack, list[bytes]]:
        self._member(sender)
        await self._worker((request.pipeline, request.stage)).handle(sender, request, blobs[0])
        return Ack(), []

    async def contribute(self, sender: str, request: Contribute, blobs: list[bytes]) -> tuple[Contributed, list[bytes]]:
        self._member(sender)
        server = self._server((request.stage, request.shard))
        # Only a cell of this stage, for its pipelines' ticketed shares, before decoding.
        await server.admit(sender, request, _tickets(blobs), self._pool)
        return await server.contribute(request, blobs[0], sender=sender), []

    async def reduce(self, sender: str, request: Reduce, blobs: list[bytes]) -> tuple[Contributed, list[bytes]]:
        self._member(sender)
        return await self._reducer.reduce(sender, request, blobs[0], _tickets(blobs)), []

    async def pull_from_head(
        self, sender: str, request: PullFromHead, blobs: list[bytes]
    ) -> tuple[Pulled, list[bytes]]:
        self._member(sender)
        return await self._relays.pull(sender, request)

    async def pull(self, sender: str, request: Pull, blobs: list[bytes]) -> tuple[Pulled, list[bytes]]:
        # Reading a stage's committed weights is the run spec's choice: anyone's for an open
        # run's public weights (the request server admitted the stranger for this alone).
        if self._facts.spec.checkpoint_access != "public":
            self._member(sender)
        return await self._server((request.stage, request.shard)).pull(request, sender)

    def _ledger(self) -> LedgerHost:
        if self._held.ledger is None:
            raise NotHolder("this peer does not keep the share ledger (any more); it is with shard (0, 0)'s holder")
        return self._held.ledger

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
        self._standing_by(sender)
        entry = LogEntry(request.version, blobs[0], tuple(request.share_ids), request.ledger)
        self._replicas.append((request.stage, request.shard), sender, request.lineage, entry)
        return Ack(), []

    async def replica_checkpoint(
        self, sender: str, request: ReplicaCheckpoint, blobs: list[bytes]
    ) -> tuple[Ack, list[bytes]]:
        self._standing_by(sender)
        replicas, key = self._replicas, (request.stage, request.shard)
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
        held, key, assignment = self._held, (request.stage, request.shard), self._pool.assignment
        named = None if assignment is None else assignment.named_shards().get(key)
        # A paused peer reads the pool no more: what it handed back goes to the member that asks
        # (which checks the state's lineage itself, ``opening``), or the steps it made last,
        # before its standby had a copy, would be lost.
        handing_back = self._paused() and key in held.handed_over
        if sender not in (self._pool.shard_holder(key), named) and not handing_back:
            raise NotHolder(f"{sender[:16]} does not hold shard {key} here; only its new holder takes its state")
        server = held.servers.get(key)
        if server is not None and named == self._facts.own:  # the asker follows a newer assignment: it waits
            return Fetched(version=server.version, kind="serving", versions=[]), []
        if server is not None:
            await self._close_shard(key)  # hand its state over to the new holder
            data = await asyncio.to_thread(server.checkpoint_path.read_bytes)
            return Fetched(version=server.version, kind="checkpoint", versions=[]), [data]
        replica = self._replicas.newest(key)
        closed = held.handed_over.get(key)
        if closed is not None and (replica is None or closed[0] >= replica.version):
            data = await asyncio.to_thread(closed[1].read_bytes)  # what we served last, as we closed it
            return Fetched(version=closed[0], kind="checkpoint", versions=[]), [data]
        if replica is None:
            return Fetched(version=-1, kind="none", versions=[]), []
        geometry = self._geometry
        assert assignment is not None
        shards = assignment.shard_counts()[key[0]]
        span = shard_range(geometry.stage_size(key[0]), shards, key[1])
        version, data = await asyncio.to_thread(
            replica_checkpoint, replica, geometry.config(), step_micro_batches(self._pool.exchange_settings()), span
        )
        return Fetched(version=version, kind="checkpoint", versions=[]), [data]
