"""daemon/training/shards/opening.py, in the in-process swarm (swarm_in_process.py): a restarted daemon
never resumes from its own checkpoint file when that file cannot be trusted (truncated, NaN with
its checksum recomputed, another run's): the file is renamed aside, and the shard is taken from
the peer that kept it meanwhile, at no fewer updates than were committed, never left unhosted.

And ``ShardOpener`` alone, with fakes: a server opens on the state its sources believe (shard
(0, 0)'s with the ledger), under this peer's lineage and provenance, and logs its steps and
checkpoints at the standby the books name."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
import torch

from swarmd.models.checkpoint import load_safetensors, save_safetensors_atomic, tensors_digest
from swarmd.models.checkpoint_check import Provenance, ShardLayout, TracedShard
from swarmd.models.parameter_shard import ShardStep
from swarmd.models.shard_config import ShardConfig, ShardError
from swarmd.peers.taskpool.exchange import ExchangeConfig
from swarmd.peers.wire.messages import Ack, ReplicaCheckpoint, ReplicaLog
from swarmd.training.bookkeeping import Books
from swarmd.training.shards.opening import ShardOpener
from swarmd.training.shards.shard_sources import shard_file
from tests.unit.training.shards.test_shard_server import grid
from tests.unit.training.swarm_in_process import Member, Swarm

pytestmark = pytest.mark.timeout(240)

KEY = (1, 0)


def damage(path: Path, how: str) -> None:
    if how == "truncated":
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])
        return
    tensors, meta = load_safetensors(path)
    if how == "nan":  # the header intact and the checksum recomputed: only the finiteness check is left
        tensors["weights"] = torch.full_like(tensors["weights"], float("nan"))
    else:  # a file copied from another run's folder
        meta["caller.run"] = "tiny." + "f" * 24
    meta["digest"] = tensors_digest(tensors)
    save_safetensors_atomic(tensors, path, meta)


async def restart(swarm: Swarm, peer: str) -> Member:
    """The daemon started again: a fresh trainer with the same key and checkpoint folder."""
    old = swarm.members[peer]
    # Nothing of a killed process runs on: its tasks end before it comes back under its key
    # (a task whose cancel a wait_for swallowed would otherwise speak for it again).
    tasks = [t for cell in old.trainer.cells.values() for t in cell._tasks] + list(old.trainer.cell_tasks.values())
    while any(not t.done() for t in tasks):
        for t in tasks:
            t.cancel()
        await asyncio.wait(tasks, timeout=0.5)
    swarm._add(old.identity, old.trainer.checkpoint_dir)
    member = swarm.members[peer]
    member.task = asyncio.create_task(swarm._ticking(member, 0.2))
    return member


def served(swarm: Swarm) -> list[int]:
    """The versions shard KEY is served at (by every live peer that serves it)."""
    return [m.trainer.servers[KEY].version for m in swarm.members.values() if m.alive and KEY in m.trainer.servers]


@pytest.mark.parametrize("how", ["truncated", "nan", "another run"])
def test_a_bad_own_checkpoint_is_set_aside_and_the_shard_fetched_from_its_standby(tmp_path: Path, how: str) -> None:
    async def scenario(swarm: Swarm) -> tuple[int, int, Member, Path]:
        await swarm.wait_for("12 updates", lambda: swarm.updates() >= 12, 180)
        victim = next(p for p, m in swarm.members.items() if KEY in m.trainer.servers)
        trainer = swarm.members[victim].trainer
        path = shard_file(trainer.checkpoint_dir, KEY, trainer.servers[KEY].shards)
        await swarm.wait_for("a checkpoint on disk", path.is_file, 60)
        await swarm.kill(victim)
        committed = trainer.servers[KEY].version
        # The standby takes the shard over; the victim's file is damaged while it is down.
        await swarm.wait_for("the shard served again", lambda: bool(served(swarm)), 120)
        damage(path, how)
        member = await restart(swarm, victim)
        await swarm.wait_for("the bad file set aside", lambda: member.trainer.sources.set_aside > 0, 120)
        # The victim is named the shard's server again: it takes the state from the standby.
        await swarm.wait_for("the restarted peer serving the shard", lambda: KEY in member.trainer.servers, 120)
        return committed, member.trainer.servers[KEY].version, member, path

    async def main() -> tuple[int, int, Member, Path]:
        swarm = Swarm(tmp_path, 2)
        swarm.start()
        try:
            return await scenario(swarm)
        finally:
            await swarm.stop()

    committed, resumed, member, path = asyncio.run(main())
    assert resumed >= committed  # fetched from the peer that kept it, not the seed
    assert member.trainer.sources.set_aside == 1
    assert member.trainer.status()["checkpoints"]["set_aside"] == 1
    aside = [p.name for p in path.parent.iterdir() if p.name.startswith(f"{path.name}.bad-")]
    assert len(aside) == 1, sorted(p.name for p in path.parent.iterdir())


# --- ShardOpener with fakes -----------------------------------------------------------------------

RUN = "tiny." + "a" * 24
CONFIG = ShardConfig(mode="gradient", lr=1e-2, weight_decay=0.0)


@dataclass(frozen=True)
class Facts:
    checkpoint_dir: Path
    own: str = "12D3KooWme"
    run_id: str = RUN


@dataclass
class Pool:
    books: Books = field(default_factory=lambda: Books(own="12D3KooWme", shard_claims={(0, 0): 1000.0}))

    def exchange_settings(self) -> ExchangeConfig:
        return ExchangeConfig(batch_micro_batches=4, share_micro_batches=2)


@dataclass(frozen=True)
class Geometry:
    """Stage 0 has shards (0, 0) and (0, 1) of 8 parameters each."""

    def layout(self, key: tuple[int, int]) -> ShardLayout | None:
        return ShardLayout(RUN, 0, key[1], 2, (8 * key[1], 8 * key[1] + 8), "gradient") if key[0] == 0 else None

    def stage_size(self, stage: int) -> int:
        return 16


@dataclass
class Sources:
    """Has a state of every shard at ``version`` (None: none yet)."""

    version: int | None
    served: list[tuple[int, int]] = field(default_factory=list)

    async def believable_state(
        self, key: tuple[int, int], layout: ShardLayout, path: Path, step: int
    ) -> TracedShard | None:
        if self.version is None:
            return None
        lo, hi = layout.span
        return TracedShard(lo, hi, torch.zeros(hi - lo), CONFIG, step_micro_batches=step, version=self.version)

    def opened(self, key: tuple[int, int]) -> None:
        self.served.append(key)


@dataclass
class Standby:
    sent: list[tuple[str, Any, list[bytes]]] = field(default_factory=list)

    async def send(self, peer: str, request: Any, blobs: list[bytes], timeout_s: float) -> tuple[Any, list[bytes]]:
        self.sent.append((peer, request, blobs))
        return Ack(), []


def opener(tmp_path: Path, sources: Sources, standby: Standby, pool: Pool | None = None) -> ShardOpener:
    return ShardOpener(
        Facts(tmp_path),  # type: ignore[arg-type]
        pool or Pool(),
        Geometry(),  # type: ignore[arg-type]
        sources,  # type: ignore[arg-type]
        standby.send,
        lambda pipeline: None,
        lambda share, pipeline, now: "ticket",
    )


def test_a_server_opens_on_the_believable_state_and_shard_0_0_keeps_the_ledger(tmp_path: Path) -> None:
    sources, standby = Sources(version=5), Standby()
    o = opener(tmp_path, sources, standby)
    first = asyncio.run(o.open((0, 0), grid(1)))
    other = asyncio.run(o.open((0, 1), grid(1)))
    assert first is not None and other is not None and sources.served == [(0, 0), (0, 1)]
    assert first.ledger is not None and other.ledger is None
    server = first.server
    assert (server.version, server.shards, server.lineage) == (5, 2, "12D3KooWme@1000.000")
    assert server.checkpoint_path == shard_file(tmp_path, (0, 0), 2)
    assert server.ledger_state() == first.ledger.state()  # the ledger goes with every logged step
    assert server.shard.provenance == Provenance.of(Geometry().layout((0, 0)), "12D3KooWme")  # type: ignore[arg-type]


def test_no_server_opens_without_a_believable_state_or_outside_the_assignment(tmp_path: Path) -> None:
    sources = Sources(version=None)
    o = opener(tmp_path, sources, Standby())
    assert asyncio.run(o.open((0, 0), grid(1))) is None and sources.served == []
    with pytest.raises(ShardError, match="no shard"):
        asyncio.run(o.open((3, 0), grid(1)))


def test_a_servers_steps_and_checkpoints_go_to_the_standby_under_its_lineage(tmp_path: Path) -> None:
    standby, pool = Standby(), Pool()
    opened = asyncio.run(opener(tmp_path, Sources(version=5), standby, pool).open((0, 1), grid(1)))
    assert opened is not None
    server = opened.server
    step = ShardStep(version=6, delta=torch.zeros(8, dtype=torch.float16), share_ids=(3,), micro_batches=2)
    # What the server calls after each step and every few steps (``ShardServer``'s log_step and send_checkpoint).
    assert asyncio.run(server.standby.log_step(step, "")) is False and standby.sent == []  # no standby yet
    pool.books = replace(pool.books, standby="12D3KooWstandby")
    assert asyncio.run(server.standby.log_step(step, "")) is True
    assert asyncio.run(server.standby.send_checkpoint(6, b"state")) is True
    (peer, log, _), (_, checkpoint, blobs) = standby.sent
    assert peer == "12D3KooWstandby" and isinstance(log, ReplicaLog) and isinstance(checkpoint, ReplicaCheckpoint)
    assert (log.stage, log.shard, log.version, log.share_ids, log.lineage) == (0, 1, 6, [3], server.lineage)
    assert (checkpoint.version, checkpoint.lineage, blobs) == (6, server.lineage, [b"state"])
