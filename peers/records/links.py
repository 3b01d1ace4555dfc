"""Measured links and compute, kept smoothed and published as a signed record.

Measured links: what one peer measured to others (RTT, bandwidth) and of itself (compute),
kept smoothed, probed within a budget, and published as a signed DHT record.

Every peer assembles the swarm's latency and bandwidth matrix from these records
(``swarmd.peers.planning.snapshot``). A record only says what its signer measured from its own
end: the link i -> j is in i's record; nobody can speak for a link it is not on.

Probing is cheap on a metered link by construction (``ProbeBudget``): each peer that matters
is probed at most once per ``interval_s``, a bandwidth probe sends ``probe_bytes`` (shrunk
when the hourly byte budget runs low, skipped when it is spent), and at most ``max_peers``
peers are tracked: those without a measurement first, then the stalest.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from swarmd.errors import RecordError
from swarmd.peers.records.envelope import Fields
from swarmd.peers.records.signed import Head, SignedRecord

KIND = "links"
MAX_LINKS_BYTES = 16 * 1024
"""A links record at its largest (``MAX_LINKS`` peers of 128-character IDs, unrounded
figures) is about 13 KiB: one record per peer, the same size in a swarm of ten or 10,000,
since a peer publishes only the links it measured (``ProbeBudget.max_peers`` tracked)."""
MAX_LINKS = 64
MAX_TTL_S = 900.0
MIN_PROBE_BYTES = 16 * 1024
MAX_PROBE_BYTES = 1024 * 1024
"""A probe request carries at most this much: what a peer's probe handler accepts."""
SMOOTHING = 0.3
"""Weight of a new sample in the moving averages: a few probes settle a link, one outlier does not."""
RETRY_UNMEASURED_S = 10.0
"""A link whose bandwidth probe failed (a timeout, a busy peer: not a refused stream) is probed
again after this long, doubling with each try up to the interval. Left for the whole interval,
the planner filled that link in from the others for five minutes (test_planning's "fully
measured matrix" timed out in CI on one such failure)."""
UNREACHABLE_BPS = 1.0
"""The bandwidth published for a link whose probe could not even open a stream: the planner
then keeps the two ends apart (or routes them through a relay), and connectivity counts it."""


@dataclass
class LinkEstimate:
    rtt_s: float | None = None
    bandwidth_Bps: float | None = None
    measured_at: float = 0.0
    samples: int = 0
    unreachable: bool = False
    """The last probe could not open a stream to the peer."""

    def add(self, now: float, rtt_s: float | None = None, bandwidth_Bps: float | None = None) -> None:
        if rtt_s is not None and rtt_s >= 0 and math.isfinite(rtt_s):
            self.rtt_s = rtt_s if self.rtt_s is None else (1 - SMOOTHING) * self.rtt_s + SMOOTHING * rtt_s
        if bandwidth_Bps is not None and bandwidth_Bps > 0 and math.isfinite(bandwidth_Bps):
            # A link that opens again starts afresh: averaging with the unreachable floor would
            # keep it near zero for many probes.
            prev = None if self.unreachable else self.bandwidth_Bps
            self.unreachable = False
            self.bandwidth_Bps = bandwidth_Bps if prev is None else (1 - SMOOTHING) * prev + SMOOTHING * bandwidth_Bps
        self.measured_at = now
        self.samples += 1

    def mark_unreachable(self, now: float) -> None:
        """The probe could not open a stream: the direct link carries nothing for now."""
        self.bandwidth_Bps = UNREACHABLE_BPS
        self.unreachable = True
        self.measured_at = now
        self.samples += 1


def bandwidth_from_transfer(nbytes: int, seconds: float, rtt_s: float | None) -> float | None:
    """Bytes per second of a request that carried ``nbytes`` and took ``seconds`` in all: the
    round trip that any request pays is taken off first (a tiny probe measures latency, not
    bandwidth, so one under 16 KiB says nothing)."""
    if nbytes < MIN_PROBE_BYTES or seconds <= 0:
        return None
    transfer = seconds - (rtt_s or 0.0)
    transfer = max(transfer, seconds * 0.1)  # an RTT estimate larger than the request: trust a tenth of it
    return nbytes / transfer


