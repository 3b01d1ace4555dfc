"""The pool as this peer last read it, as the shard side's parts see it.

``PoolView`` is what changes from round to round, read when it is needed: the books of the last
reading of the pool, the assignment in force, who holds a cell or a shard, whom share tickets
are believed from, the exchange's settings. The trainer implements it; a part's test fakes it
with a small dataclass.
"""

from __future__ import annotations

from typing import Protocol

from swarmd.peers.taskpool.exchange import ExchangeConfig
from swarmd.peers.taskpool.servers import Shard
from swarmd.training.bookkeeping import Books
from swarmd.training.shards.contributors import ContributorPool


class PoolView(ContributorPool, Protocol):
    """The pool as this peer last read it (the trainer's books), and what follows from it."""

    @property
    def books(self) -> Books: ...

    @property
    def reachable(self) -> frozenset[str]:
        """Every live member, workers or not (a paused one still serves what it handed back)."""
        ...

    def shard_holder(self, key: Shard) -> str | None: ...

    def exchange_settings(self) -> ExchangeConfig: ...
