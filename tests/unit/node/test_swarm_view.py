"""daemon/node/swarm_view.py: what a coordination round makes of the swarm's records, and what the
trainer and the elections read of it (scores to one decimal, link bandwidths, candidates)."""

from __future__ import annotations

import numpy as np
import pytest

from swarmd.node.swarm_view import SwarmView, connectivity_from, matrix_of, member_tflops
from swarmd.peers.membership.reliability import Reliability
from swarmd.peers.planning.snapshot import Member, build_snapshot, model_for_scenario
from swarmd.peers.records.links import LinksRecord
from swarmd.peers.wire.routing import Matrix

pytestmark = pytest.mark.timeout(30)


def test_an_empty_view_knows_nothing_but_answers_everything() -> None:
    view = SwarmView()
    assert view.score_of("a") == 0.0 and view.link_Bps("a", "b") == 0.0
    assert view.candidate("a").reliability == 0.0 and view.candidate("a").connectivity_Bps == 0.0
    assert view.matrix is None and matrix_of(None) is None


def test_scores_are_rounded_so_that_noise_does_not_reorder_peers() -> None:
    view = SwarmView(reliability={"a": Reliability(0.8449, 3, 10.0, 0.1), "b": Reliability(0.8351, 3, 9.0, 0.1)})
    assert view.score_of("a") == view.score_of("b") == 0.8
    assert view.candidate("a").reliability == 0.8449  # elections compare the unrounded score


def test_link_bandwidth_is_read_from_the_live_matrix() -> None:
    bandwidth = np.array([[0.0, 5e6], [7e6, 0.0]])
    view = SwarmView(matrix=Matrix({"a": 0, "b": 1}, np.zeros((2, 2)), bandwidth))
    assert view.link_Bps("a", "b") == 5e6 and view.link_Bps("b", "a") == 7e6
    assert view.link_Bps("a", "a") == 0.0 and view.link_Bps("a", "gone") == 0.0


def links(by: str, bandwidth: dict[str, float]) -> LinksRecord:
    table = {p: (0.01, b, 1.0) for p, b in bandwidth.items()}
    return LinksRecord(
        run_id="r.x", peer_id=by, issued_at=0.0, expires_at=60.0, tflops=1.0, memory_gib=1.0, links=table
    )


def test_connectivity_is_what_the_trusted_others_measured_never_a_peers_own_word() -> None:
    records = {
        "a": links("a", {"b": 4e6, "c": 8e6}),
        "b": links("b", {"a": 2e6, "c": 6e6}),
        "c": links("c", {"a": 6e6}),
        # a made-up record: it raises its signer nothing, and is one vote among the others'
        "s": links("s", {"a": 1e12, "b": 1e12, "c": 1e12}),
    }
    subjects = ["a", "b", "c", "s"]
    assert connectivity_from(records, None, subjects) == {"a": 6e6, "b": (4e6 + 1e12) / 2, "c": 8e6, "s": 0.0}
    trusted = frozenset({"a", "b", "c"})
    assert connectivity_from(records, trusted, subjects) == {"a": 4e6, "b": 4e6, "c": 7e6, "s": 0.0}


def test_the_matrix_indexes_the_snapshots_members() -> None:
    members = [Member(p, 16.0, 10.0) for p in ("a", "b", "c")]
    model = model_for_scenario(4, 64, 256, 32)
    snap = build_snapshot("r.x", members, {}, {}, model, {"sequences": 8, "micro_batch": 2})
    matrix = matrix_of(snap)
    assert matrix is not None and dict(matrix.index) == {"a": 0, "b": 1, "c": 2}


def test_a_members_speed_is_its_measured_figure_else_its_devices_rated_one() -> None:
    h100 = {"kind": "cuda", "name": "NVIDIA H100 80GB HBM3", "memory_bytes": 80 * 2**30}
    assert member_tflops({"throughput_gflops": 412_000.0, "device": h100}) == 412.0  # measured
    assert member_tflops({"throughput_gflops": 0.0, "device": h100}) == 989.0  # before it measured: rated
    unknown = {"kind": "cuda", "name": "NVIDIA A10G", "memory_bytes": 24 * 2**30}
    assert member_tflops({"throughput_gflops": 0.0, "device": unknown}) == 0.0  # the snapshot's fallback then
    cpu = {"kind": "cpu", "name": "AMD EPYC", "memory_bytes": 16 * 2**30}
    assert member_tflops({"throughput_gflops": 0.0, "device": cpu}) == 0.0
    assert member_tflops({"throughput_gflops": 96.0, "device": cpu}) == 0.096
