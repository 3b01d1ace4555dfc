"""The bookkeeping's actions carried out.

Cells and shard servers opened and closed, leases signed and published, and every cell told
where its neighbours are.

``bookkeeping`` decides, this module acts, one action after the other in the order given: a
claim is closed before it is released, so that whoever takes it next finds the state handed
over. What only the moment of acting knows is read here: a shard lease's version is its
server's as it is published (steps go on while the round runs), or, with no server, the
highest the swarm has shown or this peer keeps as a replica.

It is given what it acts on, not the trainer (``run_facts``): what this peer holds (``Held``,
which it alone changes), the opener and the cell maker, the DHT's ``publish`` of a lease, and
the trainer's data as it is once opened (``data``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Protocol

from swarmd.peers.taskpool.assignment import Assignment
from swarmd.peers.taskpool.cells import Cell, CellLease, pipeline_epoch
from swarmd.peers.taskpool.lease import Lease
from swarmd.peers.taskpool.reduction import head_of
from swarmd.peers.taskpool.servers import SeenVersions, Shard, ShardLease
from swarmd.training.bookkeeping import (
    Action,
    Books,
    CloseCell,
    CloseShard,
    Follow,
    NoteVersions,
    OpenCell,
    OpenShard,
    PublishCell,
    PublishShard,
    StandbyChanged,
    StopReducer,
)
from swarmd.training.cell_making import CellMaker
from swarmd.training.cells.cell import CellView, CellWorker
from swarmd.training.held import Held
from swarmd.training.run_facts import RunFacts
from swarmd.training.shards.opening import ShardOpener
from swarmd.training.shards.replicas import ReplicaStore

if TYPE_CHECKING:  # the run's data loads where it is opened (``swarmd.data.run_files``)
    from swarmd.data.training_data import TrainingData

logger = logging.getLogger(__name__)

LEASE_TTL_S = 30.0
CELL_STOP_S = 10.0
SHARD_CLOSE_S = 20.0


class LifecycleView(Protocol):
    """What acting reads of the pool: the books (who holds what) and the assignment in force."""

    @property
    def books(self) -> Books: ...

    @property
    def assignment(self) -> Assignment | None: ...

    def shard_holder(self, key: Shard) -> str | None: ...


class Lifecycle:
    """The trainer's hands: what ``bookkeeping`` decides, done on the cells and servers held.

    ``publish``: a signed lease into the DHT; ``note_holders``: the shards' holders as the pool
    resolves them, remembered (``ShardSources.note_holders``); ``stop_reducer``: the reducer's
    stop; ``data``: the run's data, once open."""

    def __init__(
        self,
        facts: RunFacts,
        pool: LifecycleView,
        held: Held,
        publish: Callable[[Lease, bytes], Awaitable[bool]],
        seen: SeenVersions,
        replicas: ReplicaStore,
        note_holders: Callable[[Mapping[Shard, ShardLease]], None],
        opener: ShardOpener,
        cell_maker: CellMaker,
        stop_reducer: Callable[[], Awaitable[None]],
        data: Callable[[], TrainingData | None],
    ) -> None:
        self._facts = facts
        self._pool = pool
        self._held = held
        self._publish = publish
        self._seen = seen
        self._replicas = replicas
        self._note_holders = note_holders
        self._opener = opener
        self._cell_maker = cell_maker
        self._stop_reducer = stop_reducer
        self._data = data

    async def apply(self, actions: list[Action], now: float) -> None:
        for action in actions:
            await self._apply(action, now)

    async def _apply(self, action: Action, now: float) -> None:
        held = self._held
        if isinstance(action, Follow):
            _log_follow(action.assignment)
        elif isinstance(action, NoteVersions):
            self._seen.note(action.leases, now)
            self._note_holders(action.leases)  # whose states a take-over may bring
        elif isinstance(action, StandbyChanged):
            for server in held.servers.values():
                server.standby_changed()
        elif isinstance(action, PublishCell):
            await self._publish_cell(action, now)
        elif isinstance(action, PublishShard):
            await self._publish_shard(action, now)
        elif isinstance(action, OpenCell):
            self._open_cell(action.cell)
        elif isinstance(action, CloseCell):
            worker = held.cells.get(action.cell)
            if action.restart and worker is not None:
                logger.warning("Cell %s stopped (%s); opening it again", action.cell, worker.failure)
            await self.close_cell(action.cell)
        elif isinstance(action, OpenShard):
            opened = await self._opener.open(action.key, self._assignment())
            if opened is not None:
                if opened.ledger is not None:
                    held.ledger = opened.ledger
                held.servers[action.key] = opened.server
        elif isinstance(action, CloseShard):
            await self.close_shard(action.key)
        else:
            assert isinstance(action, StopReducer)
            await self._stop_reducer()

    def _assignment(self) -> Assignment:
        assignment = self._pool.assignment
        assert assignment is not None, "actions on cells and shards follow an assignment"
        return assignment

    # --- leases -------------------------------------------------------------------------------

    async def _publish_cell(self, action: PublishCell, now: float) -> None:
        facts = self._facts
        lease = CellLease(
            run_id=facts.run_id,
            pipeline=action.cell[0],
            stage=action.cell[1],
            peer_id=facts.own,
            claimed_at=action.claimed_at,
            issued_at=now,
            expires_at=now + LEASE_TTL_S,
            released=action.released,
        )
        await self._publish(lease, lease.sign(facts.identity))

    async def _publish_shard(self, action: PublishShard, now: float) -> None:
        facts, key = self._facts, action.key
        server = self._held.servers.get(key)
        replica = self._replicas.newest(key)
        closed = self._held.handed_over.get(key)  # a released lease shows the version it was closed at
        version = (
            server.version
            if server is not None
            else max(self._seen.of(key), replica.version if replica else 0, closed[0] if closed else 0)
        )
        lease = ShardLease(
            run_id=facts.run_id,
            stage=key[0],
            shard=key[1],
            shards=action.shards,
            peer_id=facts.own,
            claimed_at=action.claimed_at,
            issued_at=now,
            expires_at=now + LEASE_TTL_S,
            version=max(0, version),
            standby=action.standby,
            proof=action.proof,
            released=action.released,
        )
        await self._publish(lease, lease.sign(facts.identity))

    # --- cells and servers ----------------------------------------------------------------------

    def _open_cell(self, cell: Cell) -> None:
        data = self._data()
        assert data is not None, "the trainer opens its data before it reads the pool"
        worker = self._cell_maker.make(cell, self._assignment(), data)
        self._held.cells[cell] = worker
        self._held.cell_tasks[cell] = asyncio.create_task(_run_cell(worker), name=f"cell {cell}")
        logger.info("Working cell %s (pipeline %d, stage %d)", cell, *cell)

    async def close_cell(self, cell: Cell) -> None:
        worker = self._held.cells.pop(cell, None)
        task = self._held.cell_tasks.pop(cell, None)
        if worker is None:
            return
        await worker.stop(CELL_STOP_S)
        if task is not None:
            await asyncio.gather(task, return_exceptions=True)
        logger.info("Stopped working cell %s", cell)
        if worker.contributions.undelivered():
            self._deliver_rest(worker)

    def _deliver_rest(self, worker: CellWorker) -> None:
        """What the stopped cell could not deliver goes on to its shards' holders as the pool
        shows them (``Contributions.deliver_rest``): a shard moving with it has a new holder
        within seconds, and a slice dropped now is a batch that stage never learns from."""
        pool, stage = self._pool, worker.stage

        def servers() -> list[str | None]:
            counts = pool.assignment.shard_counts() if pool.assignment is not None else {}
            return [pool.shard_holder((stage, k)) for k in range(counts[stage] if stage < len(counts) else 0)]

        task = asyncio.create_task(worker.contributions.deliver_rest(servers), name=f"cell {worker.cell} rest")
        self._held.rest_deliveries.add(task)
        task.add_done_callback(self._held.rest_deliveries.discard)

    async def close_shard(self, key: Shard) -> None:
        """Close ``key``'s server, keeping its final state for whoever holds the shard next."""
        held = self._held
        server = held.servers.pop(key, None)
        if server is None:
            return
        try:
            version = await asyncio.wait_for(server.close(), SHARD_CLOSE_S)
            held.handed_over[key] = (version, server.checkpoint_path)
            logger.info("Stopped serving shard %s at version %d", key, version)
        except TimeoutError:
            logger.warning("Shard %s did not close within %.0f s", key, SHARD_CLOSE_S)
        if key == (0, 0):
            held.ledger = None

    def update_views(self) -> None:
        """Tell every cell who holds its neighbours, its stage's shards, the ledger and its heads."""
        books, assignment = self._pool.books, self._assignment()
        holders = {cell: lease.peer_id for cell, lease in books.cell_holders.items()}
        servers = {key: lease.peer_id for key, lease in books.shard_holders.items()}
        counts = assignment.shard_counts()
        for (p, s), worker in self._held.cells.items():
            row = [holders.get((p, t)) for t in range(assignment.stages)]
            heads = [head_of(p, assignment.pipelines, assignment.group_size(s), k) for k in range(counts[s])]
            worker.update(
                CellView(
                    epoch=pipeline_epoch(p, row),
                    prev=row[s - 1] if s > 0 else None,
                    next=row[s + 1] if s + 1 < assignment.stages else None,
                    servers=[servers.get((s, k)) for k in range(counts[s])],
                    ledger=servers.get((0, 0)),
                    heads=[None if head is None else holders.get((head, s)) for head in heads],
                    head_pipelines=heads,
                    pipelines=assignment.pipelines,
                )
            )


async def _run_cell(worker: CellWorker) -> None:
    try:
        await worker.run()
    except Exception as e:  # opened again next round (``bookkeeping``: a stopped cell restarts)
        logger.exception("Cell %s failed", worker.cell)
        worker.failure = f"{type(e).__name__}: {e}"


def _log_follow(assignment: Assignment) -> None:
    logger.info(
        "Following %s: %d pipeline(s) of %d stage(s), H = %d, k = %d",
        "the provisional assignment" if assignment.provisional else f"plan {assignment.version}",
        assignment.pipelines,
        assignment.stages,
        assignment.local_steps,
        assignment.share_micro_batches,
    )
