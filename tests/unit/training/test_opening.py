"""daemon/training/opening.py, in the in-process swarm (swarm_in_process.py): a restarted daemon
never resumes from its own checkpoint file when that file cannot be trusted (truncated, NaN with
its checksum recomputed, another run's): the file is renamed aside, and the shard is taken from
the peer that kept it meanwhile, at no fewer updates than were committed, never left unhosted."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch

from swarmd.models.checkpoint import load_safetensors, save_safetensors_atomic, tensors_digest
from swarmd.training.opening import shard_file
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
        await swarm.wait_for("the bad file set aside", lambda: member.trainer.opener.set_aside > 0, 120)
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
    assert member.trainer.opener.set_aside == 1
    assert member.trainer.status()["checkpoints"]["set_aside"] == 1
    aside = [p.name for p in path.parent.iterdir() if p.name.startswith(f"{path.name}.bad-")]
    assert len(aside) == 1, sorted(p.name for p in path.parent.iterdir())
