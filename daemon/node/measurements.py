"""What this peer measures of the swarm, and publishes signed for every peer to read.

- Links: round-trip time (a DHT ping) and bandwidth (a ``probe`` request carrying
  ``[probes] probe_bytes``) to the peers that are due (``swarmd.peers.records.links.ProbeBudget``:
  each at most every ``interval_s``, within ``bytes_per_hour``), and passively, from the data
  path's own large transfers.
- Observations: on every membership scan, which peers were live; the observation book
  (``swarmd.peers.membership.reliability``) is saved in the state directory so that it
  survives restarts. Reliability is computed from what *others* observed, so a peer's own book
  is worth something only once published.

``publish`` signs both as records (links with this peer's compute, and observations); the
coordination round (``swarmd.node.coordination``) reads everyone's back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from swarmd.peers.membership.reliability import KIND as OBSERVATIONS_KIND
from swarmd.peers.membership.reliability import ObservationBook
from swarmd.peers.records.identity import Identity
from swarmd.peers.records.links import (
    KIND as LINKS_KIND,
)
from swarmd.peers.records.links import (
    MAX_PROBE_BYTES,
    LinkEstimate,
    ProbeBudget,
    bandwidth_from_transfer,
    make_record,
)
from swarmd.peers.wire.errors import RpcError, TooLarge, Unreachable
from swarmd.peers.wire.messages import CellBackward, CellForward, Probe, Probed, ReplicaCheckpoint, ReplicaLog
from swarmd.peers.wire.protocol import Request
from swarmd.peers.wire.rpc import call

logger = logging.getLogger(__name__)

RECORD_TTL_S = 120.0
PASSIVELY_MEASURED = (CellForward, CellBackward, ReplicaLog, ReplicaCheckpoint)
PASSIVE_MIN_BYTES = 64 * 1024
OBSERVATIONS_FILE = "observations.json"
PING_TIMEOUT_S = 5.0
PROBE_TIMEOUT_S = 30.0


class Measurements:
    """This peer's link estimates and observation book, and the records it publishes of them."""

    def __init__(
        self,
        run_id: str,
        identity: Identity,
        dht: Any,
        state_dir: Path,
        budget: ProbeBudget,
        own_device: Callable[[], tuple[float, float]],
        scan_interval_s: float,
    ) -> None:
        """``own_device()``: this peer's (compute TFLOPS, memory GiB) as measured at start;
        ``scan_interval_s``: how often membership is scanned (``observe`` is called)."""
        self.run_id, self.identity, self.dht, self.own = run_id, identity, dht, identity.peer_id
        self.budget, self.own_device = budget, own_device
        self.path = state_dir / OBSERVATIONS_FILE
        self.book = ObservationBook.load(self.path, self.own, max_gap_s=3 * scan_interval_s)
        self.links: dict[str, LinkEstimate] = {}
        self.p2p: Any = None  # set once the data path is up
        self.members: dict[str, dict[str, Any]] = {}
        """peer -> the membership view (heartbeat fields) at the last scan, others only."""
        self.probes_sent = 0
        self.passive_samples = 0
        self.probe_failures = 0

    # --- links -------------------------------------------------------------------------------

    async def handle_probe(self, sender: str, request: Probe, blobs: list[bytes]) -> tuple[Probed, list[bytes]]:
        """Answer a peer's bandwidth probe: its bytes are counted and dropped (the RPC server
        already refuses one over ``Probe.MAX_BYTES`` while reading it; this is the last check)."""
        size = len(blobs[0])
        if size > MAX_PROBE_BYTES:
            raise TooLarge(f"probe of {size} bytes is over the {MAX_PROBE_BYTES}-byte limit")
        return Probed(bytes=size), []

    async def probe(self) -> None:
        now = time.time()
        due = self.budget.due(now, self.links, sorted(self.members))
        if not due or self.p2p is None:
            return
        await asyncio.gather(*(self._probe_one(peer) for peer in due))

    async def _probe_one(self, peer: str) -> None:
        est = self.links.setdefault(peer, LinkEstimate())
        rtt = None
        with contextlib.suppress(Exception):
            rtt = await asyncio.wait_for(self.dht.ping(peer), PING_TIMEOUT_S)
        bandwidth = None
        size = self.budget.next_probe_bytes(time.time())
        if size:
            started = time.perf_counter()
            try:
                await call(self.p2p, peer, Probe(run_id=self.run_id), [bytes(size)], timeout_s=PROBE_TIMEOUT_S)
                self.budget.charge(time.time(), size)
                self.probes_sent += 1
                bandwidth = bandwidth_from_transfer(size, time.perf_counter() - started, rtt or est.rtt_s)
            except Unreachable as e:
                self.probe_failures += 1
                logger.debug("Bandwidth probe to %s could not open a stream: %s", peer, e)
                est.add(time.time(), rtt_s=rtt)
                est.mark_unreachable(time.time())
                return
            except RpcError as e:
                self.probe_failures += 1
                logger.debug("Bandwidth probe to %s failed: %s", peer, e)
        est.add(time.time(), rtt_s=rtt, bandwidth_Bps=bandwidth)

    def observe_transfer(self, peer: str, request: Request[Any], nbytes: int, seconds: float) -> None:
        """A request of the data path went direct to ``peer`` and back: a passive measurement of
        the link, free where traffic flows, so that the probes (which on a loaded or slow-start
        link measure little but latency) are needed only where nothing does. Only requests whose
        answer comes once the bytes are in count (a long poll, or a step at a server, would
        count their waiting as transfer time), and only large enough ones to outlast TCP's
        start (``PASSIVE_MIN_BYTES``)."""
        if not isinstance(request, PASSIVELY_MEASURED) or nbytes < PASSIVE_MIN_BYTES or peer == self.own:
            return
        est = self.links.setdefault(peer, LinkEstimate())
        bandwidth = bandwidth_from_transfer(nbytes, seconds, est.rtt_s)
        if bandwidth is not None:
            est.add(time.time(), bandwidth_Bps=bandwidth)
            self.passive_samples += 1

    # --- observations ------------------------------------------------------------------------

    def observe(self, members: list[dict[str, Any]]) -> None:
        """A membership scan: who is live now (others only)."""
        self.members = {m["peer_id"]: m for m in members if m["peer_id"] != self.own}
        self.book.observe(time.time(), self.members)

    def is_member(self, peer: str) -> bool:
        """Whether ``peer`` was live at the last membership scan (this peer is not its own member)."""
        return peer in self.members

    def save(self) -> None:
        try:
            self.book.save(self.path)
        except OSError as e:
            logger.warning("Could not save observations to %s: %s", self.path, e)

    # --- records -----------------------------------------------------------------------------

    async def publish(self) -> None:
        now = time.time()
        tflops, memory_gib = self.own_device()
        record = make_record(self.run_id, self.own, now, RECORD_TTL_S, tflops, memory_gib, self.links)
        await self.dht.publish_peer_record(LINKS_KIND, self.own, record.sign(self.identity), record.expires_at)
        observations = self.book.to_record(self.run_id, self.own, now, RECORD_TTL_S)
        await self.dht.publish_peer_record(
            OBSERVATIONS_KIND, self.own, observations.sign(self.identity), observations.expires_at
        )
        self.save()

    def status(self, matrix_measured: int, matrix_filled: int) -> dict[str, Any]:
        """The links this peer measured, and how much of the live matrix was measured (rather
        than filled in from the others) as of the last coordination round."""
        return {
            "measured": len([e for e in self.links.values() if e.samples]),
            "unreachable": sorted(p for p, e in self.links.items() if e.unreachable),
            "matrix_measured": matrix_measured,
            "matrix_filled": matrix_filled,
            "probes_sent": self.probes_sent,
            "probe_failures": self.probe_failures,
            "passive_samples": self.passive_samples,
            "probe_bytes_last_hour": self.budget.spent_last_hour(time.time()),
        }
