"""A swarm of trainers in one process: the real training code over an in-memory DHT and network.

Every trainer is the daemon's own ``swarmd.training.trainer.Trainer``: it reads and writes
signed leases (through the real parsers), settles them by the pool's rules and serves the
data path's typed requests. Only the transport is replaced: the DHT is a dict of signed
records, and a request is encoded, decoded (the schema checks run) and handed to the peer's
handler. A peer that is "killed" stops answering and leaves the membership, as a SIGKILLed
daemon's heartbeat would lapse. No process, no socket, no p2pd: seconds, not minutes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from swarmd.data.training_data import CorpusData
from swarmd.errors import RecordError
from swarmd.models.data.corpus import load_corpus, train_eval_split
from swarmd.models.presets import DEFAULT_RUN
from swarmd.peers.records.identity import Identity
from swarmd.peers.records.plan_record import PlanRecord
from swarmd.peers.records.run_spec import SignedRunSpec, parse_spec_body, run_seed, sign_run_spec
from swarmd.peers.taskpool.cells import CellLease
from swarmd.peers.taskpool.lease import Lease
from swarmd.peers.taskpool.servers import ShardLease
from swarmd.peers.wire.errors import Unreachable, refusal
from swarmd.peers.wire.protocol import Request
from swarmd.training.trainer import Trainer


class MemoryDHT:
    """The two task-pool keys the trainer reads, holding signed records as the DHT would."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.cells: dict[tuple[int, int], dict[str, bytes]] = {}
        self.shards: dict[int, dict[str, bytes]] = {}

    async def publish_pool_lease(self, lease: Lease, raw: bytes) -> bool:
        if isinstance(lease, CellLease):
            self.cells.setdefault(lease.cell, {})[lease.peer_id] = raw
        else:
            self.shards.setdefault(lease.stage, {})[lease.peer_id] = raw  # type: ignore[attr-defined]
        return True

    async def scan_cell(self, pipeline: int, stage: int, now: float) -> list[CellLease]:
        out = []
        for peer, raw in self.cells.get((pipeline, stage), {}).items():
            with contextlib.suppress(RecordError):  # expired: the DHT would have let it go
                out.append(CellLease.parse(raw, run_id=self.run_id, now=now, peer_id=peer))
        return out

    async def scan_shards(self, stage: int, now: float) -> list[tuple[ShardLease, bytes]]:
        out = []
        for peer, raw in self.shards.get(stage, {}).items():
            with contextlib.suppress(RecordError):
                out.append((ShardLease.parse(raw, run_id=self.run_id, now=now, peer_id=peer), raw))
        return out


class CorpusInputs:
    """The run's corpus read here, as every peer of a byte-level run reads it; no checkpoint."""

    def __init__(self, spec: SignedRunSpec) -> None:
        self.spec = spec
        self._data: CorpusData | None = None

    async def training_data(self) -> CorpusData:
        if self._data is None:
            seq_len, seed = self.spec.spec.model.seq_len, run_seed(self.spec.run_id)
            self._data = CorpusData(*train_eval_split(load_corpus(self.spec.spec.corpus), seq_len, seed))
        return self._data

    async def initial_slice(self, stage: int, lo: int, hi: int) -> None:
        return None

    def tokenizer_file(self) -> None:
        return None


class Roles:
    """No measurements: no plan (the provisional assignment), the next live peer as standby."""

    def __init__(self, swarm: Swarm, own: str) -> None:
        self.swarm, self.own = swarm, own
        self.plan: PlanRecord | None = None

    def score_of(self, peer: str) -> float:
        return 0.0

    def link_Bps(self, a: str, b: str) -> float:
        return self.swarm.link_Bps

    def plan_record(self) -> PlanRecord | None:
        return self.plan

    def standby_for(self, own: str) -> str | None:
        others = sorted(p for p in self.swarm.live if p != own)
        return others[0] if others else None


@dataclass
class Member:
    identity: Identity
    trainer: Trainer
    task: asyncio.Task[None] | None = None
    alive: bool = True
    sent: dict[str, int] = field(default_factory=dict)


