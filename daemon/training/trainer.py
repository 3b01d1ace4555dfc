"""The daemon's training service: hold the cells and shards the pool gives this peer, serve them.

Every round (``tick``) it reads the assignment in force (the coordinator's plan, or the
provisional rule before there is one, ``swarmd.peers.taskpool.assignment``), the leases of the
pipelines that concern it and of every stage's shards, settles them by the pool's rules
(``swarmd.peers.taskpool.cells`` / ``servers``: only live members, only where the assignment
allows, a standby for a holder that left), claims or renews what this peer should hold,
releases what it should not, and opens or closes a ``CellWorker`` per cell and a
``ShardServer`` per shard accordingly. Then it tells every cell where its neighbours, its
stage's servers and the ledger are.

It also serves the data path's requests addressed to what it holds (``handlers``), keeps the
replicas of the shards it stands by for (``ReplicaStore``), and on stop hands everything back:
cells stop, servers flush and copy to their standbys, and the leases are released at once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch

from swarmd.errors import SwarmdError
from swarmd.models.cell_compute import flatten_parameters, unflatten_parameters
from swarmd.models.checkpoint import save_safetensors_atomic
from swarmd.models.corpus import Dataset, load_corpus, train_eval_split
from swarmd.peers.records.identity import Identity
from swarmd.peers.records.plan_record import PlanRecord
from swarmd.peers.records.run_spec import SignedRunSpec, run_seed
from swarmd.peers.taskpool.assignment import Assignment, from_plan, provisional
from swarmd.peers.taskpool.cells import Cell, CellLease, cells_to_hold, open_cells, pipeline_epoch, resolve_cells
from swarmd.peers.taskpool.exchange import ExchangeConfig, shard_range, step_micro_batches
from swarmd.peers.taskpool.reduction import group_of, head_of
from swarmd.peers.taskpool.servers import SeenVersions, Shard, ShardLease, encode_proof, resolve_shards
from swarmd.peers.wire.codecs import decode_vector
from swarmd.peers.wire.errors import NotHolder, RpcError
from swarmd.peers.wire.messages import Pull
from swarmd.peers.wire.protocol import Request
from swarmd.training.cell import CellView, CellWorker
from swarmd.training.handlers import TrainingHandlers
from swarmd.training.opening import ShardOpener, make_cell, stage_module
from swarmd.training.reducer import Reducer
from swarmd.training.replicas import ReplicaStore
from swarmd.training.shard_server import ShardServer

if TYPE_CHECKING:  # hivemind loads only where the DHT runs (it cannot share a process with py-libp2p)
    from swarmd.peers.dht.swarm_dht import SwarmDHT

logger = logging.getLogger(__name__)

LEASE_TTL_S = 30.0
CELL_STOP_S = 10.0
SHARD_CLOSE_S = 20.0
GATHER_WAIT_S = 45.0
"""How long a gather waits for a shard that is between holders (a hand-over takes a few
seconds: the old holder's last step copied, the new one's lease published)."""
GATHER_BACKOFF_S = (0.5, 4.0)

Send = Callable[[str, Request, list[bytes], float], Awaitable[tuple[Any, list[bytes]]]]


class RoleView(Protocol):
    """What the trainer asks of the swarm's measurements and elections (``swarmd.node.coordination``)."""

    def score_of(self, peer: str) -> float: ...

    def link_Bps(self, a: str, b: str) -> float: ...

    def plan_record(self) -> PlanRecord | None: ...

    def standby_for(self, own: str) -> str | None: ...


