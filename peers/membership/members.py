"""The swarm as this peer sees it: the live heartbeats of a run, and round-trip times.

Pure bookkeeping over what the DHT returned; the node feeds it scans and RTT samples. A peer
is seen while its latest heartbeat is unexpired and not marked ``leaving``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from swarmd.peers.records.heartbeat import Heartbeat

logger = logging.getLogger(__name__)


@dataclass
class PeerView:
    heartbeat: Heartbeat
    first_seen: float
    rtt_s: float | None = None
    probes: int = 0

    def as_dict(self, now: float) -> dict[str, object]:
        hb = self.heartbeat
        return {
            "peer_id": hb.peer_id,
            "age_s": round(max(0.0, now - hb.issued_at), 3),
            "rtt_ms": None if self.rtt_s is None else round(self.rtt_s * 1000, 2),
            "seen_for_s": round(now - self.first_seen, 1),
            "addrs": hb.addrs,
            "roles": hb.roles,
            "device": {
                "kind": hb.device.kind,
                "name": hb.device.name,
                "memory_bytes": hb.device.memory_bytes,
            },
            "throughput_gflops": round(hb.throughput_gflops, 1),
            # Its uptime now, not as of its last heartbeat: peers that heartbeat at different
            # moments then keep their order (the standby and a free stage's claimant are picked
            # by it; as of the heartbeat, two peers started a second apart swapped places).
            "uptime_s": round(hb.uptime_s + max(0.0, now - hb.issued_at), 3),
            "version": hb.version,
        }


class Membership:
    def __init__(self, own_peer_id: str) -> None:
        self.own_peer_id = own_peer_id
        self.peers: dict[str, PeerView] = {}
        self.scans = 0
        """Scans merged so far: until the first, nobody else is known, not even to be absent."""

    def update(self, live: list[Heartbeat], leaving: list[str], now: float) -> tuple[list[str], list[str]]:
        """Merge a scan of live heartbeats; return the peer IDs that joined and that left."""
        self.scans += 1
        latest: dict[str, Heartbeat] = {}
        for hb in live:
            if hb.peer_id == self.own_peer_id or not hb.is_live(now):
                continue
            if hb.peer_id not in latest or hb.issued_at > latest[hb.peer_id].issued_at:
                latest[hb.peer_id] = hb
        joined = [p for p in latest if p not in self.peers]
        left = [
            p
            for p, view in self.peers.items()
            if p not in latest and (p in leaving or not self._still_valid(view, now))
        ]
        for peer_id in left:
            del self.peers[peer_id]
            logger.info("Peer left: %s", peer_id)
        for peer_id, hb in latest.items():
            view = self.peers.get(peer_id)
            if view is None:
                self.peers[peer_id] = PeerView(hb, first_seen=now)
                logger.info("Peer joined: %s (%s, %s)", peer_id, hb.device.kind, hb.device.name)
            elif hb.issued_at >= view.heartbeat.issued_at:
                view.heartbeat = hb
        return joined, left

    @staticmethod
    def _still_valid(view: PeerView, now: float) -> bool:
        # One scan may miss a record (a DHT lookup is best-effort); keep a peer until its last
        # heartbeat we hold expires, and drop it at once when it announced leaving.
        return view.heartbeat.is_live(now)

    def record_rtt(self, peer_id: str, rtt_s: float | None) -> None:
        view = self.peers.get(peer_id)
        if view is not None and rtt_s is not None:
            view.probes += 1
            if view.probes == 1:
                return  # the first ping pays for dialling the peer: not a round trip

            # Smooth like TCP's SRTT so one slow ping does not jump the figure.
            view.rtt_s = rtt_s if view.rtt_s is None else 0.875 * view.rtt_s + 0.125 * rtt_s

    def snapshot(self, now: float) -> list[dict[str, object]]:
        return [self.peers[p].as_dict(now) for p in sorted(self.peers)]
