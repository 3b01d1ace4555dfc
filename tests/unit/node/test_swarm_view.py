"""daemon/node/swarm_view.py: what a coordination round makes of the swarm's records, and what the
trainer and the elections read of it (scores to one decimal, link bandwidths, candidates)."""

from __future__ import annotations

import numpy as np
import pytest

from swarmd.node.swarm_view import SwarmView, connectivity_of, matrix_of
from swarmd.peers.membership.reliability import Reliability
from swarmd.peers.planning.snapshot import DEFAULT_BANDWIDTH_BPS, Member, build_snapshot, model_for_scenario
from swarmd.peers.wire.routing import Matrix

pytestmark = pytest.mark.timeout(30)


def test_an_empty_view_knows_nothing_but_answers_everything() -> None:
    view = SwarmView()
    assert view.score_of("a") == 0.0 and view.link_Bps("a", "b") == 0.0
    assert view.candidate("a").reliability == 0.0 and view.candidate("a").connectivity_Bps == 0.0
    assert view.matrix is None and connectivity_of(None) == {} and matrix_of(None) is None


def test_scores_are_rounded_so_that_noise_does_not_reorder_peers() -> None:
    view = SwarmView(reliability={"a": Reliability(0.8449, 3, 10.0, 0.1), "b": Reliability(0.8351, 3, 9.0, 0.1)})
    assert view.score_of("a") == view.score_of("b") == 0.8
    assert view.candidate("a").reliability == 0.8449  # elections compare the unrounded score


def test_link_bandwidth_is_read_from_the_live_matrix() -> None:
    bandwidth = np.array([[0.0, 5e6], [7e6, 0.0]])
    view = SwarmView(matrix=Matrix({"a": 0, "b": 1}, np.zeros((2, 2)), bandwidth))
    assert view.link_Bps("a", "b") == 5e6 and view.link_Bps("b", "a") == 7e6
    assert view.link_Bps("a", "a") == 0.0 and view.link_Bps("a", "gone") == 0.0


def test_connectivity_is_each_members_median_link_to_the_others() -> None:
    members = [Member(p, 16.0, 10.0) for p in ("a", "b", "c")]
    model = model_for_scenario(4, 64, 256, 32)
    snap = build_snapshot("r.x", members, {}, {}, model, {"sequences": 8, "micro_batch": 2})
    # nothing measured: every link is filled with the default, and so is every median
    assert connectivity_of(snap) == {p: DEFAULT_BANDWIDTH_BPS for p in ("a", "b", "c")}
    matrix = matrix_of(snap)
    assert matrix is not None and dict(matrix.index) == {"a": 0, "b": 1, "c": 2}
