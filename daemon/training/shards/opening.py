"""Opening a shard server on the newest state this peer may believe, replicated at its standby.

The state comes from ``shard_sources`` (this peer's replica, the shard's last holders, its own
file, the seed; or nothing yet: the shard is opened again next round). The server opened on it
logs every step at this peer's standby and sends it a checkpoint every ``CHECKPOINT_EVERY``
steps (the log after it is all a take-over replays), and writes its provenance (this run, the
shard, this peer) into every checkpoint (``TracedShard``). The server of shard (0, 0) also
keeps the share ledger (``LedgerHost``), restored from the state's metadata: the ledger's
state goes with every logged step and checkpoint.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from swarmd.models.checkpoint_check import Provenance
from swarmd.models.shard_config import ShardError
from swarmd.peers.taskpool.assignment import Assignment
from swarmd.peers.taskpool.exchange import ExchangeConfig, step_micro_batches
from swarmd.peers.taskpool.servers import Shard
from swarmd.peers.taskpool.shares import Share, open_limit
from swarmd.peers.wire.codecs import encode_vector
from swarmd.peers.wire.messages import ReplicaCheckpoint, ReplicaLog
from swarmd.training.bookkeeping import Books
from swarmd.training.run_facts import RunFacts, Send
from swarmd.training.shards.ledger_host import LedgerHost
from swarmd.training.shards.shard_server import ShardServer
from swarmd.training.shards.shard_sources import FETCH_TIMEOUT_S, ShardSources, StageGeometry, shard_file

if TYPE_CHECKING:
    from swarmd.models.parameter_shard import ShardStep

logger = logging.getLogger(__name__)

CHECKPOINT_EVERY = 10
"""Steps between the checkpoints a server sends its standby: the log a take-over replays."""
LOG_TIMEOUT_S = 10.0


class OpenerView(Protocol):
    """What opening reads of the pool: the books (the claim's time, the standby) and the exchange."""

    @property
    def books(self) -> Books: ...

    def exchange_settings(self) -> ExchangeConfig: ...


@dataclass(frozen=True)
class Opened:
    server: ShardServer
    ledger: LedgerHost | None
    """The share ledger, for shard (0, 0)'s server only."""


class ShardOpener:
    """Opens the shard servers this peer is given. ``stage0_holder`` and ``sign_ticket`` are
    the ledger's (who holds a pipeline's stage-0 cell; a share's ticket, signed here)."""

    def __init__(
        self,
        facts: RunFacts,
        pool: OpenerView,
        geometry: StageGeometry,
        sources: ShardSources,
        send: Send,
        stage0_holder: Callable[[int], str | None],
        sign_ticket: Callable[[Share, int, float], str],
    ) -> None:
        self._facts = facts
        self._pool = pool
        self._geometry = geometry
        self._sources = sources
        self._send = send
        self._stage0_holder = stage0_holder
        self._sign_ticket = sign_ticket

    async def open(self, key: Shard, assignment: Assignment) -> Opened | None:
        """The shard's server on its believable state; None: no such state yet (module doc)."""
        facts, pool = self._facts, self._pool
        layout = self._geometry.layout(key)
        if layout is None:
            raise ShardError(f"the assignment in force has no shard {key}; it cannot be opened")
        shards, (lo, hi) = layout.shards, layout.span
        size = self._geometry.stage_size(key[0])
        path = shard_file(facts.checkpoint_dir, key, shards)
        step = step_micro_batches(pool.exchange_settings())
        shard = await self._sources.believable_state(key, layout, path, step)
        if shard is None:
            return None
        shard.step_micro_batches = step
        shard.provenance = Provenance.of(layout, facts.own)  # this server's checkpoints are its own
        lineage = f"{facts.own[:16]}@{pool.books.shard_claims.get(key, time.time()):.3f}"
        ledger = None
        if key == (0, 0):
            ledger = LedgerHost.from_state(
                shard.metadata.get("ledger", ""),
                assignment.share_micro_batches,
                self._stage0_holder,
                lambda: open_limit(pool.exchange_settings().local_steps),
                self._sign_ticket,
            )
        server = ShardServer(
            key,
            shards,
            shard,
            pool.exchange_settings(),
            lineage,
            path,
            log_step=lambda step_, ledger_: self._log_step(key, lineage, step_, ledger_),
            send_checkpoint=lambda version, data: self._send_checkpoint(key, lineage, version, data),
            checkpoint_every=CHECKPOINT_EVERY,
            ledger_state=(lambda: "") if ledger is None else ledger.state,
        )
        self._sources.opened(key)
        logger.info(
            "Serving shard %s (%d of stage %d's %d parameters) from version %d",
            key,
            hi - lo,
            key[0],
            size,
            shard.version,
        )
        return Opened(server, ledger)

    # --- a server's replication -------------------------------------------------------------------

    async def _log_step(self, key: Shard, lineage: str, step: ShardStep, ledger: str) -> bool:
        standby = self._pool.books.standby
        if standby is None:
            return False
        frame = await asyncio.to_thread(encode_vector, step.delta, "fp16")
        request = ReplicaLog(
            run_id=self._facts.run_id,
            stage=key[0],
            shard=key[1],
            lineage=lineage,
            version=step.version,
            share_ids=list(step.share_ids),
            ledger=ledger,
        )
        await self._send(standby, request, [frame], LOG_TIMEOUT_S)
        return True

    async def _send_checkpoint(self, key: Shard, lineage: str, version: int, data: bytes) -> bool:
        standby = self._pool.books.standby
        if standby is None:
            return False
        request = ReplicaCheckpoint(
            run_id=self._facts.run_id, stage=key[0], shard=key[1], lineage=lineage, version=version
        )
        await self._send(standby, request, [data], FETCH_TIMEOUT_S)
        return True
