"""This peer's presence in its run: the heartbeat it publishes, and whom it sees in return.

A heartbeat says who this peer is, where it listens, what it offers (device, the TFLOPS its
probe achieved at the run's shapes, free memory, precision) and what it does (roles); it is
re-signed every ``[heartbeat] interval_s`` to live ``ttl_s``. The membership scan reads
everyone else's, and a round-trip probe times each member's DHT node.
On shutdown a last, "leaving" heartbeat tells the others at once instead of at expiry.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from swarmd import __version__
from swarmd.config import ComputeConfig, HeartbeatConfig, LimitsConfig
from swarmd.node.device_offer import DeviceOffer
from swarmd.node.lan_service import LanService
from swarmd.node.services import dht_call
from swarmd.peers.dht.swarm_dht import SwarmDHT
from swarmd.peers.membership.members import Membership
from swarmd.peers.membership.probes import MAX_PROBES_PER_ROUND, probe_batch
from swarmd.peers.membership.versions import newer_in_swarm
from swarmd.peers.records.heartbeat import MAX_ADDRS, Heartbeat, HeldOut
from swarmd.peers.records.identity import Identity
from swarmd.system import systemd

if TYPE_CHECKING:
    from swarmd.peers.records.run_spec import RunSpec

logger = logging.getLogger(__name__)

# How long the last ("leaving") heartbeat may take to reach the DHT during shutdown.
LEAVE_ANNOUNCE_TIMEOUT_S = 3.0
LEAVING_RECORD_TTL_S = 30.0
RTT_PROBE_TIMEOUT_S = 2.0
MEMBERSHIP_SCAN_S = 5.0


class Presence:
    """What this peer announces of itself in the DHT, and the membership it reads back."""

    def __init__(
        self,
        run_id: str,
        identity: Identity,
        dht: SwarmDHT,
        membership: Membership,
        lan: LanService,
        heartbeat: HeartbeatConfig,
        roles: Callable[[], list[str]],
        started_at: float,
    ) -> None:
        """``roles()``: what this peer does now (it changes as the trainer takes shards)."""
        self.run_id, self.identity, self.dht, self.membership = run_id, identity, dht, membership
        self.lan, self.heartbeat, self.roles, self.started_at = lan, heartbeat, roles, started_at
        self.offering = DeviceOffer()
        """The device, what its probe measured, and the speed the planner may count on."""
        self.addrs: list[str] = []  # the DHT's visible multiaddrs, refreshed with each heartbeat
        self.rejected_records = 0
        self._last_expires_at = 0.0  # of the last heartbeat published: a later one must outlive it
        self._probed_at: dict[str, float] = {}  # member -> when it was last pinged
        self.holds: Callable[[], list[str]] = list
        """Which of the run's files this peer serves (``Heartbeat.holds``), once it has a data store."""
        self.held_out: Callable[[], HeldOut | None] = lambda: None
        """The run's held-out score, while this peer scores it (``Heartbeat.held_out``)."""

    async def measure_device(
        self, compute: ComputeConfig, limits: LimitsConfig | None = None, run: RunSpec | None = None
    ) -> None:
        """What this machine offers, announced from then on (``DeviceOffer.measure``). The node
        measures twice: the generic block while it looks for the run's spec, the run's block once
        it has it, before its trainer computes."""
        await self.offering.measure(compute, limits, run)

    def offer(self) -> tuple[float, float]:
        """This peer's (compute TFLOPS, memory GiB): ``DeviceOffer.tflops`` and the device's memory."""
        return self.offering.tflops(), self.offering.device.memory_bytes / (1 << 30)

    async def refresh_addrs(self) -> list[str]:
        self.addrs = await dht_call(self.dht.visible_maddrs())
        return self.addrs

    def sign_heartbeat(self, leaving: bool = False) -> bytes:
        """Sign this peer's heartbeat; it must pass the very checks every reader applies."""
        now = time.time()
        if leaving:
            # hivemind keeps the value with the later expiration: the leave must outlive the last beat.
            expires_at = max(now + LEAVING_RECORD_TTL_S, self._last_expires_at + 1)
        else:
            expires_at = now + self.heartbeat.ttl_s
        heartbeat = Heartbeat(
            run_id=self.run_id,
            peer_id=self.identity.peer_id,
            issued_at=now,
            expires_at=expires_at,
            addrs=self.addrs[:MAX_ADDRS],
            lan_addrs=self.lan.listen_maddrs[:MAX_ADDRS],
            device=self.offering.device,
            **self.offering.heartbeat_fields(),
            version=__version__,
            roles=self.roles(),
            uptime_s=now - self.started_at,
            leaving=leaving,
            join_token=self.membership.join_token,  # a private run's members admit us by it
            holds=[] if leaving else self.holds(),
            held_out=None if leaving else self.held_out(),
        )
        raw = heartbeat.sign(self.identity)
        Heartbeat.parse(raw, run_id=self.run_id, now=now, peer_id=self.identity.peer_id)  # raises RecordError
        self._last_expires_at = expires_at
        return raw

    async def publish_heartbeat(self) -> None:
        await self.refresh_addrs()
        raw = self.sign_heartbeat()
        self.lan.set_hello(raw)
        if not await dht_call(self.dht.publish_heartbeat(self.identity.peer_id, raw, self._last_expires_at)):
            logger.debug("Heartbeat stored only locally (no other DHT node accepted it yet)")

    async def announce_leaving(self) -> None:
        """The last heartbeat: peers drop us now rather than when our last one expires."""
        try:
            raw = self.sign_heartbeat(leaving=True)
            await asyncio.wait_for(
                self.dht.publish_heartbeat(self.identity.peer_id, raw, self._last_expires_at),
                LEAVE_ANNOUNCE_TIMEOUT_S,
            )
        except Exception as e:
            logger.warning("Could not announce leaving (%s); peers will drop us when our heartbeat expires", e)

    async def scan_members(self, observe: Callable[[list[dict[str, Any]]], None]) -> None:
        """Read every member's heartbeat; ``observe`` gets who is live (for the observation book)."""
        # Members we already see are read first: a bucket crowded by strangers cannot hide them.
        scan = await dht_call(self.dht.scan_members(time.time(), known=list(self.membership.peers)))
        self.rejected_records += scan.rejected
        joined, left = self.membership.update(scan.live, scan.leaving, time.time())
        observe(self.membership.snapshot(time.time()))
        if joined or left:  # what `systemctl status swarmd` shows
            newer = newer_in_swarm(__version__, [view.heartbeat.version for view in self.membership.peers.values()])
            status = f"member of {self.run_id}; {len(self.membership.peers)} other peer(s) seen"
            systemd.notify_status(status + (f"; {newer.warning(__version__)}" if newer else ""))

    async def probe_rtts(self) -> None:
        dht, membership = self.dht, self.membership

        async def probe(peer_id: str) -> None:
            with contextlib.suppress(Exception):
                membership.record_rtt(peer_id, await asyncio.wait_for(dht.ping(peer_id), RTT_PROBE_TIMEOUT_S))

        chosen = probe_batch(list(membership.peers), self._probed_at, MAX_PROBES_PER_ROUND)
        now = time.monotonic()
        self._probed_at = {p: self._probed_at[p] for p in membership.peers if p in self._probed_at}
        self._probed_at.update(dict.fromkeys(chosen, now))
        await asyncio.gather(*(probe(p) for p in chosen))

    def status(self, now: float) -> dict[str, Any]:
        """The control API's view of this peer and of the members it sees."""
        device = self.offering.device
        return {
            "roles": self.roles(),
            "uptime_s": round(now - self.started_at, 1),
            "addrs": self.addrs,
            "lan_addrs": self.lan.listen_maddrs,
            "device": {"kind": device.kind, "name": device.name, "memory_bytes": device.memory_bytes},
            "throughput_gflops": round(self.offering.heartbeat_fields()["throughput_gflops"], 1),
            "probe": self.offering.status(),
            "rejected_records": self.rejected_records,
            "refused_members": self.membership.refusals(),
            "dht_restarts": self.dht.restarts,
            "peers": self.membership.snapshot(now),
        }
