"""training/rounds.py: a round names each share once, however often it was trained in it."""

from __future__ import annotations

import pytest

from swarmd.training.rounds import named_once

pytestmark = pytest.mark.timeout(10)


def test_a_share_issued_again_within_its_round_is_named_once_with_its_last_ticket() -> None:
    # Seen on four daemons under load: shares 200 and 201 lapsed while the round stalled, came
    # back to the same pipeline, and the round's contribution named [200, 201, 200, 201].
    ids, tickets = named_once([200, 201, 200, 201], ["a", "b", "c", "d"])
    assert ids == [200, 201]
    assert tickets == ["c", "d"]


def test_a_round_of_distinct_shares_is_unchanged() -> None:
    assert named_once([7, 3, 9], ["x", "y", "z"]) == ([7, 3, 9], ["x", "y", "z"])
    assert named_once([], []) == ([], [])


def test_the_order_is_that_of_each_share_last_done() -> None:
    assert named_once([1, 2, 1, 3], ["a", "b", "c", "d"]) == ([2, 1, 3], ["b", "c", "d"])
