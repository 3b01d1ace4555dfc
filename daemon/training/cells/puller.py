"""A cell's weights from its stage's shards: a whole pull at first, then deltas by long poll.

One task per shard asks its current holder for a version newer than the one this cell has
fetched (``Pull``, waiting up to ``POLL_WAIT_S`` at the server): the answer carries every
committed delta since (fp16, exact) or, when the cell is too far behind or new, the whole slice
in fp32, and says which of the cell's pending share IDs that shard is done with (the
contributions learn their commits here). What arrives is kept until ``apply``, which the cell
calls between shares: the deltas go into the global copy in order, then the compute rebases
onto it (``CellCompute.rebase``).

A holder whose version is older than what this cell fetched (a take-over that could not
replay everything) is a new lineage: the cell pulls the whole slice again rather than adding
deltas to weights the server never had.

Where the plan groups the stage's pipelines, a shard this cell does not head is pulled from its
group's head for it (``PullFromHead``, ``swarmd.training.shards.head_relay``), and one it heads is pulled
from the server for the group: what comes is offered to the head's relay, and the pull asks
about the members' share IDs too. A head that cannot answer (gone, or the cell is new or too
far behind) sends the cell to the server for ``HEAD_RETRY_S``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypedDict

import torch

from swarmd.models.cell_compute import CellCompute
from swarmd.peers.taskpool.exchange import shard_range
from swarmd.peers.wire.codecs import decode_vector
from swarmd.peers.wire.errors import FrameError, RpcError
from swarmd.peers.wire.messages import Pull, Pulled, PullFromHead
from swarmd.training.cells.cell_facts import CellFacts, CellHandle
from swarmd.training.cells.contributions import Contributions

logger = logging.getLogger(__name__)

POLL_WAIT_S = 10.0
IN_VAIN_CHECK_S = 0.1
"""How often a wait for a step asks whether it waits in vain (the answer moves with the
contributions' deliveries, which do not wake it)."""
RETRY_S = (0.2, 5.0)
HEAD_RETRY_S = 5.0
"""After its group's head failed a pull, the cell pulls that shard from the server this long (a
head that has just opened its cell, or not yet read the member's lease, refuses at first)."""


@dataclass
class _ShardWeights:
    lo: int
    hi: int
    fetched: int = -1
    """The newest version received (applied or waiting)."""
    applied: int = -1
    """The version the compute's global copy holds."""
    full: tuple[int, torch.Tensor] | None = None
    deltas: list[tuple[int, torch.Tensor]] = field(default_factory=list)
    holder: str | None = None
    head_failed_at: float = -HEAD_RETRY_S


class PullRelay(Protocol):
    """This peer's head relays (``swarmd.training.shards.head_relay``), as a cell that heads a shard for its
    group uses it: the members' share IDs to ask about, and what was pulled, for them."""

    def asked(self, stage: int, shard: int) -> list[int]: ...

    async def offer(self, stage: int, shard: int, answer: Pulled, blobs: list[bytes]) -> None: ...


class _PullFields(TypedDict):
    """What a shard's ``Pull`` and ``PullFromHead`` share (``PullFromHead`` adds the pipeline)."""

    run_id: str
    stage: int
    shard: int
    shards: int
    have_version: int
    pending_share_ids: list[int]
    wait_s: float


class Puller:
    def __init__(
        self,
        facts: CellFacts,
        cell: CellHandle,
        compute: CellCompute,
        contributions: Contributions,
        reducer: PullRelay | None,
    ) -> None:
        """``contributions`` learn their commits from the pulls; ``reducer`` (None: no group here)
        is handed what this cell pulls of a shard it heads."""
        self.facts, self.cell, self.compute = facts, cell, compute
        self.contributions, self.reducer = contributions, reducer
        size, shards = compute.size, facts.shards
        self.shards = [_ShardWeights(*shard_range(size, shards, k)) for k in range(shards)]
        self._bases = [-1] * shards
        self._changed = asyncio.Event()
        self._arrived = asyncio.Event()
        self.full_pulls = 0
        self.delta_pulls = 0
        self.head_pulls = 0

    def start(self) -> list[asyncio.Task[None]]:
        return [
            asyncio.create_task(self._poll(k), name=f"cell {self.facts.cell} pull {k}") for k in range(len(self.shards))
        ]

    @property
    def loaded(self) -> bool:
        """Every shard's weights are in the compute (the cell may compute)."""
        return all(s.applied >= 0 for s in self.shards)

    @property
    def version(self) -> int:
        """The oldest version among this cell's shards (for status and messages)."""
        return min(s.applied for s in self.shards)

    def servers_changed(self) -> None:
        self._changed.set()

    def round_bases(self) -> list[int]:
        """Each shard's version the round's contribution builds on: the one applied when the
        round started (gradient mode), or at the last rebase (local mode)."""
        return list(self._bases)

    def round_started(self) -> None:
        if self.facts.settings.mode == "gradient":
            self._bases = [s.applied for s in self.shards]

    async def wait_past(self, bases: list[int], timeout_s: float, in_vain: Callable[[], bool] = lambda: False) -> bool:
        """Wait until every shard has sent a version past ``bases`` (the step our contribution
        went into), or ``in_vain()`` says none can come before this cell's next round (checked
        every ``IN_VAIN_CHECK_S``); False if ``timeout_s`` passed first (another pipeline is
        slow or gone)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while any(s.fetched <= base for s, base in zip(self.shards, bases, strict=True)):
            if in_vain():
                return True
            left = deadline - loop.time()
            if left <= 0:
                return False
            self._arrived.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._arrived.wait(), min(left, IN_VAIN_CHECK_S))
        return True

    async def apply(self) -> None:
        """Take up what arrived (between shares only)."""
        ready = [s for s in self.shards if s.full is not None or s.deltas]
        if not ready:
            return
        first_load = not self.loaded
        compute = self.compute
        for s in ready:
            full, deltas = s.full, s.deltas
            s.full, s.deltas = None, []
            if full is not None:
                await self.cell.in_thread(compute.load_global, s.lo, full[1])
                s.applied = full[0]
            if deltas:
                await self.cell.in_thread(compute.apply_deltas, s.lo, deltas)
                s.applied = deltas[-1][0]
        if first_load:
            if self.loaded:  # every slice is here: start from the global weights
                await self.cell.in_thread(lambda: compute.load_flat(compute.global_vector))
                self._bases = [s.applied for s in self.shards]
            return
        await self.cell.in_thread(compute.rebase)
        if self.facts.settings.mode == "local":
            self._bases = [s.applied for s in self.shards]

    async def _poll(self, k: int) -> None:
        s, delay = self.shards[k], RETRY_S[0]
        while True:
            servers = self.cell.view.servers
            holder = servers[k] if k < len(servers) else None
            if holder is None:
                self._changed.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), 1.0)
                continue
            if holder != s.holder:
                s.holder = holder
            head = self._head(k, s)
            pending = self.contributions.pending_for(k)
            reducer = self.reducer if self._heads(k) else None
            if reducer is not None:  # the members' IDs first: past the message's limit, the oldest go
                pending = reducer.asked(self.facts.stage, k) + pending
            # A long poll for the version after the newest fetched (applied or not): it also brings
            # the commits of our pending contributions, which happen with new versions only.
            fields = _PullFields(
                run_id=self.facts.run_id,
                stage=self.facts.stage,
                shard=k,
                shards=len(self.shards),
                have_version=s.fetched,
                pending_share_ids=list(dict.fromkeys(pending))[-4096:],
                wait_s=0.0 if s.fetched < 0 else POLL_WAIT_S,
            )
            request = Pull(**fields) if head is None else PullFromHead(**fields, pipeline=self.facts.pipeline)
            try:
                answer, blobs = await self.cell.send(head or holder, request, [], POLL_WAIT_S + 30.0)
                self._take(s, answer, blobs)
            except (RpcError, FrameError) as e:
                logger.debug("cell %s: pull of shard %d from %s failed (%s)", self.facts.cell, k, head or holder, e)
                if head is not None:  # the server answers instead, at once
                    s.head_failed_at = time.monotonic()
                    continue
                await asyncio.sleep(delay)
                delay = min(delay * 2, RETRY_S[1])
                continue
            self.head_pulls += head is not None
            if reducer is not None:
                await reducer.offer(self.facts.stage, k, answer, blobs)
            delay = RETRY_S[0]
            self._arrived.set()
            self.contributions.committed(k, set(answer.committed))
            if answer.unknown:  # a step it dropped: what went to the server, or to the head, goes again
                for recipient in {r for r in (holder, head) if r is not None}:
                    self.contributions.unknown(k, set(answer.unknown), recipient)

    def _heads(self, k: int) -> bool:
        """Whether this cell heads shard ``k`` for a group of two or more."""
        heads = self.cell.view.head_pipelines
        return k < len(heads) and heads[k] == self.facts.pipeline

    def _head(self, k: int, s: _ShardWeights) -> str | None:
        """Whom to pull shard ``k`` from instead of its server: the group's head for it, unless
        this cell is that head, or the head failed a pull lately (None: the server)."""
        heads, pipelines = self.cell.view.heads, self.cell.view.head_pipelines
        if k >= len(heads) or heads[k] is None or pipelines[k] in (None, self.facts.pipeline):
            return None
        if s.fetched < 0 or time.monotonic() - s.head_failed_at < HEAD_RETRY_S:
            return None
        return heads[k]

    def _take(self, s: _ShardWeights, answer: Any, blobs: list[bytes]) -> None:
        if answer.kind == "full":
            s.full = (answer.version, decode_vector(blobs[0], s.hi - s.lo, "fp32"))
            s.deltas, s.fetched = [], answer.version
            self.full_pulls += 1
        elif answer.kind == "deltas":
            for version, blob in zip(answer.versions, blobs, strict=True):
                s.deltas.append((version, decode_vector(blob, s.hi - s.lo, "fp16").to(torch.float16)))
            s.fetched = answer.versions[-1]
            self.delta_pulls += 1
        elif answer.version < s.fetched:  # the holder is behind us: another lineage, start over
            logger.info(
                "cell %s: shard at %d is behind our %d; pulling it whole", self.facts.cell, answer.version, s.fetched
            )
            s.fetched = -1

    def info(self) -> dict[str, Any]:
        return {
            "versions": [s.applied for s in self.shards],
            "full_pulls": self.full_pulls,
            "delta_pulls": self.delta_pulls,
            "head_pulls": self.head_pulls,
        }