class Trainer:
    def __init__(
        self,
        spec: SignedRunSpec,
        identity: Identity,
        dht: SwarmDHT,
        checkpoint_dir: Path,
        members: Callable[[], list[dict[str, Any]]],
        roles: RoleView,
        send: Send,
        members_known: Callable[[], bool] = lambda: True,
    ) -> None:
        """``members``: the live members' heartbeat summaries (``Membership.snapshot``), this peer
        not among them. ``send``: one request to a peer, direct or through a relay.
        ``members_known``: whether the swarm's heartbeats have been read at least once: before,
        this peer would take itself for the only member and open every shard afresh."""
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
        self.half = "bf16" if spec.spec.model.family == "llama" else "fp16"
        """The half precision tensors travel in (the model's own for llama)."""
        self.state = "starting"
        self.error: str | None = None
        self.assignment: Assignment | None = None
        self.cell_holders: dict[Cell, CellLease] = {}
        self.shard_holders: dict[Shard, ShardLease] = {}
        self.live: set[str] = {self.own}
        self.cells: dict[Cell, CellWorker] = {}
        self.cell_tasks: dict[Cell, asyncio.Task[None]] = {}
        self.servers: dict[Shard, ShardServer] = {}
        self.replicas = ReplicaStore(self.shard_holder)
        self.seen = SeenVersions()
        self.lease_holders: dict[Shard, list[ShardLease]] = {}
        self.handed_over: dict[Shard, tuple[int, Path]] = {}
        """Shards this peer served and closed: their final state, for whoever holds them next."""
        self.rightful: dict[Shard, tuple[ShardLease, bytes]] = {}
        """The newest lease of each shard's rightful holder, with its signed bytes (a take-over's proof)."""
        self._cell_claims: dict[Cell, float] = {}
        self._shard_claims: dict[Shard, float] = {}
        self._proofs: dict[Shard, str] = {}  # shards held by take-over: the lease that named us standby
        self._standby: str | None = None
        self._extra_pipelines: set[int] = set()
        self._dataset: Dataset | None = None
        self._trained: deque[tuple[float, int]] = deque(maxlen=30)  # (time, version of shard (0, 0))
        self.opener = ShardOpener(self)
        self.handlers = TrainingHandlers(self)
        self.reducer = Reducer(self)

    # --- the round ----------------------------------------------------------------------------

    async def tick(self) -> None:
        if self.error is not None:
            if self.cells or self.servers:
                await self.release()
            self.state = "failed"
            return
        if self._dataset is None:
            try:
                self._dataset = await asyncio.to_thread(self._load_dataset)
            except SwarmdError as e:
                self.error = str(e)
                logger.error("Cannot train run %s: %s", self.spec.run_id, e)
                return
        if not self.members_known():
            self.state = "waiting for the swarm's membership"
            return
        now = time.time()
        members = self.members()
        self.live = {m["peer_id"] for m in members if "worker" in m["roles"]} | {self.own}
        assignment = self._assignment()
        if assignment != self.assignment:
            logger.info(
                "Following %s: %d pipeline(s) of %d stage(s), H = %d, k = %d",
                "the provisional assignment" if assignment.provisional else f"plan {assignment.version}",
                assignment.pipelines,
                assignment.stages,
                assignment.local_steps,
                assignment.share_micro_batches,
            )
            self.assignment = assignment
        await self._settle_shards(assignment, now)
        await self._settle_cells(assignment, now)
        self._update_views(assignment)
        ledger = self.handlers.ledger
        if ledger is not None:
            ledger.follow(assignment.share_micro_batches)
            ledger.tick(now, self.live)
        first = self.servers.get((0, 0))
        if first is not None:
            self._trained.append((time.monotonic(), first.version))
        self.state = "training" if self.cells or self.servers else "idle"

    def _assignment(self) -> Assignment:
        record = self.roles.plan_record()
        # A plan of S stages needs S members: with fewer, the coordinator cannot plan (nor repair
        # the last plan), and the provisional rule spreads the cells over whoever is here.
        if record is not None and len(self.live) >= self.stages:
            planned = from_plan(record, self.stages, self.batch_micro_batches)
            if planned is not None:
                return planned
        return provisional(sorted(self.live), self.stages, self.batch_micro_batches)

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

    def _load_dataset(self) -> Dataset:
        spec = self.spec.spec
        train, _ = train_eval_split(load_corpus(spec.corpus), spec.model.seq_len, seed=run_seed(self.spec.run_id))
        return train

    # --- shards -------------------------------------------------------------------------------

    async def _settle_shards(self, assignment: Assignment, now: float) -> None:
        scans = await asyncio.gather(*(self.dht.scan_shards(s, now) for s in range(self.stages)))
        found = [pair for scan in scans for pair in scan]
        named = assignment.named_shards()
        holders = resolve_shards((lease for lease, _ in found), named, assignment.shard_counts(), self.live, now)
        raw_of = {(lease.peer_id, lease.key): raw for lease, raw in found}
        for key, lease in holders.items():
            self.rightful[key] = (lease, raw_of[(lease.peer_id, key)])
        self.seen.note(holders)
        # Live members' leases of a shard the assignment gives someone else: the holders it was
        # just moved from, whose state (and versions) its next holder takes. Only members count.
        held: dict[Shard, list[ShardLease]] = {}
        for lease, _ in found:  # released ones too: a holder that just handed the shard over has its state
            if lease.expires_at > now and lease.peer_id in self.live and lease.peer_id != self.own:
                held.setdefault(lease.key, []).append(lease)
        self.lease_holders = held
        self.seen.note({key: max(leases, key=lambda x: x.version) for key, leases in held.items()})
        self.shard_holders = holders
        standby = self.roles.standby_for(self.own)
        if standby != self._standby:
            self._standby = standby
            for server in self.servers.values():
                server.standby_changed()
        wanted = {key for key, peer in named.items() if peer == self.own} | self._takeovers(named)
        for key in sorted(set(self._shard_claims) - wanted):
            await self._close_shard(key)
            await self._publish_shard(key, now, released=True)
            del self._shard_claims[key]
            self._proofs.pop(key, None)
        for key in sorted(wanted):
            self._shard_claims.setdefault(key, now)
            await self._publish_shard(key, now, released=False)
        for key in list(self.servers):
            if key not in wanted or (key in holders and holders[key].peer_id != self.own):
                await self._close_shard(key)
        for key, lease in holders.items():
            if lease.peer_id == self.own and key not in self.servers and key in wanted:
                server = await self.opener.open(key, assignment)
                if server is not None:
                    self.servers[key] = server

    def _takeovers(self, named: dict[Shard, str]) -> set[Shard]:
        """Shards whose named server is gone and whose last rightful holder named us its standby
        (or is us: a shard we took over stays ours until the assignment names a live server)."""
        out = set()
        for key, peer in named.items():
            known = self.rightful.get(key)
            if peer in self.live or known is None:
                continue
            lease, _ = known
            if lease.peer_id == self.own or (lease.standby == self.own and lease.peer_id not in self.live):
                out.add(key)
        return out

    async def _publish_shard(self, key: Shard, now: float, released: bool) -> None:
        assert self.assignment is not None
        server = self.servers.get(key)
        replica = self.replicas.newest(key)
        version = server.version if server is not None else max(self.seen.of(key), replica.version if replica else 0)
        named = self.assignment.named_shards().get(key)
        known = self.rightful.get(key)
        if named == self.own:
            self._proofs.pop(key, None)
        elif known is not None and known[0].peer_id != self.own:
            self._proofs[key] = encode_proof(known[1])  # the holder we take over from named us
        proof = self._proofs.get(key, "") if named != self.own else ""
        lease = ShardLease(
            run_id=self.spec.run_id,
            stage=key[0],
            shard=key[1],
            shards=self.assignment.shard_counts()[key[0]],
            peer_id=self.own,
            claimed_at=self._shard_claims[key],
            issued_at=now,
            expires_at=now + LEASE_TTL_S,
            version=max(0, version),
            standby=self._standby or "",
            proof=proof,
            released=released,
        )
        await self.dht.publish_pool_lease(lease, lease.sign(self.identity))

    async def _close_shard(self, key: Shard) -> None:
        server = self.servers.pop(key, None)
        if server is None:
            return
        try:
            version = await asyncio.wait_for(server.close(), SHARD_CLOSE_S)
            self.handed_over[key] = (version, server.checkpoint_path)
            logger.info("Stopped serving shard %s at version %d", key, version)
        except TimeoutError:
            logger.warning("Shard %s did not close within %.0f s", key, SHARD_CLOSE_S)
        if key == (0, 0):
            self.handlers.ledger = None

    # --- cells --------------------------------------------------------------------------------

    async def _settle_cells(self, assignment: Assignment, now: float) -> None:
        named = assignment.named_cells()
        pipelines = {p for (p, _), peer in named.items() if peer == self.own}
        pipelines |= {p for p, _ in self._cell_claims} | {p for p, _ in open_cells(named, self.live)}
        pipelines |= {p for p in self._extra_pipelines if p < assignment.pipelines}
        pipelines |= {p for p in range(assignment.pipelines)} if (0, 0) in self.servers else set()
        # The reduction groups of our pipelines: their heads (ours to send to) and members (ours to wait for).
        pipelines |= {
            q
            for p in list(pipelines)
            if p < assignment.pipelines
            for s in range(assignment.stages)
            for q in group_of(p, assignment.pipelines, assignment.group_size(s))
        }
        self._extra_pipelines.clear()
        cells = [(p, s) for p in sorted(pipelines) for s in range(assignment.stages)]
        scans = await asyncio.gather(*(self.dht.scan_cell(p, s, now) for p, s in cells))
        holders = resolve_cells((lease for scan in scans for lease in scan), named, self.live, now)
        self.cell_holders = holders
        wanted = set(cells_to_hold(self.own, named, holders, self.live))
        for cell in sorted(set(self._cell_claims) - wanted):
            await self._close_cell(cell)
            await self._publish_cell(cell, now, released=True)
            del self._cell_claims[cell]
        for cell in sorted(wanted):
            self._cell_claims.setdefault(cell, now)
            await self._publish_cell(cell, now, released=False)
        for cell in list(self.cells):
            if cell not in wanted or (cell in holders and holders[cell].peer_id != self.own):
                await self._close_cell(cell)
            elif self.cell_tasks[cell].done():  # it stopped by itself (a bug it logged): open it afresh
                logger.warning("Cell %s stopped (%s); opening it again", cell, self.cells[cell].failure)
                await self._close_cell(cell)
        for cell, lease in holders.items():
            if lease.peer_id == self.own and cell in wanted and cell not in self.cells:
                self._open_cell(cell, assignment)

    async def _publish_cell(self, cell: Cell, now: float, released: bool) -> None:
        lease = CellLease(
            run_id=self.spec.run_id,
            pipeline=cell[0],
            stage=cell[1],
            peer_id=self.own,
            claimed_at=self._cell_claims[cell],
            issued_at=now,
            expires_at=now + LEASE_TTL_S,
            released=released,
        )
        await self.dht.publish_pool_lease(lease, lease.sign(self.identity))

    def _open_cell(self, cell: Cell, assignment: Assignment) -> None:
        assert self._dataset is not None
        worker = make_cell(self, cell, assignment, self._dataset)
        self.cells[cell] = worker
        self.cell_tasks[cell] = asyncio.create_task(self._run_cell(worker), name=f"cell {cell}")
        logger.info("Working cell %s (pipeline %d, stage %d)", cell, *cell)

    async def _run_cell(self, worker: CellWorker) -> None:
        try:
            await worker.run()
        except Exception as e:  # opened again next round (``_settle_cells``)
            logger.exception("Cell %s failed", worker.cell)
            worker.failure = f"{type(e).__name__}: {e}"

    async def _close_cell(self, cell: Cell) -> None:
        worker = self.cells.pop(cell, None)
        task = self.cell_tasks.pop(cell, None)
        if worker is None:
            return
        await worker.stop(CELL_STOP_S)
        if task is not None:
            await asyncio.gather(task, return_exceptions=True)
        logger.info("Stopped working cell %s", cell)

    def _update_views(self, assignment: Assignment) -> None:
        holders = {cell: lease.peer_id for cell, lease in self.cell_holders.items()}
        servers = {key: lease.peer_id for key, lease in self.shard_holders.items()}
        counts = assignment.shard_counts()
        for (p, s), worker in self.cells.items():
            row = [holders.get((p, t)) for t in range(assignment.stages)]
            heads = [head_of(p, assignment.pipelines, assignment.group_size(s), k) for k in range(counts[s])]
            worker.update(
                CellView(
                    epoch=pipeline_epoch(p, row),
                    prev=row[s - 1] if s > 0 else None,
                    next=row[s + 1] if s + 1 < assignment.stages else None,
                    servers=[servers.get((s, k)) for k in range(counts[s])],
                    ledger=servers.get((0, 0)),
                    heads=[_holder(holders, head, s) for head in heads],
                    head_pipelines=heads,
                )
            )

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
        lease = self.shard_holders.get(key)
        return None if lease is None else lease.peer_id

    def cell_holder(self, cell: Cell) -> str | None:
        """Who holds ``cell``, as of the last scan of the pool."""
        lease = self.cell_holders.get(cell)
        return None if lease is None else lease.peer_id

    def stage0_holder(self, pipeline: int) -> str | None:
        """Who holds pipeline ``pipeline``'s stage-0 cell, as of the last scan (a pipeline not
        scanned lately is read next round)."""
        lease = self.cell_holders.get((pipeline, 0))
        if lease is None:
            self._extra_pipelines.add(pipeline)
            return None
        return lease.peer_id

    def worker(self, cell: Cell) -> CellWorker:
        worker = self.cells.get(cell)
        if worker is None:
            raise NotHolder(f"this peer does not work cell {cell} (any more); read the cell leases again")
        return worker

    def server(self, key: Shard) -> ShardServer:
        server = self.servers.get(key)
        if server is None:
            raise NotHolder(f"this peer does not serve shard {key} (any more); read the shard leases again")
        return server

    # --- export -------------------------------------------------------------------------------

    async def gather_weights(self) -> list[int]:
        """Every stage's newest committed weights, from its shards' holders, written here as
        ``stage<s>.safetensors`` (for ``swarmd export``). Returns each stage's oldest shard version."""
        if self.assignment is None:
            raise SwarmdError("this peer has not read the pool yet; try again in a few seconds")
        versions = []
        for stage in range(self.stages):
            module = stage_module(self, stage)
            vector = flatten_parameters(module)
            shards = self.assignment.shard_counts()[stage]
            found = []
            for k in range(shards):
                lo, hi = shard_range(vector.numel(), shards, k)
                version, values = await self._whole_slice((stage, k), shards, hi - lo)
                vector[lo:hi] = values
                found.append(version)
            state = unflatten_parameters(module, vector)
            path = self.checkpoint_dir / f"stage{stage}.safetensors"
            await asyncio.to_thread(save_safetensors_atomic, state, path, {"version": str(min(found))})
            versions.append(min(found))
        return versions

    async def _whole_slice(self, key: Shard, shards: int, size: int) -> tuple[int, torch.Tensor]:
        """Shard ``key``'s newest weights, from here or its holder; a shard between holders is
        asked for again (with backoff) for up to ``GATHER_WAIT_S``."""
        deadline = time.monotonic() + GATHER_WAIT_S
        delay = GATHER_BACKOFF_S[0]
        while True:
            server = self.servers.get(key)
            if server is not None and (weights := server.weights()) is not None:
                return server.version, weights
            holder = self.shard_holder(key)
            why = "it has no holder right now"
            if holder is not None:
                request = Pull(
                    run_id=self.spec.run_id,
                    stage=key[0],
                    shard=key[1],
                    shards=shards,
                    have_version=-1,
                    pending_share_ids=[],
                    wait_s=0.0,
                )
                try:
                    answer, blobs = await self.send(holder, request, [], 60.0)
                except RpcError as e:  # the holder is handing it over, or gone
                    why = f"its holder {holder[:16]} did not answer ({e})"
                else:
                    if answer.kind != "full":
                        raise SwarmdError(f"shard {key}'s holder answered {answer.kind!r} to a whole pull")
                    return answer.version, decode_vector(blobs[0], size, "fp32")
            if time.monotonic() + delay > deadline:
                raise SwarmdError(f"shard {key}: {why}, for {GATHER_WAIT_S:.0f} s; try the export again shortly")
            await asyncio.sleep(delay)
            delay = min(2 * delay, GATHER_BACKOFF_S[1])

    # --- stopping -----------------------------------------------------------------------------

    async def release(self) -> None:
        """Stop every cell, flush and copy every shard, release every lease at once."""
        now = time.time()
        for cell in list(self.cells):
            await self._close_cell(cell)
        await self.reducer.stop()
        for key in list(self.servers):
            await self._close_shard(key)
        for cell in list(self._cell_claims):
            await self._publish_cell(cell, now, released=True)
        for key in list(self._shard_claims):
            await self._publish_shard(key, now, released=True)
        self._cell_claims.clear()
        self._shard_claims.clear()
        self.state = "stopped"

    # --- status -------------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        a = self.assignment
        cells = [w.info() for _, w in sorted(self.cells.items())]
        shards = [s.info() for _, s in sorted(self.servers.items())]
        versions = [c["weights"]["versions"][0] for c in cells if c["stage"] == 0] + [
            s["version"] for s in shards if (s["stage"], s["shard"]) == (0, 0)
        ]
        last = [w for (_, s), w in self.cells.items() if s == self.stages - 1]
        losses = sorted((m, loss) for w in last for m, loss in w.losses)
        recent = [loss for _, loss in losses[-16:]]
        ledger = self.handlers.ledger
        # Trained tokens: applied updates times the tokens of an update (a batch, H batches in
        # local mode), as shard (0, 0)'s server counts them; its version survives hand-overs.
        per_update = (
            self.spec.spec.micro_batch
            * self.spec.spec.model.seq_len
            * (step_micro_batches(self.exchange_settings()) if self.assignment is not None else 0)
        )
        first = self.servers.get((0, 0))
        tokens = None if first is None else first.version * per_update
        rate = None
        if first is not None and len(self._trained) >= 2 and self._trained[-1][0] > self._trained[0][0]:
            (t0, n0), (t1, n1) = self._trained[0], self._trained[-1]
            rate = round((n1 - n0) * per_update / (t1 - t0), 1)
        return {
            "state": self.state,
            "error": self.error,
            "stages": self.stages,
            "mode": self.mode,
            "assignment": None
            if a is None
            else {
                "version": a.version,
                "provisional": a.provisional,
                "pipelines": a.pipelines,
                "local_steps": a.local_steps,
                "share_micro_batches": a.share_micro_batches,
                "shards": [len(row) for row in a.servers],
            },
            "cells": cells,
            "shards": shards,
            "ledger": None if ledger is None else ledger.info(),
            "reducer": self.reducer.info(),
            "replicas": self.replicas.status(),
            "standby": self._standby,
            "updates": max(versions, default=0),
            "loss": round(sum(recent) / len(recent), 4) if recent else None,
            "losses": [[m, round(loss, 4)] for m, loss in losses[-512:]],
            "trained_tokens": tokens,
            "tokens_per_s": rate,
        }


def _holder(holders: dict[Cell, str], pipeline: int | None, stage: int) -> str | None:
    """Who holds cell ``(pipeline, stage)`` (None for no pipeline)."""
    return None if pipeline is None else holders.get((pipeline, stage))
