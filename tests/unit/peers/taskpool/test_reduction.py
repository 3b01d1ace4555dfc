"""Reduction groups (peers/taskpool/reduction.py): who heads what, how long a head waits, and
how a sum weighs its parts."""

from __future__ import annotations

import pytest

from swarmd.peers.taskpool.reduction import (
    MAX_GROUP,
    REDUCE_WAIT_S,
    group_of,
    group_size,
    groups,
    head_of,
    mean_factors,
    reduce_wait_s,
    summable,
)

pytestmark = pytest.mark.timeout(10)


def test_groups_are_as_large_as_it_takes_for_each_server_to_take_about_one_slice_a_round() -> None:
    assert group_size(8, 8) == group_size(3, 8) == 1  # no more pipelines than shards: no groups
    assert group_size(9, 8) == 2 and group_size(882, 128) == 7
    assert group_size(64, 1) == 8  # few shards: as many groups as members in each
    assert group_size(100_000, 1) == MAX_GROUP
    with pytest.raises(ValueError):
        group_size(0, 4)


def test_every_pipeline_is_in_one_group_of_consecutive_ones_and_the_last_may_be_smaller() -> None:
    found = groups(10, 4)
    assert [list(g) for g in found] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert all(group_of(p, 10, 4) == g for g in found for p in g)


def test_a_groups_shards_are_headed_in_turn_by_its_members_and_a_lone_pipeline_has_no_head() -> None:
    assert [head_of(5, 10, 4, k) for k in range(6)] == [4, 5, 6, 7, 4, 5]
    assert [head_of(9, 10, 4, k) for k in range(3)] == [8, 9, 8]
    assert head_of(8, 9, 4, 0) is None  # pipeline 8 alone in its group: straight to the server
    assert head_of(0, 4, 1, 3) is None  # no groups


def test_a_head_waits_a_round_within_its_bounds() -> None:
    low, high = REDUCE_WAIT_S
    assert reduce_wait_s(0.0) == low and reduce_wait_s(1e6) == high
    assert reduce_wait_s(40.0) == pytest.approx(40.0)


def test_a_sum_takes_the_parts_within_a_version_of_the_newest_at_the_oldest_of_their_bases() -> None:
    assert summable([7, 7, 7]) == ([0, 1, 2], 7)
    assert summable([6, 7, 4]) == ([0, 1], 6)  # the part at 4 goes by itself
    with pytest.raises(ValueError):
        summable([])


def test_a_sums_parts_count_by_their_micro_batches() -> None:
    assert mean_factors([2, 6]) == [0.25, 0.75]
    with pytest.raises(ValueError):
        mean_factors([])
    with pytest.raises(ValueError):
        mean_factors([3, 0])
