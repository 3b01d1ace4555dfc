"""Stage checkpoints copied to a standby peer, so that a holder's departure loses no update.

The peer that trains a run's stages sends each new stage checkpoint (weights, AdamW moments,
version) to a standby: the live member most likely to stay, on a fast link from the holder
(``swarmd.peers.election.elect_standby``).
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
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from swarmd.errors import SwarmdError
from swarmd.models.param_server import (
    checkpoint_log_seq,
    checkpoint_version,
    read_checkpoint_weights,
    stage_checkpoint_name,
)
from swarmd.peers.election import elect_standby
from swarmd.peers.op_times import OpTimes
from swarmd.peers.stage_leases import resolve_holder
from swarmd.peers.wire.rpc import Answer, call
from swarmd.push_log import PushLog, check_meta

if TYPE_CHECKING:  # hivemind loads only where the DHT runs (it cannot share a process with py-libp2p)
    from swarmd.peers.swarm_dht import SwarmDHT

logger = logging.getLogger(__name__)

METHOD = "replicate_stage"
LOG_METHOD = "stage_log"
FETCH_METHOD = "stage_checkpoint"
HOLDER_CACHE_S = 5.0
LOG_ENTRIES_PER_ANSWER = 16
PUSH_TIMEOUT_S = 60.0
ASK_TIMEOUT_S = 5.0


class StageReplicator:
    def __init__(self, run_id: str, stages: int, checkpoint_dir: Path, dht: SwarmDHT) -> None:
        self._holder_checked: dict[tuple[int, str], float] = {}
        self.logged = 0
        self.run_id = run_id
        self.stages = stages
        self.checkpoint_dir = checkpoint_dir
        self.dht = dht
        self.p2p: Any = None  # set once the daemon's P2P replica exists
        self.received = 0
        self.refused = 0
        self.holder_of: Callable[[int], str | None] = lambda stage: None
        """Who holds a stage as the trainer's last round of lease scans saw it (set by the daemon)."""
        self.log_phases = OpTimes()  # logging a host's push here: checking its lease, writing it

    # --- receiving (an RPC handler) ------------------------------------------------------

    async def handle(self, sender: str, header: dict[str, Any], blobs: list[bytes]) -> Answer:
        run_id, stage, version = header.get("run_id"), header.get("stage"), header.get("version")
        if run_id != self.run_id or type(stage) is not int or not 0 <= stage < self.stages:
            self.refused += 1
            raise SwarmdError(f"not a stage of run {self.run_id}: run {str(run_id)[:60]!r}, stage {stage!r}")
        if type(version) is not int or version < 0 or len(blobs) != 1:
            self.refused += 1
            raise SwarmdError("a stage checkpoint needs a version and exactly one file")
        await self._check_holder(stage, sender)
        stored = await asyncio.to_thread(self._store, stage, version, blobs[0])
        self.received += 1
        return {"stored_version": stored}, []

    async def _check_holder(self, stage: int, sender: str) -> None:
        """Only the stage's lease holder may plant its state here: as the trainer's last lease
        scan saw it, else checked in the DHT (a holder newer than that scan); cached briefly.
        A push waits for its log here, so the common case must not wait for a DHT lookup."""
        now = time.time()
        if now - self._holder_checked.get((stage, sender), 0.0) < HOLDER_CACHE_S:
            return
        if self.holder_of(stage) == sender:
            self._holder_checked[(stage, sender)] = now
            return
        holder = resolve_holder(await self.dht.scan_leases(stage, now), now)
        if holder is None or holder.peer_id != sender:
            self.refused += 1
            raise SwarmdError(f"{sender} does not hold stage {stage} of run {self.run_id}; refusing its weights")
        self._holder_checked[(stage, sender)] = now

    async def handle_log(self, sender: str, header: dict[str, Any], blobs: list[bytes]) -> Answer:
        """A host's push, logged here before it applies it (we are its standby)."""
        run_id, stage, seq, meta = header.get("run_id"), header.get("stage"), header.get("seq"), header.get("meta")
        if run_id != self.run_id or type(stage) is not int or not 0 <= stage < self.stages:
            self.refused += 1
            raise SwarmdError(f"not a stage of run {self.run_id}: run {str(run_id)[:60]!r}, stage {stage!r}")
        if type(seq) is not int or seq < 1 or not isinstance(meta, dict) or len(blobs) != 1:
            self.refused += 1
            raise SwarmdError("a push log entry needs a sequence number, its metadata and one gradient blob")
        started = time.perf_counter()
        await self._check_holder(stage, sender)
        checked = time.perf_counter()
        lineage = f"{sender}:{header.get('lineage')!s:.64}"
        await asyncio.to_thread(PushLog(self.checkpoint_dir, stage).append, seq, meta, blobs[0], lineage)
        self.log_phases.add("check_holder", checked - started)
        self.log_phases.add("append", time.perf_counter() - checked)
        self.logged += 1
        return {}, []

    def _store(self, stage: int, version: int, data: bytes, replace_equal: bool = False) -> int:
        self.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        final = self.checkpoint_dir / stage_checkpoint_name(stage)
        current = checkpoint_version(final)
        if current is not None and (current > version or current == version and not replace_equal):
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
        PushLog(self.checkpoint_dir, stage).prune(checkpoint_log_seq(final))
        logger.info("Stored stage %d of run %s at version %d (standby copy)", stage, self.run_id, version)
        return version

    async def serve_checkpoint(self, sender: str, header: dict[str, Any], blobs: list[bytes]) -> Answer:
        """``op=version``: the version of our copy of a stage; ``op=fetch``: the file itself.
        A public run's weights are no secret: any peer that asks may have them."""
        stage, op = header.get("stage"), header.get("op")
        if header.get("run_id") != self.run_id or type(stage) is not int or not 0 <= stage < self.stages:
            raise SwarmdError(f"not a stage of run {self.run_id}: stage {stage!r}")
        path = self.checkpoint_dir / stage_checkpoint_name(stage)
        if op == "log":
            after = header.get("after")
            if type(after) is not int or after < 0:
                raise SwarmdError("op log needs after >= 0")
            entries = await asyncio.to_thread(PushLog(self.checkpoint_dir, stage).entries_after, after,
                                              LOG_ENTRIES_PER_ANSWER)  # fmt: skip
            return {"entries": [[n, meta] for n, meta, _ in entries]}, [blob for _, _, blob in entries]
        version = await asyncio.to_thread(checkpoint_version, path)
        if op == "version" or version is None:
            return {"version": version}, []
        if op != "fetch":
            raise SwarmdError(f"unknown checkpoint op {str(op)[:20]!r}")
        return {"version": version}, [await asyncio.to_thread(path.read_bytes)]

    async def fetch_newest(self, stage: int, candidates: list[str], previous: str | None = None) -> int | None:
        """Make our copy of ``stage`` the newest any of ``candidates`` holds; returns its version.

        Called before hosting a stage, so that a new host resumes where the last one stopped
        (the previous holder and the standby are among the candidates). The ``previous``
        holder's copy wins at an equal version too: written as it handed the stage over, it
        has the leases it carried for the next host (``GradientLedger``), which a copy made
        earlier at the same version lacks."""
        path = self.checkpoint_dir / stage_checkpoint_name(stage)
        own = await asyncio.to_thread(checkpoint_version, path)
        if self.p2p is None or not candidates:
            return own
        args = {"run_id": self.run_id, "stage": stage}

        async def ask(peer: str) -> tuple[int, str]:
            answer, _ = await call(self.p2p, peer, FETCH_METHOD, {**args, "op": "version"}, timeout_s=ASK_TIMEOUT_S)
            version = answer.get("version")
            return (version if type(version) is int else -1), peer

        found = await asyncio.gather(*(ask(p) for p in candidates), return_exceptions=True)
        offers = sorted(
            (v, p == previous, p)
            for v, p in (f for f in found if isinstance(f, tuple))
            if v > (own or 0) or (p == previous and v >= 0 and v == own)
        )
        for version, from_previous, peer in reversed(offers):  # the newest first; the next if it fails
            try:
                answer, blobs = await call(self.p2p, peer, FETCH_METHOD, {**args, "op": "fetch"},
                                           timeout_s=PUSH_TIMEOUT_S)  # fmt: skip
                if len(blobs) == 1 and answer.get("version") == version:
                    stored = await asyncio.to_thread(self._store, stage, version, blobs[0], from_previous)
                    logger.info("Fetched stage %d at version %d from %s", stage, stored, peer)
                    return stored
            except SwarmdError as e:
                logger.warning("Could not fetch stage %d from %s (%s); trying the next copy", stage, peer, e)
        return own

    async def fetch_log(self, stage: int, after: int, candidates: list[str]) -> list[tuple[int, dict[str, Any], bytes]]:
        """The longest contiguous run of logged pushes numbered after ``after``, here or at a candidate."""
        best = await asyncio.to_thread(PushLog(self.checkpoint_dir, stage).entries_after, after, 1 << 20)
        for peer in candidates if self.p2p is not None else []:
            found: list[tuple[int, dict[str, Any], bytes]] = []
            try:
                while True:
                    args = {"run_id": self.run_id, "stage": stage, "op": "log", "after": after + len(found)}
                    answer, blobs = await call(self.p2p, peer, FETCH_METHOD, args, timeout_s=PUSH_TIMEOUT_S)
                    entries = answer.get("entries")
                    if not isinstance(entries, list) or len(entries) != len(blobs) or not entries:
                        break
                    for (n, meta), blob in zip(entries, blobs, strict=True):
                        if n != after + len(found) + 1:
                            break
                        found.append((n, check_meta(meta), blob))
                    if len(entries) < LOG_ENTRIES_PER_ANSWER:
                        break
            except (SwarmdError, TypeError, ValueError) as e:
                logger.debug("No push log of stage %d from %s: %s", stage, peer, e)
            if len(found) > len(best):
                best = found
        return best

    # --- sending -------------------------------------------------------------------------

    async def push(self, standby: str, pushed: dict[int, int], stages: list[int]) -> None:
        """Send each of ``stages``' checkpoints newer than ``pushed`` (stage -> version) to ``standby``."""
        if self.p2p is None:
            return
        for stage in stages:
            path = self.checkpoint_dir / stage_checkpoint_name(stage)
            version = checkpoint_version(path)
            if version is None or version <= pushed.get(stage, -1):
                continue
            data = await asyncio.to_thread(path.read_bytes)
            args = {"run_id": self.run_id, "stage": stage, "version": version}
            await call(self.p2p, standby, METHOD, args, [data], timeout_s=PUSH_TIMEOUT_S)
            pushed[stage] = version
            logger.debug("Replicated stage %d version %d to %s", stage, version, standby)


