"""The daemon's training service: hold the cells and shards the pool gives this peer, serve them.

Every round (``tick``) it reads the live members and the assignment they put in force (the
coordinator's plan, or the provisional rule before there is one,
``swarmd.peers.taskpool.assignment``), then the leases of every stage's shards and of the
pipelines that concern it. The pure ``bookkeeping`` step decides from each reading what to
claim, renew, release, open and close, by the pool's rules (``swarmd.peers.taskpool.cells`` /
``servers``: only live members, only where the assignment allows, a standby for a holder that
left), and ``lifecycle`` does it: a ``CellWorker`` per cell, a ``ShardServer`` per shard. Then
every cell is told where its neighbours, its stage's servers and the ledger are.

It also serves the data path's requests addressed to what it holds (``handlers``), keeps the
replicas of the shards it stands by for (``ReplicaStore``), and on stop hands everything back:
cells stop, servers flush and copy to their standbys, and the leases are released at once.

Its parts are built from values, not from the trainer (``run_facts``): the run's facts, what
this peer holds (``Held``), the pool view the trainer itself implements (``PoolView``), and
each other, in the order they are built here.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from swarmd.errors import SwarmdError
from swarmd.models.build import load_model_library
from swarmd.models.precision import ComputeSettings
from swarmd.peers.records.identity import Identity
from swarmd.peers.records.plan_record import PlanRecord
from swarmd.peers.records.run_spec import SignedRunSpec, run_seed
from swarmd.peers.taskpool.assignment import Assignment
from swarmd.peers.taskpool.cells import Cell
from swarmd.peers.taskpool.exchange import ExchangeConfig, step_micro_batches
from swarmd.peers.taskpool.servers import SeenVersions, Shard, ShardLease
from swarmd.peers.taskpool.shares import Share
from swarmd.peers.taskpool.tickets import LedgerKeepers, ShareTicket
from swarmd.peers.wire.protocol import Request
from swarmd.system.tasks import cancel_all
from swarmd.training import export
from swarmd.training.bookkeeping import (
    Books,
    CellsSeen,
    Event,
    Observed,
    ShardsSeen,
    Stopping,
    assignment_in_force,
    cells_to_scan,
    step,
)
from swarmd.training.cell_making import CellMaker
from swarmd.training.evaluation import Evaluation, score_weights
from swarmd.training.handlers import TrainingHandlers
from swarmd.training.held import Held
from swarmd.training.lifecycle import Lifecycle
from swarmd.training.run_facts import RunFacts, RunInputs, Send
from swarmd.training.shards.head_relay import HeadRelays
from swarmd.training.shards.opening import ShardOpener
from swarmd.training.shards.reducer import Reducer
from swarmd.training.shards.replicas import ReplicaStore
from swarmd.training.shards.shard_sources import ShardSources, StageGeometry
from swarmd.training.status import Progress, training_status

if TYPE_CHECKING:  # hivemind loads only where the DHT runs (it cannot share a process with py-libp2p)
    import torch

    from swarmd.data.training_data import TrainingData
    from swarmd.peers.dht.swarm_dht import SwarmDHT

logger = logging.getLogger(__name__)

REST_CANCEL_S = 5.0
"""How long stopping waits for the cancelled deliveries of stopped cells' contributions."""


class RoleView(Protocol):
    """What the trainer asks of the swarm's measurements and elections (``swarmd.node.coordination``)."""

    def score_of(self, peer: str) -> float: ...

    def link_Bps(self, a: str, b: str) -> float: ...

    def plan_record(self) -> PlanRecord | None: ...

    def standby_for(self, own: str) -> str | None: ...


