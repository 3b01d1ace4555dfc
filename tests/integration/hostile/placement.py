"""Where the swarm's cells and shards are now, as Mallory reads it from the DHT itself.

The test's description of the swarm (``harness.describe``) is a snapshot of the daemons'
status, taken before Mallory joined; a member joining makes the coordinator plan again, and
an attack aimed by the snapshot then meets NOT_HOLDER or a new epoch instead of the checks it
is meant to reach. So right before each attack Mallory reads the plan in force (the honest
coordinator's, highest version), the cell and shard leases (``SwarmDHT.scan_cell``,
``scan_shards``), resolves them by the pool's rules as a daemon would, and rewrites the
description's ``peers`` with the holders, epochs, versions and standbys found there.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from swarmd.peers.records.plan_parts import KIND as PLAN_KIND
from swarmd.peers.taskpool.assignment import Assignment, from_plan
from swarmd.peers.taskpool.cells import pipeline_epoch, resolve_cells
from swarmd.peers.taskpool.servers import resolve_shards

if TYPE_CHECKING:
    from tests.integration.hostile.mallory import Mallory


async def assignment_in_force(mallory: Mallory, swarm: dict[str, Any]) -> Assignment | None:
    """The assignment of the newest plan an honest peer of ``swarm`` signed (Mallory's own
    forged plans are not followed by anyone; the daemons' status says so), or None."""
    honest = {p["peer_id"] for p in swarm["peers"]}
    plans = [p for p in await mallory.swarm_dht.scan_peer_records(PLAN_KIND, None) if p.peer_id in honest]
    if not plans:
        return None
    batch = swarm["batch_micro_batches"]
    return from_plan(max(plans, key=lambda p: p.version), swarm["stages"], batch)


async def refresh(mallory: Mallory, swarm: dict[str, Any]) -> dict[str, Any]:
    """``swarm`` with its peers' ``cells``, ``shards``, ``ledger`` and ``replicas`` as the DHT
    has them now, plus ``plan_version`` and ``mallory_cells`` (the cells the plan names Mallory
    for, or that it holds as a spare). Unchanged but for ``plan_version = None`` when no
    honest plan can be read (the daemons then run a provisional assignment)."""
    a = await assignment_in_force(mallory, swarm)
    if a is None:
        return {**swarm, "plan_version": None, "mallory_cells": [], "from_leases": "no plan read"}
    now = time.time()
    me = mallory.identity.peer_id
    live = {p["peer_id"] for p in swarm["peers"]} | ({me} if mallory.member else set())
    named_cells = a.named_cells()
    cell_leases = [lease for p, s in named_cells for lease in await mallory.swarm_dht.scan_cell(p, s, now)]
    cells = resolve_cells(cell_leases, named_cells, live, now)
    shard_leases = [lease for s in range(a.stages) for lease, _ in await mallory.swarm_dht.scan_shards(s, now)]
    shards = resolve_shards(shard_leases, a.named_shards(), a.shard_counts(), live, now)
    shares = {(c["pipeline"], c["stage"]): c.get("share") for p in swarm["peers"] for c in p["cells"]}
    # A pipeline with a cell no lease settles (one being renewed or taken over) keeps the
    # snapshot's epoch: the attack is then refused EPOCH, which its answer shows.
    epochs = {(c["pipeline"], c["stage"]): c.get("epoch") for p in swarm["peers"] for c in p["cells"]}
    peers = []
    for peer in swarm["peers"]:
        pid = peer["peer_id"]
        held = sorted(cell for cell, lease in cells.items() if lease.peer_id == pid)
        peers.append(
            {
                **peer,
                "cells": [
                    {
                        "pipeline": p,
                        "stage": s,
                        "epoch": pipeline_epoch(p, [_holder(cells, (p, t)) for t in range(a.stages)])
                        or epochs.get((p, s))
                        or "",
                        "share": shares.get((p, s)),
                    }
                    for p, s in held
                ],
                "shards": [
                    {"stage": s, "shard": k, "shards": lease.shards, "version": lease.version}
                    for (s, k), lease in sorted(shards.items())
                    if lease.peer_id == pid
                ],
                "ledger": (0, 0) in shards and shards[(0, 0)].peer_id == pid,  # the ledger lives with shard (0, 0)
                "replicas": [f"{s}/{k}" for (s, k), lease in sorted(shards.items()) if lease.standby == pid],
            }
        )
    _keep_unplaced(peers, swarm["peers"], a.stages)
    mine = sorted(set(a.cells_of(me)) | {cell for cell, lease in cells.items() if lease.peer_id == me})
    return {
        **swarm,
        "peers": peers,
        "plan_version": a.version,
        "mallory_cells": [list(c) for c in mine],
        "from_leases": f"{len(cells)} of {len(named_cells)} cells, {len(shards)} of {len(a.named_shards())} shards",
    }


def _keep_unplaced(peers: list[dict[str, Any]], before: list[dict[str, Any]], stages: int) -> None:
    """A stage whose cells or shards no lease places yet (a re-plan in progress) keeps what
    the snapshot said of it, so that every attack still has a target; its answer then says
    whether the target moved."""
    for what in ("cells", "shards"):
        placed = {item["stage"] for peer in peers for item in peer[what]}
        for stage in set(range(stages)) - placed:
            for new, old in zip(peers, before, strict=True):
                new[what] = new[what] + [item for item in old[what] if item["stage"] == stage]


def _holder(cells: dict[tuple[int, int], Any], cell: tuple[int, int]) -> str | None:
    lease = cells.get(cell)
    return lease.peer_id if lease is not None else None
