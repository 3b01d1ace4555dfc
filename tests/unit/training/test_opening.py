"""daemon/training/opening.py, in the in-process swarm (swarm_in_process.py): a restarted daemon
never resumes from its own checkpoint file when that file cannot be trusted (truncated, NaN with
its checksum recomputed, another run's): the file is renamed aside, and the shard is taken from
the peer that kept it meanwhile, at no fewer updates than were committed, never left unhosted."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from swarmd.models.checkpoint import load_safetensors, save_safetensors_atomic, tensors_digest
from swarmd.training.opening import OPEN_GRACE_S, ShardOpener, StillServed, shard_file
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


LAYOUT = SimpleNamespace(span=(0, 8))


class _Seen:
    def __init__(self, seen: int) -> None:
        self.seen = seen

    def of(self, key: tuple[int, int]) -> int:
        return self.seen

    def admits(self, key: tuple[int, int], version: int) -> bool:
        return True


def _opener_between(answers: dict[str, object], seen: int) -> ShardOpener:
    """An opener whose sources answer as ``answers`` says: a version (its state) or an
    exception (raised by the fetch)."""
    trainer = SimpleNamespace(replicas=SimpleNamespace(newest=lambda key: None, rules=None), seen=_Seen(seen))
    opener = ShardOpener(trainer)  # type: ignore[arg-type]

    async def fetch(key: object, peer: str, layout: object, step: int) -> object:
        answer = answers[peer]
        if isinstance(answer, Exception):
            raise answer
        return SimpleNamespace(version=answer)

    opener._sources = lambda key: list(answers)  # type: ignore[method-assign]
    opener._fetch = fetch  # type: ignore[method-assign]
    opener._own_checkpoint = lambda path, layout, step: None  # type: ignore[method-assign]
    return opener


def test_a_shard_is_not_opened_from_a_standby_while_its_holder_still_serves_it(tmp_path: Path) -> None:
    """The failure this guards against (four daemons on loaded cores): the assignment moved shard
    (0, 0) while its holder still followed the older one; the new holder took the standby's
    replica at version 13 while the holder committed 14, and the version went back."""
    still = StillServed(14)  # the holder's answer: kind "serving"
    opener = _opener_between({"holder": still, "standby": 13}, seen=13)
    waiting = asyncio.run(opener._believable_state((0, 0), LAYOUT, tmp_path / "f", 1))  # type: ignore[arg-type]
    assert waiting is None  # waits for the holder to hand its state over
    # Once it follows the same assignment it closes and hands its state over: that is opened.
    opener = _opener_between({"holder": 14, "standby": 13}, seen=13)
    found = asyncio.run(opener._believable_state((0, 0), LAYOUT, tmp_path / "f", 1))  # type: ignore[arg-type]
    assert found is not None and found.version == 14
    # A holder that never lets go does not hold the shard up past the grace: the best is opened.
    opener = _opener_between({"holder": still, "standby": 13}, seen=13)
    opener._waiting_since[(0, 0)] = time.monotonic() - OPEN_GRACE_S - 1
    found = asyncio.run(opener._believable_state((0, 0), LAYOUT, tmp_path / "f", 1))  # type: ignore[arg-type]
    assert found is not None and found.version == 13
