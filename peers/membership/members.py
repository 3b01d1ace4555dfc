"""The swarm as this peer sees it: the live heartbeats of a run, and round-trip times.

Pure bookkeeping over what the DHT returned; the node feeds it scans and RTT samples. A peer
is seen while its latest heartbeat is unexpired, not marked ``leaving``, and admitted by the
run's spec (``swarmd.peers.membership.admission``: a private run's allowlist or join tokens).
A refused heartbeat never makes a member; each is counted by reason for ``swarmd status``.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

from swarmd.peers.membership.admission import Refusal, admit, check_own_admission, read_token
from swarmd.peers.records.heartbeat import Heartbeat
from swarmd.peers.records.join_token import JoinToken
from swarmd.peers.records.run_spec import SignedRunSpec

logger = logging.getLogger(__name__)


@dataclass
class PeerView:
    heartbeat: Heartbeat
    first_seen: float
    rtt_s: float | None = None
    probes: int = 0

    def as_dict(self, now: float) -> dict[str, Any]:
        hb = self.heartbeat
        return {
            "peer_id": hb.peer_id,
            "age_s": round(max(0.0, now - hb.issued_at), 3),
            "clock_offset_s": round(now - hb.issued_at, 3),  # negative: its clock is ahead of ours
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
            "free_memory_bytes": hb.free_memory_bytes,
            "precision": hb.precision,
            # Its uptime now, not as of its last heartbeat: peers that heartbeat at different
            # moments then keep their order (the standby and a free stage's claimant are picked
            # by it; as of the heartbeat, two peers started a second apart swapped places).
            "uptime_s": round(hb.uptime_s + max(0.0, now - hb.issued_at), 3),
            "version": hb.version,
            "holds": list(hb.holds),
            "held_out": None if hb.held_out is None else [hb.held_out.version, hb.held_out.loss],
        }


class Membership:
    def __init__(self, own_peer_id: str) -> None:
        self.own_peer_id = own_peer_id
        self.peers: dict[str, PeerView] = {}
        self.scans = 0
        """Scans merged so far: until the first, nobody else is known, not even to be absent."""
        self.spec: SignedRunSpec | None = None
        """The run's spec, whose access rule admits members; set by ``follow`` before any scan."""
        self.join_token = ""
        """This peer's own join token, carried in each of its heartbeats (private runs)."""
        self.refused: Counter[str] = Counter()
        """Heartbeats refused by the spec's access rule, by reason (``admission.REASONS``)."""
        # Per peer of the last scan: its token as verified (one signature check per token, not
        # per scan), and the issue time of its last refused heartbeat (each is counted once).
        self._tokens: dict[str, tuple[str, JoinToken | Refusal]] = {}
        self._refused_at: dict[str, float] = {}

    def follow(self, spec: SignedRunSpec, join_token: str = "", now: float | None = None) -> None:
        """Admit members by ``spec`` from now on, and carry ``join_token`` in our heartbeats.

        Raises JoinError, saying what to ask the run's creator for, when ``spec`` would refuse
        this very peer: it would only run beside a swarm that ignores it."""
        check_own_admission(spec, self.own_peer_id, join_token, time.time() if now is None else now)
        self.spec, self.join_token = spec, join_token

    def update(self, live: list[Heartbeat], leaving: list[str], now: float) -> tuple[list[str], list[str]]:
        """Merge a scan of live heartbeats; return the peer IDs that joined and that left."""
        if self.spec is None:  # admitting without the spec would open every private run
            raise RuntimeError("Membership.update before follow(spec): the run's access rule is not known yet")
        self.scans += 1
        latest: dict[str, Heartbeat] = {}
        for hb in live:
            if hb.peer_id == self.own_peer_id or not hb.is_live(now):
                continue
            if hb.peer_id not in latest or hb.issued_at > latest[hb.peer_id].issued_at:
                latest[hb.peer_id] = hb
        refused = self._refuse(self.spec, latest, now)
        joined = [p for p in latest if p not in self.peers]
        left = [
            p
            for p, view in self.peers.items()
            if p in refused or (p not in latest and (p in leaving or not self._still_valid(view, now)))
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

    def _refuse(self, spec: SignedRunSpec, latest: dict[str, Heartbeat], now: float) -> set[str]:
        """Take the heartbeats ``spec`` does not admit out of ``latest``; return their peers."""
        tokens, refused_at = self._tokens, self._refused_at
        self._tokens, self._refused_at = {}, {}  # only the peers of this scan: bounded by it
        refused: set[str] = set()
        for peer_id, hb in list(latest.items()):
            token: JoinToken | Refusal | None = None
            if spec.spec.membership == "token":
                text, token = tokens.get(peer_id, ("", None))
                if token is None or text != hb.join_token:
                    token = read_token(spec, peer_id, hb.join_token)
                self._tokens[peer_id] = (hb.join_token, token)
            refusal = admit(spec, hb, now, token)
            if refusal is None:
                continue
            del latest[peer_id]
            refused.add(peer_id)
            self._refused_at[peer_id] = hb.issued_at
            if refused_at.get(peer_id) != hb.issued_at:
                self.refused[refusal.reason] += 1
                logger.debug("Refused the heartbeat of %s: %s", peer_id, refusal.detail)
            if peer_id in self.peers:
                logger.info("Peer %s is no longer admitted: %s", peer_id, refusal.detail)
        return refused

    def refusals(self) -> dict[str, int]:
        """Refused heartbeats by reason, for ``swarmd status``."""
        return dict(sorted(self.refused.items()))

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

    def snapshot(self, now: float) -> list[dict[str, Any]]:
        return [self.peers[p].as_dict(now) for p in sorted(self.peers)]