def choose_standby(
    members: list[dict[str, Any]], own_peer_id: str, score: Callable[[str], float] = lambda p: 0.0,
    link_Bps: Callable[[str, str], float] = lambda a, b: 0.0,
) -> str | None:  # fmt: skip
    """The live member (other than us) likeliest to stay, on the best link from us among the
    equally reliable (``swarmd.peers.election.elect_standby``)."""
    return elect_standby(
        (str(m["peer_id"]), score(m["peer_id"]), float(m["uptime_s"]), link_Bps(own_peer_id, m["peer_id"]))
        for m in members if m["peer_id"] != own_peer_id
    )  # fmt: skip


def standby_of(
    members: list[dict[str, Any]], own_peer_id: str, holder: str, score: Callable[[str], float],
    own_uptime_s: float = 0.0, link_Bps: Callable[[str, str], float] = lambda a, b: 0.0,
) -> str | None:  # fmt: skip
    """The standby that ``holder`` picks by ``choose_standby``, as any other peer computes it:
    among the members seen from here plus ourselves (our own member list leaves us out; our
    uptime is the one our heartbeats tell the others)."""
    everyone = [*members, {"peer_id": own_peer_id, "uptime_s": own_uptime_s}]
    return choose_standby([m for m in everyone if m["peer_id"] != holder], holder, score, link_Bps)
