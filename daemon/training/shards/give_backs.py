"""Whom a shard server has told of the shares a dropped step gave back: each sender once a drop.

A step that comes out non-finite gives its shares back (``ShardShareIds.given_back``); their
cells must send them again, so a long poll that names one is answered at once. Only once per
sender and drop: until the resend lands the share stays unknown, and answering every poll at
once would spin the cell's polls. (A share never seen, still on its way, is unknown too and
ends no wait at all.)
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping

MAX_TOLD = 65_536
"""(Sender, share ID) pairs remembered as told, the oldest forgotten first."""


class GiveBackNotices:
    """The (sender, share ID) pairs told of a give-back, with the drop each was told of."""

    def __init__(self, limit: int = MAX_TOLD) -> None:
        self._limit = limit
        self._told: OrderedDict[tuple[str, int], int] = OrderedDict()

    def untold(self, sender: str, given_back: Mapping[int, int]) -> dict[int, int]:
        """Those of ``given_back`` (share ID -> drop) that ``sender`` has not been told of."""
        return {i: drop for i, drop in given_back.items() if self._told.get((sender, i)) != drop}

    def tell(self, sender: str, given_back: Mapping[int, int]) -> None:
        for i, drop in given_back.items():
            self._told[(sender, i)] = drop
            self._told.move_to_end((sender, i))
        while len(self._told) > self._limit:
            self._told.popitem(last=False)
