"""daemon/training/trainer.py's pause and resume, in the in-process swarm (swarm_in_process.py):
a paused peer hands its cells and shards back and the others train on with no committed update
lost and no micro-batch skipped; resumed, it takes work again."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from tests.unit.training.swarm_in_process import Swarm

pytestmark = pytest.mark.timeout(240)


def holdings(swarm: Swarm, peer: str) -> tuple[int, int]:
    trainer = swarm.members[peer].trainer
    return len(trainer.cells), len(trainer.servers)


def test_a_paused_peer_hands_its_work_back_and_takes_it_again_on_resume(tmp_path: Path) -> None:
    async def scenario(swarm: Swarm) -> dict[str, Any]:
        await swarm.wait_for("5 updates", lambda: swarm.updates() >= 5, 180)
        pausing = next(p for p in swarm.members if swarm.members[p].trainer.servers)
        other = next(p for p in swarm.members if p != pausing)
        versions = {k: s.version for m in swarm.members.values() for k, s in m.trainer.servers.items()}
        cursor = next(m.trainer.status()["ledger"] for m in swarm.members.values() if m.trainer.status()["ledger"])
        await swarm.members[pausing].trainer.pause()
        paused = holdings(swarm, pausing)
        # The other peer takes every cell and shard, each shard at no lower version.
        await swarm.wait_for("the other peer to hold everything", lambda: holdings(swarm, other) == (2, 2), 120)
        taken = {k: s.version for k, s in swarm.members[other].trainer.servers.items()}
        at = swarm.updates()
        await swarm.wait_for("training to go on without it", lambda: swarm.updates() >= at + 3, 120)
        swarm.members[pausing].trainer.resume()
        await swarm.wait_for("the resumed peer to work again", lambda: holdings(swarm, pausing)[0] >= 1, 120)
        at = swarm.updates()
        await swarm.wait_for("training to go on with it", lambda: swarm.updates() >= at + 3, 120)
        status = swarm.members[pausing].trainer.status()
        ledger = next(m.trainer.status()["ledger"] for m in swarm.members.values() if m.trainer.status()["ledger"])
        return dict(versions=versions, taken=taken, paused=paused, status=status, ledger=ledger, cursor=cursor)

    async def main() -> dict[str, Any]:
        swarm = Swarm(tmp_path, 2)
        swarm.start()
        try:
            return await scenario(swarm)
        finally:
            await swarm.stop()

    out = asyncio.run(main())
    assert out["paused"] == (0, 0)  # everything handed back at once
    assert all(out["taken"][k] >= v for k, v in out["versions"].items()), out  # no committed update lost
    assert out["status"]["state"] == "training" and out["status"]["cells"], out["status"]
    # Nothing skipped: every micro-batch issued before the pause was trained in the end.
    assert out["ledger"]["done_below"] >= out["cursor"]["cursor"], out
