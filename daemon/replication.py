"""Stage checkpoints copied to a standby peer, so that a holder's departure loses no update.

The peer that trains a run's stages sends each new stage checkpoint (weights, AdamW moments,
version) to a standby: the live member with the longest uptime, the one most likely to stay.
It does so whenever its servers checkpoint and once more when it stops, before it releases
the stages. Whoever claims the stages next resumes from the newest copy it holds.

A receiver trusts nothing it is sent: the run must be its own, the sender must be the
stage's current lease holder (so nobody else can plant weights), the file must parse as a
parameter-server checkpoint of the stated version, and an older version never replaces a
newer one. The copy is written under a temporary name and renamed into place.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from pathlib import Path
from typing import Any

from swarmd.errors import SwarmdError
from swarmd.models.param_server import checkpoint_version, read_checkpoint_weights, stage_checkpoint_name
from swarmd.peers.stage_leases import resolve_holder
from swarmd.peers.stage_rpc import call
from swarmd.peers.swarm_dht import SwarmDHT

logger = logging.getLogger(__name__)

METHOD = "replicate_stage"
PUSH_TIMEOUT_S = 60.0


class StageReplicator:
    def __init__(self, run_id: str, stages: int, checkpoint_dir: Path, dht: SwarmDHT) -> None:
        self.run_id = run_id
        self.stages = stages
        self.checkpoint_dir = checkpoint_dir
        self.dht = dht
        self.p2p: Any = None  # set once the daemon's P2P replica exists
        self.received = 0
        self.refused = 0

    # --- receiving (an RPC handler) ------------------------------------------------------

    async def handle(
        self, sender: str, header: dict[str, Any], blobs: list[bytes]
    ) -> tuple[dict[str, Any], list[bytes]]:
        run_id, stage, version = header.get("run_id"), header.get("stage"), header.get("version")
        if run_id != self.run_id or type(stage) is not int or not 0 <= stage < self.stages:
            self.refused += 1
            raise SwarmdError(f"not a stage of run {self.run_id}: run {str(run_id)[:60]!r}, stage {stage!r}")
        if type(version) is not int or version < 0 or len(blobs) != 1:
            self.refused += 1
            raise SwarmdError("a stage checkpoint needs a version and exactly one file")
        now = time.time()
        holder = resolve_holder(await self.dht.scan_leases(stage, now), now)
        if holder is None or holder.peer_id != sender:
            self.refused += 1
            raise SwarmdError(f"{sender} does not hold stage {stage} of run {self.run_id}; refusing its weights")
        stored = await asyncio.to_thread(self._store, stage, version, blobs[0])
        self.received += 1
        return {"stored_version": stored}, []

    def _store(self, stage: int, version: int, data: bytes) -> int:
        self.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        final = self.checkpoint_dir / stage_checkpoint_name(stage)
        current = checkpoint_version(final)
        if current is not None and current >= version:
            return current  # never replace a newer copy with an older one
        tmp = final.with_name(f".{final.name}.{os.getpid()}.incoming")
        try:
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            found, _ = read_checkpoint_weights(tmp)  # raises on anything but a server checkpoint
            if found != version:
                raise SwarmdError(f"checkpoint says version {found}, the request {version}")
            os.replace(tmp, final)
        finally:
            tmp.unlink(missing_ok=True)
        logger.info("Stored stage %d of run %s at version %d (standby copy)", stage, self.run_id, version)
        return version

    # --- sending -------------------------------------------------------------------------

    async def push(self, standby: str, pushed: dict[int, int]) -> None:
        """Send every stage checkpoint newer than ``pushed`` (stage -> version) to ``standby``."""
        if self.p2p is None:
            return
        for stage in range(self.stages):
            path = self.checkpoint_dir / stage_checkpoint_name(stage)
            version = checkpoint_version(path)
            if version is None or version <= pushed.get(stage, -1):
                continue
            data = await asyncio.to_thread(path.read_bytes)
            args = {"run_id": self.run_id, "stage": stage, "version": version}
            await call(self.p2p, standby, METHOD, args, [data], timeout_s=PUSH_TIMEOUT_S)
            pushed[stage] = version
            logger.debug("Replicated stage %d version %d to %s", stage, version, standby)


def choose_standby(members: list[dict[str, Any]], own_peer_id: str) -> str | None:
    """The live member with the longest uptime (ties: lowest peer ID): the likeliest to stay."""
    others = [m for m in members if m["peer_id"] != own_peer_id]
    if not others:
        return None
    return str(min(others, key=lambda m: (-m["uptime_s"], m["peer_id"]))["peer_id"])