@dataclass
class ProbeBudget:
    interval_s: float = 300.0
    """Each peer is probed at most this often."""
    bytes_per_hour: int = 64 * 1024 * 1024
    probe_bytes: int = 256 * 1024
    max_peers: int = 32
    spent: list[tuple[float, int]] = field(default_factory=list)
    """(when, bytes) of the bandwidth probes of the last hour."""

    def spent_last_hour(self, now: float) -> int:
        self.spent = [(t, b) for t, b in self.spent if t > now - 3600.0]
        return sum(b for _, b in self.spent)

    def next_probe_bytes(self, now: float) -> int:
        """How big the next bandwidth probe may be (0: the hour's budget is spent)."""
        left = self.bytes_per_hour - self.spent_last_hour(now)
        size = min(self.probe_bytes, MAX_PROBE_BYTES, left)
        return size if size >= MIN_PROBE_BYTES else 0

    def charge(self, now: float, nbytes: int) -> None:
        self.spent.append((now, nbytes))

    def due(self, now: float, links: dict[str, LinkEstimate], peers: Iterable[str]) -> list[str]:
        """The peers to probe now: unmeasured first, then the stalest, each at most once per
        interval (one with no bandwidth yet sooner, ``RETRY_UNMEASURED_S``), at most
        ``max_peers`` tracked."""
        candidates = []
        for peer in peers:
            est = links.get(peer)
            if est is None or est.samples == 0:
                candidates.append((0.0, peer))
            elif now - est.measured_at >= self._wait(est):
                candidates.append((est.measured_at, peer))
        candidates.sort()
        return [peer for _, peer in candidates[: self.max_peers]]

    def _wait(self, est: LinkEstimate) -> float:
        if est.bandwidth_Bps is not None:
            return self.interval_s
        return min(self.interval_s, RETRY_UNMEASURED_S * 2.0 ** min(est.samples - 1, 30))


@dataclass(frozen=True, kw_only=True)
class LinksRecord(SignedRecord):
    KIND: ClassVar[str] = KIND
    MAX_BYTES: ClassVar[int] = MAX_LINKS_BYTES
    MAX_TTL_S: ClassVar[float] = MAX_TTL_S
    tflops: float
    """The signer's own measured compute throughput (dense matmul), TFLOPS."""
    memory_gib: float
    links: dict[str, tuple[float, float, float]]
    """peer -> (one-way latency s, bandwidth B/s, age of the measurement s); -1 where not measured."""

    @classmethod
    def _read_fields(cls, f: Fields, head: Head) -> dict[str, Any]:
        claimed = head.peer_id
        raw_links = f.obj.get("links")
        if not isinstance(raw_links, dict) or len(raw_links) > MAX_LINKS:
            size = len(raw_links) if isinstance(raw_links, dict) else type(raw_links).__name__
            raise RecordError(f"links of {claimed}: 'links' must be an object of at most {MAX_LINKS} peers, got {size}")
        links = {}
        for peer, value in raw_links.items():
            if not isinstance(peer, str) or not 0 < len(peer) <= 128 or peer == claimed:
                raise RecordError(f"links of {claimed}: bad peer id {str(peer)[:60]!r}")
            if not (isinstance(value, list) and len(value) == 3 and all(_is_number(v) for v in value)):
                raise RecordError(f"links of {claimed}: link to {peer[:60]} must be [latency, bandwidth, age]")
            latency, bandwidth, age = (float(v) for v in value)
            if not (latency == -1 or 0 <= latency <= 60) or not (bandwidth == -1 or 0 < bandwidth <= 1e12):
                raise RecordError(f"links of {claimed}: link to {peer[:60]} out of range: {value}")
            if not 0 <= age <= 86400:
                raise RecordError(f"links of {claimed}: measurement age {age} out of 0..86400 s")
            links[peer] = (latency, bandwidth, age)
        return {"tflops": f.number("tflops", 0, 1e6), "memory_gib": f.number("memory_gib", 0, 1e6), "links": links}


def make_record(
    run_id: str,
    peer_id: str,
    now: float,
    ttl_s: float,
    tflops: float,
    memory_gib: float,
    links: dict[str, LinkEstimate],
) -> LinksRecord:
    """The record of this peer's freshest ``MAX_LINKS`` measurements."""
    fresh = sorted((est.measured_at, p) for p, est in links.items() if est.samples and p != peer_id)[-MAX_LINKS:]
    out = {}
    for _, p in fresh:
        est = links[p]
        one_way = -1.0 if est.rtt_s is None else est.rtt_s / 2
        bandwidth = -1.0 if est.bandwidth_Bps is None else est.bandwidth_Bps
        out[p] = (round(one_way, 6), round(bandwidth, 1), round(max(0.0, now - est.measured_at), 1))
    return LinksRecord(
        run_id=run_id,
        peer_id=peer_id,
        issued_at=now,
        expires_at=now + min(ttl_s, MAX_TTL_S),
        tflops=tflops,
        memory_gib=memory_gib,
        links=out,
    )


def _is_number(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
