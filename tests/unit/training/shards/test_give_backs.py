"""daemon/training/shards/give_backs.py: a sender is told of a give-back once a drop, and the
memory of whom was told is bounded."""

from __future__ import annotations

import pytest

from swarmd.training.shards.give_backs import GiveBackNotices

pytestmark = pytest.mark.timeout(10)


def test_each_sender_is_told_once_a_drop_and_a_second_drop_is_news_again() -> None:
    notices = GiveBackNotices()
    assert notices.untold("cell-0", {7: 1, 8: 1}) == {7: 1, 8: 1}
    notices.tell("cell-0", {7: 1})
    assert notices.untold("cell-0", {7: 1, 8: 1}) == {8: 1}
    assert notices.untold("cell-1", {7: 1}) == {7: 1}  # another sender has not been told
    assert notices.untold("cell-0", {7: 2}) == {7: 2}  # given back again by a later drop


def test_the_oldest_notices_are_forgotten_past_the_limit() -> None:
    notices = GiveBackNotices(limit=2)
    for i in range(3):
        notices.tell("cell-0", {i: 1})
    assert notices.untold("cell-0", {0: 1, 1: 1, 2: 1}) == {0: 1}