class Swarm:
    def __init__(
        self,
        folder: Path,
        peers: int,
        spec_changes: dict[str, Any] | None = None,
        link_Bps: float = 0.0,
        identities: list[Identity] | None = None,
    ) -> None:
        """``identities``: the peers' keys, the first the run's creator (the same keys and spec
        make the same run ID, so the same weights and data order: a paired comparison)."""
        body = {**DEFAULT_RUN, **(spec_changes or {})}
        keys = identities or [Identity.generate() for _ in range(peers)]
        if len(keys) != peers:
            raise ValueError(f"{len(keys)} identities for {peers} peers")
        self.spec: SignedRunSpec = sign_run_spec(keys[0], parse_spec_body(body))
        self.dht = MemoryDHT(self.spec.run_id)
        self.link_Bps = link_Bps
        self.members: dict[str, Member] = {}
        for i, identity in enumerate(keys):
            self._add(identity, folder / f"p{i}")

    def _add(self, identity: Identity, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        own = identity.peer_id

        def send(peer: str, request: Request[Any], blobs: list[bytes], timeout_s: float) -> Any:
            return self.send(own, peer, request, blobs)

        members = lambda: self._members_of(own)  # noqa: E731
        inputs = CorpusInputs(self.spec)
        trainer = Trainer(self.spec, identity, self.dht, folder, members, Roles(self, own), send, inputs)  # type: ignore[arg-type]
        self.members[own] = Member(identity, trainer)

    @property
    def live(self) -> set[str]:
        return {p for p, m in self.members.items() if m.alive}

    def _members_of(self, own: str) -> list[dict[str, Any]]:
        """Every other live peer's heartbeat summary: a paused one offers no work (no worker role)."""
        return [
            {"peer_id": p, "roles": ["paused"] if self.members[p].trainer.paused else ["worker"], "uptime_s": 1.0}
            for p in sorted(self.live)
            if p != own
        ]

    async def send(self, sender: str, peer: str, request: Request[Any], blobs: list[bytes]) -> tuple[Any, list[bytes]]:
        member = self.members.get(peer)
        if member is None or not member.alive or not self.members[sender].alive:
            raise Unreachable(f"{type(request).__name__} to {peer[:12]}: no such live peer")
        header, out = request.encode(blobs)
        decoded = type(request).decode(header, out)  # the receiver's schema check
        handler = member.trainer.handlers.table()[type(request)]
        try:
            answer, answer_blobs = await handler(sender, decoded, list(out))
        except Exception as e:
            code = getattr(e, "code", None)
            if code is None:
                raise
            raise refusal(code, getattr(e, "detail", str(e)), peer_id=peer, method=request.METHOD) from None
        name = type(request).__name__
        self.members[sender].sent[name] = self.members[sender].sent.get(name, 0) + 1
        header, answer_blobs = answer.encode(answer_blobs)
        return type(answer).decode(header, answer_blobs), answer_blobs

    async def _ticking(self, member: Member, period_s: float) -> None:
        while member.alive:
            try:
                await member.trainer.tick()
            except Exception as e:  # the daemon's loop logs and goes on; here the test must see it
                member.trainer.error = f"tick: {type(e).__name__}: {e}"
                logging.getLogger(__name__).exception("a trainer's round failed")
            await asyncio.sleep(period_s)

    def start(self, period_s: float = 0.2) -> None:
        for member in self.members.values():
            member.task = asyncio.create_task(self._ticking(member, period_s))

    async def kill(self, peer: str) -> None:
        """As a SIGKILL: it stops at once, answers nothing, and leaves the membership."""
        member = self.members[peer]
        member.alive = False
        if member.task is not None:
            member.task.cancel()
        for task in member.trainer.cell_tasks.values():
            task.cancel()
        for cell in member.trainer.cells.values():
            cell._stop.set()  # nothing of a killed peer runs on
            for task in cell._tasks:
                task.cancel()

    async def stop(self) -> None:
        for member in self.members.values():
            if member.alive:
                member.alive = False
                if member.task is not None:
                    member.task.cancel()
                await member.trainer.release()

    async def wait_for(self, what: str, condition: Any, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not condition():
            if time.monotonic() > deadline:
                states = {p[:8]: m.trainer.status() for p, m in self.members.items() if m.alive}
                raise AssertionError(f"{what} not within {timeout_s:.0f} s; trainers: {states}")
            await asyncio.sleep(0.05)

    def updates(self) -> int:
        return max((m.trainer.status()["updates"] for m in self.members.values() if m.alive), default=0)
