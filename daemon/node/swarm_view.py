"""What one coordination round made of the swarm's records: reliability, links, the live scenario.

Every peer reads the same signed records (links, observations) and so computes the same view;
the roles elected from it (coordinator, relays, standby, hosts) therefore agree without a
vote. The view is built whole each round and swapped in at once, so that a reader between
two rounds never sees the reliability of one and the links of another.
"""

from __future__ import annotations

import logging
import statistics
from dataclasses import dataclass, field, replace
from typing import Any

from swarmd.node.rated_tflops import rated_tflops
from swarmd.peers.membership.election import RoleCandidate
from swarmd.peers.membership.reliability import Observations, Reliability, swarm_reliability
from swarmd.peers.planning.scenario import ScenarioError
from swarmd.peers.planning.snapshot import Member, Snapshot, build_snapshot, model_for_scenario
from swarmd.peers.records.links import LinksRecord
from swarmd.peers.records.run_spec import SignedRunSpec
from swarmd.peers.wire.routing import Matrix

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SwarmView:
    """The live members' reliability and links as of the last round (empty before the first)."""

    reliability: dict[str, Reliability] = field(default_factory=dict)
    snapshot: Snapshot | None = None
    """The live scenario the coordinator plans from; None when the members do not make one."""
    matrix: Matrix | None = None
    """The snapshot's latency and bandwidth by peer ID: the router asks on every request."""
    connectivity: dict[str, float] = field(default_factory=dict)
    """Each member's median bandwidth as the trusted others measured it (``connectivity_from``)."""

    def candidate(self, peer: str) -> RoleCandidate:
        """``peer`` as a candidate for a role: its reliability, connectivity and observed uptime."""
        r = self.reliability.get(peer)
        if r is None:
            return RoleCandidate(peer, 0.0, self.connectivity.get(peer, 0.0))
        return RoleCandidate(peer, r.score, self.connectivity.get(peer, 0.0), r.observed_up_s)

    def observed_up_s(self, peer: str) -> float:
        """How long the others have seen ``peer`` up (``Reliability.observed_up_s``); 0 when
        nobody has watched it long enough to say."""
        r = self.reliability.get(peer)
        return r.observed_up_s if r is not None else 0.0

    def score_of(self, peer: str) -> float:
        """The peer's reliability as others observed it, to one decimal: what orders peers for
        roles (standby, a free stage, checkpoint sources). Finer differences are measurement
        noise that moves every round; ordering by them made the standby flap between peers."""
        r = self.reliability.get(peer)
        return round(r.score, 1) if r is not None else 0.0

    def link_Bps(self, a: str, b: str) -> float:
        """The bandwidth from ``a`` to ``b`` in the live matrix (measured, or filled from the
        others where a pair was not), 0.0 where either is not in it."""
        matrix = self.matrix
        if matrix is None or a == b:
            return 0.0
        i, j = matrix.index.get(a), matrix.index.get(b)
        return 0.0 if i is None or j is None else float(matrix.bandwidth_Bps[i, j])


def read_view(
    spec: SignedRunSpec,
    own: Member,
    members: dict[str, dict[str, Any]],
    links: dict[str, LinksRecord],
    observations: list[Observations],
    trusted: frozenset[str] | None = None,
) -> SwarmView:
    """The view of the live swarm: ``own`` and the other ``members`` (heartbeat fields), with
    the links records and observations the live peers published. Reliability and connectivity,
    which elect, come only from ``trusted`` observers (None: all;
    ``swarmd.peers.membership.standing``); the scenario the coordinator plans from takes every
    live peer's links, its own included (planning needs the whole matrix; electing must not
    rest on a peer's word about itself)."""
    believed = [r for r in observations if trusted is None or r.observer in trusted]
    subjects = sorted({*members, own.peer_id})
    reliability = swarm_reliability(believed, subjects)
    snapshot = _snapshot(spec, own, members, links, reliability)
    return SwarmView(reliability, snapshot, matrix_of(snapshot), connectivity_from(links, trusted, subjects))


def narrowed(
    view: SwarmView,
    spec: SignedRunSpec,
    own: Member,
    members: dict[str, dict[str, Any]],
    links: dict[str, LinksRecord],
    peers: frozenset[str],
) -> SwarmView:
    """``view`` with its scenario cut to ``peers`` (``swarmd.peers.membership.probation``): what
    the coordinator plans from. Elections keep the whole view: every peer must see the same."""
    kept = {p: m for p, m in members.items() if p in peers}
    snapshot = _snapshot(spec, own, kept, {p: r for p, r in links.items() if p in peers}, view.reliability)
    return replace(view, snapshot=snapshot, matrix=matrix_of(snapshot))


def _snapshot(
    spec: SignedRunSpec,
    own: Member,
    members: dict[str, dict[str, Any]],
    links: dict[str, LinksRecord],
    reliability: dict[str, Reliability],
) -> Snapshot | None:
    run = spec.spec
    listed = [own]
    for peer, m in members.items():
        memory = float(m.get("device", {}).get("memory_bytes", 0)) / (1 << 30)
        listed.append(Member(peer, memory, member_tflops(m)))
    uptime = {p: (r.mean_uptime_h, r.mean_downtime_h) for p, r in reliability.items() if r.observers}
    model = model_for_scenario(run.model.layers, run.model.hidden, run.model.vocab, run.model.seq_len)
    batch = {"sequences": run.batch_sequences, "micro_batch": run.micro_batch}
    try:
        return build_snapshot(spec.run_id, listed, links, uptime, model, batch)
    except ScenarioError as e:
        logger.warning("The live swarm does not make a scenario: %s", e)
        return None


def member_tflops(member: dict[str, Any]) -> float:
    """A member's speed as its heartbeat says (``throughput_gflops``: what its probe achieved at
    the run's shapes); before it measured, its device's rated figure (``rated_tflops``); 0 when
    neither is known (the snapshot then takes the others' median)."""
    measured = float(member.get("throughput_gflops", 0.0)) / 1000
    if measured > 0:
        return measured
    device = member.get("device", {})
    return rated_tflops(str(device.get("name", "")), str(device.get("kind", ""))) or 0.0


def matrix_of(snap: Snapshot | None) -> Matrix | None:
    if snap is None:
        return None
    sc = snap.scenario
    return Matrix({p: i for i, p in enumerate(sc.ids)}, sc.latency_s, sc.bandwidth_Bps)


def connectivity_from(
    links: dict[str, LinksRecord], trusted: frozenset[str] | None, subjects: list[str]
) -> dict[str, float]:
    """Each subject's median bandwidth as measured by the others (their links records' entries
    for it), only by ``trusted`` ones (None: all), never the subject's own record: a made-up
    links record raises no one's connectivity but, as one vote of many, others'. 0.0 where no
    one measured it (unknown is not trusted)."""
    measured: dict[str, list[float]] = {}
    for observer, record in links.items():
        if trusted is not None and observer not in trusted:
            continue
        for subject, (_, bandwidth, _) in record.links.items():
            if subject != observer and bandwidth > 0:
                measured.setdefault(subject, []).append(bandwidth)
    return {s: statistics.median(measured[s]) if s in measured else 0.0 for s in subjects}