class Trainer:
    """The training service of the module doc: one per daemon that trains."""

    def __init__(
        self,
        spec: SignedRunSpec,
        identity: Identity,
        dht: SwarmDHT,
        checkpoint_dir: Path,
        members: Callable[[], list[dict[str, Any]]],
        roles: RoleView,
        send: Send,
        inputs: RunInputs,
        members_known: Callable[[], bool] = lambda: True,
        compute: ComputeSettings = ComputeSettings(),  # noqa: B008 (frozen: one shared default is safe)
    ) -> None:
        """``members``: the live members' heartbeat summaries (``Membership.snapshot``), this peer
        not among them. ``send``: one request to a peer, direct or through a relay.
        ``inputs``: the run's data and starting weights here (``swarmd.data``).
        ``members_known``: whether the swarm's heartbeats have been read at least once: before,
        this peer would take itself for the only member and open every shard afresh.
        ``compute``: where and how the cells compute (``run_facts.compute_settings``)."""
        self.members_known = members_known
        self.spec = spec
        self.identity = identity
        self.own = identity.peer_id
        self.dht = dht
        self.checkpoint_dir = checkpoint_dir
        self.members = members
        self.roles = roles
        self._send = send
        self.stages = spec.spec.stages
        self.batch_micro_batches = max(1, spec.spec.batch_sequences // spec.spec.micro_batch)
        self.mode = "gradient" if spec.spec.local_steps == 1 else "local"
        self.half = spec.spec.model.wire_half
        """The half precision tensors travel in (``ModelShape.wire_half``)."""
        self.state = "starting"
        self.error: str | None = None
        self.books = Books(own=self.own, live=frozenset({self.own}))
        """What this peer claims and last read of the pool (``bookkeeping``)."""
        self.held = Held()
        # The same containers as ``held``'s, never rebound: the status, the export and the tests read them here.
        self.cells, self.cell_tasks, self.servers = self.held.cells, self.held.cell_tasks, self.held.servers
        self.handed_over, self.rest_deliveries = self.held.handed_over, self.held.rest_deliveries
        self.seen = SeenVersions(self.own)
        self.data: TrainingData | None = None
        self.inputs = inputs
        self._opening_data: asyncio.Task[TrainingData] | None = None
        self.progress = Progress()
        spec_ = spec.spec
        self.evaluation = Evaluation(spec_.eval_every, spec_.eval_sequences)
        self._extra_pipelines: set[int] = set()  # asked about by the ledger, not scanned last round
        self._keepers = LedgerKeepers()
        self.paused = False
        self.reachable: frozenset[str] = frozenset()
        """Every live member, workers or not (a paused one still serves the state it handed back)."""
        self.facts = facts = RunFacts(spec, identity, checkpoint_dir, self.stages, self.mode, self.half, compute)
        self.geometry = StageGeometry(facts, self, self.seen)
        self.replicas = ReplicaStore(self.shard_holder, self.geometry)
        self.sources = ShardSources(
            facts, self, self.geometry, self.replicas, self.seen, inputs.initial_slice, self.send
        )
        self.opener = ShardOpener(
            facts, self, self.geometry, self.sources, self.send, self.stage0_holder, self.sign_ticket
        )
        self.relays = HeadRelays(self, self.held.cells)
        link_Bps = functools.partial(roles.link_Bps, self.own)
        self.reducer = Reducer(
            self, self.held.cells, self.relays, self.geometry.stage_size, self.send, link_Bps, self.half
        )
        cell_maker = CellMaker(facts, self.exchange_settings, self.send, link_Bps, self.relays)
        self.lifecycle = Lifecycle(
            facts,
            self,
            self.held,
            dht.publish_pool_lease,
            self.seen,
            self.replicas,
            self.sources.note_holders,
            self.opener,
            cell_maker,
            self.reducer.stop,
            lambda: self.data,
        )
        self.handlers = TrainingHandlers(
            facts,
            self,
            self.held,
            self.replicas,
            self.geometry,
            self.reducer,
            self.relays,
            self.lifecycle.close_shard,
            lambda: self.paused,
        )
        self._round = asyncio.Lock()  # a round and a pause never interleave

    # --- the books, as the helpers read them (``opening``, ``handlers``, ``reducer``) --------------

    @property
    def assignment(self) -> Assignment | None:
        return self.books.assignment

    @property
    def live(self) -> frozenset[str]:
        return self.books.live

    @property
    def rightful(self) -> Mapping[Shard, tuple[ShardLease, bytes]]:
        return self.books.rightful

    @property
    def lease_holders(self) -> Mapping[Shard, tuple[ShardLease, ...]]:
        return self.books.lease_holders

    # --- the round ----------------------------------------------------------------------------

    async def tick(self) -> None:
        async with self._round:
            await self._tick()

    async def pause(self) -> None:
        """Hand every cell and shard back (as at shutdown) and take no work until ``resume``
        (``swarmd.node.limits.pausing``); between two rounds, never in the middle of one."""
        async with self._round:
            self.paused = True
            await self.release()
            self.state = "paused"

    def resume(self) -> None:
        """Take work again from the next round (the assignment says which, as for a newcomer)."""
        self.paused = False
        self.state = "starting"

    async def _tick(self) -> None:
        if self.paused:
            return
        if self.error is not None:
            if self.cells or self.servers:
                await self.release()
            self.state = "failed"
            return
        if self.data is None and not self._data_opened():
            return
        if not self.members_known():
            self.state = "waiting for the swarm's membership"
            return
        now = time.time()
        members = self.members()
        live = frozenset({m["peer_id"] for m in members if "worker" in m["roles"]} | {self.own})
        self.reachable = frozenset(m["peer_id"] for m in members)
        assignment = assignment_in_force(self.roles.plan_record(), live, self.stages, self.batch_micro_batches)
        await self._step(Observed(live, assignment), now)
        scans = await asyncio.gather(*(self.dht.scan_shards(s, now) for s in range(self.stages)))
        standby = self.roles.standby_for(self.own)
        await self._step(
            ShardsSeen(tuple(pair for scan in scans for pair in scan), standby, tuple(self.servers), now), now
        )
        cells = cells_to_scan(self.books, (0, 0) in self.servers, self._extra_pipelines)
        self._extra_pipelines.clear()
        found = await asyncio.gather(*(self.dht.scan_cell(p, s, now) for p, s in cells))
        stopped = frozenset(cell for cell, task in self.cell_tasks.items() if task.done())
        await self._step(
            CellsSeen(tuple(lease for scan in found for lease in scan), tuple(self.cells), stopped, now), now
        )
        self.lifecycle.update_views()
        ledger = self.held.ledger
        if ledger is not None:
            ledger.follow(assignment.share_micro_batches)
            ledger.tick(now, set(self.live))
        first = self.servers.get((0, 0))
        if first is not None:
            self.progress.note(first.version)
            if self.evaluation.due(first.version):
                self.evaluation.start(first.version, self.trained_tokens(first.version), self.score_held_out)
        self.state = "training" if self.cells or self.servers else "idle"

    async def _step(self, event: Event, now: float) -> None:
        self.books, actions = step(self.books, event)
        await self.lifecycle.apply(actions, now)

    def exchange_settings(self) -> ExchangeConfig:
        assert self.assignment is not None
        s = self.spec.spec
        # The run fixes H (or leaves it to the plan: 0); local mode has at least two inner steps.
        fixed = s.local_steps
        local_steps = 1 if self.mode == "gradient" else (fixed or max(2, self.assignment.local_steps))
        return ExchangeConfig(
            batch_micro_batches=self.batch_micro_batches,
            share_micro_batches=self.assignment.share_micro_batches,
            local_steps=local_steps,
            max_staleness=s.max_staleness,
            outer_lr=s.outer_lr,
            outer_momentum=s.outer_momentum,
            pipelines=self.assignment.pipelines,
        )

    def _data_opened(self) -> bool:
        """Whether the run's data is open here; opens it in the background (it may be fetched)."""
        task = self._opening_data
        if task is None:
            self._opening_data = asyncio.create_task(_open_data(self.inputs), name="open the run's data")
            self.state = "opening the run's data"
            return False
        if not task.done():
            return False
        try:
            self.data = task.result()
        except (SwarmdError, OSError) as e:
            self.error = str(e)
            logger.error("Cannot train run %s: %s", self.spec.run_id, e)
            return False
        return True

    def trained_tokens(self, version: int) -> int:
        """Tokens trained on after ``version`` updates: a batch (H batches in local mode) each."""
        spec = self.spec.spec
        per_update = spec.micro_batch * spec.model.seq_len
        return version * per_update * (step_micro_batches(self.exchange_settings()) if self.assignment else 0)

    async def score_held_out(self) -> tuple[list[int], float | None]:
        """The swarm's newest weights, gathered here, scored on the held-out split."""
        stages = await export.gather_stages(self)
        return [version for version, _ in stages], await self.score([state for _, state in stages])

    async def score(self, stages: list[dict[str, torch.Tensor]]) -> float | None:
        """The held-out loss of the model these stage weights make (the model's forwards in a
        thread); None when the run's data has no held-out split."""
        assert self.data is not None
        held_out = await self.data.held_out()
        if held_out is None:
            return None
        spec = self.spec.spec
        seed = run_seed(self.spec.run_id)
        return await asyncio.to_thread(score_weights, spec.model, seed, stages, held_out, spec.eval_sequences)

    # --- what others ask of the pool ------------------------------------------------------------

    async def send(
        self, peer: str, request: Request[Any], blobs: list[bytes], timeout_s: float
    ) -> tuple[Any, list[bytes]]:
        """A request to a peer; to this peer itself (its own cells and shards) a function call:
        libp2p does not dial itself, and nothing is gained by encoding what stays here."""
        if peer == self.own:
            handler = self.handlers.table()[type(request)]
            return await asyncio.wait_for(handler(self.own, request, list(blobs)), timeout_s + request.server_wait_s())
        return await self._send(peer, request, blobs, timeout_s)

    def shard_holder(self, key: Shard) -> str | None:
        """Who holds shard ``key``, as of the last scan of the pool."""
        lease = self.books.shard_holders.get(key)
        return None if lease is None else lease.peer_id

    def ledger_keepers(self) -> list[str]:
        """Whose share tickets this peer believes: shard (0, 0)'s holder and standby, every peer
        with a lease of it, the plan's named holder, and those seen so lately (a failover)."""
        key = (0, 0)
        lease = self.books.shard_holders.get(key)
        now = [lease.peer_id, lease.standby] if lease is not None else []
        now += [held.peer_id for held in self.lease_holders.get(key, ())]
        if self.assignment is not None and self.assignment.servers and self.assignment.servers[0]:
            now.append(self.assignment.servers[0][0])  # the plan's named holder of (0, 0)
        return self._keepers.trusted(now, time.time())

    def sign_ticket(self, share: Share, pipeline: int, now: float) -> str:
        """The ticket of a share this peer's ledger issues to ``pipeline``."""
        fields = dict(share_id=share.share_id, first=share.first, count=share.count, pipeline=pipeline)  # ints
        return ShareTicket.sign(self.identity, self.spec.run_id, **fields, now=now).text()

    def cell_holder(self, cell: Cell) -> str | None:
        """Who holds ``cell``, as of the last scan of the pool."""
        lease = self.books.cell_holders.get(cell)
        return None if lease is None else lease.peer_id

    def stage0_holder(self, pipeline: int) -> str | None:
        """Who holds pipeline ``pipeline``'s stage-0 cell, as of the last scan (a pipeline not
        scanned lately is read next round)."""
        lease = self.books.cell_holders.get((pipeline, 0))
        if lease is None:
            self._extra_pipelines.add(pipeline)
            return None
        return lease.peer_id

    async def gather_weights(self) -> dict[str, Any]:
        """Every stage's newest committed weights, from its shards' holders, written here as
        ``stage<s>.safetensors`` with the tokenizer, and scored (for ``swarmd export``)."""
        return await export.gather_weights(self)

    # --- stopping and status ------------------------------------------------------------------

    async def release(self) -> None:
        """Stop every cell, flush and copy every shard, release every lease at once."""
        await self.evaluation.stop()
        await self._step(Stopping(tuple(self.cells), tuple(self.servers)), time.time())
        # Our servers are closed: what is still on its way goes nowhere now.
        await cancel_all(list(self.rest_deliveries), REST_CANCEL_S, "rest deliveries")
        self.state = "stopped"

    def status(self) -> dict[str, Any]:
        return training_status(self)


async def _open_data(inputs: RunInputs) -> TrainingData:
    """The run's data, and meanwhile the model library loaded in a thread: the first stage built
    on the event loop would otherwise stall it (heartbeats, status, requests) for 2 s of imports."""
    _, data = await asyncio.gather(asyncio.to_thread(load_model_library), inputs.training_data())
    return data
