"""Small fakes of what a cell's parts are built from (``swarmd.training.cells.cell_facts``), for their unit tests.

``FakeCell`` is the handle a part calls its cell through: it records what is sent and told,
answers a request with ``answer`` (a function of the peer and request, sync or async; it may
raise as a peer would), runs the worker thread's jobs inline, and sleeps for real.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from swarmd.peers.taskpool.exchange import ExchangeConfig
from swarmd.training.cells.cell_facts import CellFacts, CellView

T = TypeVar("T")

RUN_ID = "tiny." + "a" * 24

Answer = Callable[[str, Any], "tuple[Any, list[bytes]] | Awaitable[tuple[Any, list[bytes]]]"]


def facts(cell: tuple[int, int] = (0, 1), stages: int = 2, shards: int = 1, **settings: Any) -> CellFacts:
    """Cell ``cell`` of ``stages`` stages with ``shards`` shards; k = 2 of a batch of 4 unless ``settings`` say."""
    config = ExchangeConfig(**{"batch_micro_batches": 4, "share_micro_batches": 2, **settings})
    return CellFacts(cell, stages, config, 4, RUN_ID, shards)


def nothing(peer: str, request: Any) -> tuple[Any, list[bytes]]:
    return None, []


@dataclass
class FakeCell:
    view: CellView = field(default_factory=lambda: CellView(epoch="e1", prev="prev", next="next", servers=["server"]))
    stopped: bool = False
    answer: Answer = nothing
    sent: list[tuple[str, Any, list[bytes]]] = field(default_factory=list)
    told: list[tuple[str, Any]] = field(default_factory=list)
    slept: list[float] = field(default_factory=list)

    async def send(self, peer: str, request: Any, blobs: list[bytes], timeout_s: float) -> tuple[Any, list[bytes]]:
        self.sent.append((peer, request, list(blobs)))
        result = self.answer(peer, request)
        return await result if inspect.isawaitable(result) else result

    def tell(self, peer: str, request: Any) -> None:
        self.told.append((peer, request))

    async def in_thread(self, fn: Callable[..., T], *args: Any, what: str = "compute") -> T:
        return fn(*args)

    async def timed(self, wait: Awaitable[Any]) -> None:
        await wait

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        await asyncio.sleep(seconds)
