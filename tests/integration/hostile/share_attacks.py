"""Mallory on the share ledger (issue 26): contributions for work no one assigned it.

Found by attacking real daemons before shares carried the ledger's tickets: a contribution
naming share IDs no one issued, claiming 4 x 1024 micro-batches, was applied as a whole step
(held-out loss 2.57 against 2.21), and one naming the next 1,023 share IDs settled them at the
server, so every honest contribution for them was a duplicate (updates 13 -> 0 a minute). Each
attack returns ``{step: outcome}`` (``mallory.summary``); every one must be refused with a code.
"""

from __future__ import annotations

import argparse
import time
from typing import TYPE_CHECKING, Any

from swarmd.peers.taskpool.tickets import ShareTicket
from tests.integration.hostile import forgery
from tests.integration.hostile.wire_attacks import FAKE_SHARE, _whole_slice, contribution, shard_holder, to_holder

if TYPE_CHECKING:
    from tests.integration.hostile.mallory import Mallory, Outcome

SQUAT = 1023
"""The share IDs after the newest one issued that the squat names (one applied ID with them)."""
CLAIMED = 4 * 1024
"""The micro-batches the made-up contribution claims (a share holds a few)."""


def _ticket(mallory: Mallory, share_id: int, pipeline: int) -> bytes:
    """A ticket Mallory signs itself: the ledger's form, not its keeper's key."""
    fields = dict(share_id=share_id, first=share_id * 1024, count=1024, pipeline=pipeline)
    return ShareTicket.sign(mallory.identity, mallory.run_id, **fields, now=time.time()).pack()


async def shares(mallory: Mallory, swarm: dict[str, Any], args: argparse.Namespace) -> dict[str, Outcome]:
    """At every stage's shard server: made-up share IDs with 4 x 1024 micro-batches, the same
    with tickets Mallory signed, and a squat of the next 1,023 IDs (with one already applied)."""
    steps: dict[str, Outcome] = {}
    newest = max((c.get("share") or 0 for p in swarm["peers"] for c in p["cells"]), default=0)
    pipeline = next((p for p, _ in swarm.get("mallory_cells") or []), 0)
    for stage in range(swarm["stages"]):
        server, shard = shard_holder(swarm, stage)
        _, n, version = await _whole_slice(mallory, server, shard)
        blob = forgery.frame(forgery.vector(n, 1.0e-3))
        made_up = FAKE_SHARE + 7000 + stage
        request = contribution(mallory, shard, version, [made_up], micro_batches=CLAIMED)
        steps[f"made_up_work_stage_{stage}"] = await to_holder(
            mallory, swarm, server, request.encode([blob])[0], [blob]
        )
        tickets = _ticket(mallory, made_up, pipeline)
        request = contribution(mallory, shard, version, [made_up], micro_batches=CLAIMED, tickets=1)
        header = request.encode([blob, tickets])[0]
        steps[f"self_ticketed_stage_{stage}"] = await to_holder(mallory, swarm, server, header, [blob, tickets])
        squat = [max(0, newest - 8), *range(newest + 1, newest + 1 + SQUAT)]
        tickets = b"".join(_ticket(mallory, i, pipeline) for i in squat)
        request = contribution(mallory, shard, version, squat, micro_batches=len(squat), tickets=len(squat))
        header = request.encode([blob, tickets])[0]
        steps[f"squat_next_{SQUAT}_stage_{stage}"] = await to_holder(mallory, swarm, server, header, [blob, tickets])
    return steps
