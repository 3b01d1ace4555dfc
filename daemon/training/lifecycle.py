"""The bookkeeping's actions carried out: cells and shard servers opened and closed, leases
signed and published, and every cell told where its neighbours are.

``bookkeeping`` decides, this module acts, one action after the other in the order given: a
claim is closed before it is released, so that whoever takes it next finds the state handed
over. What only the moment of acting knows is read here: a shard lease's version is its
server's as it is published (steps go on while the round runs), or, with no server, the
highest the swarm has shown or this peer keeps as a replica.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from swarmd.peers.taskpool.cells import Cell, CellLease, pipeline_epoch
from swarmd.peers.taskpool.reduction import head_of
from swarmd.peers.taskpool.servers import Shard, ShardLease
from swarmd.training.bookkeeping import (
    Action,
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
from swarmd.training.cell import CellView, CellWorker
from swarmd.training.opening import make_cell

if TYPE_CHECKING:
    from swarmd.peers.taskpool.assignment import Assignment
    from swarmd.training.trainer import Trainer

logger = logging.getLogger(__name__)

LEASE_TTL_S = 30.0
CELL_STOP_S = 10.0
SHARD_CLOSE_S = 20.0


class Lifecycle:
    """The trainer's hands: what ``bookkeeping`` decides, done on the trainer's cells and servers."""

    def __init__(self, trainer: Trainer) -> None:
        self.trainer = trainer

    async def apply(self, actions: list[Action], now: float) -> None:
        for action in actions:
            await self._apply(action, now)

    async def _apply(self, action: Action, now: float) -> None:
        trainer = self.trainer
        if isinstance(action, Follow):
            _log_follow(action.assignment)
        elif isinstance(action, NoteVersions):
            trainer.seen.note(action.leases, now)
            trainer.opener.note_holders(action.leases)  # whose states a take-over may bring
        elif isinstance(action, StandbyChanged):
            for server in trainer.servers.values():
                server.standby_changed()
        elif isinstance(action, PublishCell):
            await self._publish_cell(action, now)
        elif isinstance(action, PublishShard):
            await self._publish_shard(action, now)
        elif isinstance(action, OpenCell):
            self._open_cell(action.cell)
        elif isinstance(action, CloseCell):
            worker = trainer.cells.get(action.cell)
            if action.restart and worker is not None:
                logger.warning("Cell %s stopped (%s); opening it again", action.cell, worker.failure)
            await self.close_cell(action.cell)
        elif isinstance(action, OpenShard):
            server = await trainer.opener.open(action.key, self._assignment())
            if server is not None:
                trainer.servers[action.key] = server
        elif isinstance(action, CloseShard):
            await self.close_shard(action.key)
        else:
            assert isinstance(action, StopReducer)
            await trainer.reducer.stop()

    def _assignment(self) -> Assignment:
        assignment = self.trainer.assignment
        assert assignment is not None, "actions on cells and shards follow an assignment"
        return assignment

    # --- leases -------------------------------------------------------------------------------

    async def _publish_cell(self, action: PublishCell, now: float) -> None:
        trainer = self.trainer
        lease = CellLease(
            run_id=trainer.spec.run_id,
            pipeline=action.cell[0],
            stage=action.cell[1],
            peer_id=trainer.own,
            claimed_at=action.claimed_at,
            issued_at=now,
            expires_at=now + LEASE_TTL_S,
            released=action.released,
        )
        await trainer.dht.publish_pool_lease(lease, lease.sign(trainer.identity))

    async def _publish_shard(self, action: PublishShard, now: float) -> None:
        trainer, key = self.trainer, action.key
        server = trainer.servers.get(key)
        replica = trainer.replicas.newest(key)
        closed = trainer.handed_over.get(key)  # a released lease shows the version it was closed at
        version = (
            server.version
            if server is not None
            else max(trainer.seen.of(key), replica.version if replica else 0, closed[0] if closed else 0)
        )
        lease = ShardLease(
            run_id=trainer.spec.run_id,
            stage=key[0],
            shard=key[1],
            shards=action.shards,
            peer_id=trainer.own,
            claimed_at=action.claimed_at,
            issued_at=now,
            expires_at=now + LEASE_TTL_S,
            version=max(0, version),
            standby=action.standby,
            proof=action.proof,
            released=action.released,
        )
        await trainer.dht.publish_pool_lease(lease, lease.sign(trainer.identity))

    # --- cells and servers ----------------------------------------------------------------------

    def _open_cell(self, cell: Cell) -> None:
        trainer = self.trainer
        assert trainer.data is not None, "the trainer opens its data before it reads the pool"
        worker = make_cell(trainer, cell, self._assignment(), trainer.data)
        trainer.cells[cell] = worker
        trainer.cell_tasks[cell] = asyncio.create_task(_run_cell(worker), name=f"cell {cell}")
        logger.info("Working cell %s (pipeline %d, stage %d)", cell, *cell)

    async def close_cell(self, cell: Cell) -> None:
        worker = self.trainer.cells.pop(cell, None)
        task = self.trainer.cell_tasks.pop(cell, None)
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
        trainer, stage = self.trainer, worker.stage

        def servers() -> list[str | None]:
            counts = trainer.assignment.shard_counts() if trainer.assignment is not None else []
            return [trainer.shard_holder((stage, k)) for k in range(counts[stage] if stage < len(counts) else 0)]

        task = asyncio.create_task(worker.contributions.deliver_rest(servers), name=f"cell {worker.cell} rest")
        trainer.rest_deliveries.add(task)
        task.add_done_callback(trainer.rest_deliveries.discard)

    async def close_shard(self, key: Shard) -> None:
        """Close ``key``'s server, keeping its final state for whoever holds the shard next."""
        trainer = self.trainer
        server = trainer.servers.pop(key, None)
        if server is None:
            return
        try:
            version = await asyncio.wait_for(server.close(), SHARD_CLOSE_S)
            trainer.handed_over[key] = (version, server.checkpoint_path)
            logger.info("Stopped serving shard %s at version %d", key, version)
        except TimeoutError:
            logger.warning("Shard %s did not close within %.0f s", key, SHARD_CLOSE_S)
        if key == (0, 0):
            trainer.handlers.ledger = None

    def update_views(self) -> None:
        """Tell every cell who holds its neighbours, its stage's shards, the ledger and its heads."""
        trainer, assignment = self.trainer, self._assignment()
        holders = {cell: lease.peer_id for cell, lease in trainer.books.cell_holders.items()}
        servers = {key: lease.peer_id for key, lease in trainer.books.shard_holders.items()}
        counts = assignment.shard_counts()
        for (p, s), worker in trainer.cells.items():
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
