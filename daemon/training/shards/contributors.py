"""Who may contribute to a shard, and for which pipelines' shares.

The rules a shard server applies before it reads a contribution's tensor
(``ShardServer.admit``).

Pure functions over the assignment in force and the pool's resolved holders, so that each is
tested without a server; ``ContributorPool`` is what they read of the trainer.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

from swarmd.peers.taskpool.assignment import Assignment
from swarmd.peers.taskpool.cells import Cell
from swarmd.peers.taskpool.exchange import ExchangeConfig
from swarmd.peers.taskpool.reduction import group_of, head_of
from swarmd.peers.taskpool.servers import Shard
from swarmd.peers.taskpool.tickets import TicketError, TicketVerifier, unpack_tickets
from swarmd.peers.wire.errors import BadRequest, NotHolder, RpcError
from swarmd.peers.wire.messages import Contribute


class ContributorPool(Protocol):
    """What ``ShardServer.admit`` reads of the pool (the trainer has it)."""

    @property
    def assignment(self) -> Assignment | None: ...

    def cell_holder(self, cell: Cell) -> str | None: ...

    def ledger_keepers(self) -> Sequence[str]:
        """The peers whose share tickets are believed (``swarmd.peers.taskpool.tickets``)."""
        ...


def contributor_refusal(
    key: Shard,
    settings: ExchangeConfig,
    a: Assignment,
    sender: str,
    request: Contribute,
    cell_holder: Callable[[Cell], str | None],
) -> tuple[str, RpcError] | None:
    """Why shard ``key`` refuses ``sender``'s contribution (the reason counted, the error to
    raise), or None: it holds a cell of the stage, sends a sum only as a head of a group of
    that size at most, and claims no more micro-batches than its shares hold."""
    stage = request.stage
    if stage >= a.stages:
        return "not_holder", NotHolder(f"the assignment here has {a.stages} stages; there is no stage {stage}")
    # The plan's holder, or the one the pool resolved (a spare standing in): a new holder is
    # heard once this peer's view has it; until then it gets NotHolder and sends again.
    own = [p for p in range(a.pipelines) if sender in (a.cells[p][stage], cell_holder((p, stage)))]
    if not own:
        return "not_holder", NotHolder(
            f"{sender[:16]} holds no cell of stage {stage} here; only the stage's cells contribute to shard {key}"
        )
    size = a.group_size(stage)
    if request.parts > 1:
        groups = [len(group_of(p, a.pipelines, size)) for p in own if head_of(p, a.pipelines, size, key[1]) == p]
        if not groups:
            return "not_holder", NotHolder(
                f"a sum of {request.parts} contributions to shard {key} comes only from its reduction head; "
                f"{sender[:16]} heads no group of stage {stage} for it"
            )
        if request.parts > max(groups):
            return "parts", BadRequest(
                f"a sum of {request.parts} contributions to shard {key}: the head's group has only {max(groups)} cells"
            )
    # A contribution's weight in the step is its micro-batches: a claim its shares cannot hold
    # would outweigh everyone else's. A share issued before a re-plan keeps its old k, so the
    # bound is generous (the batch, when that is more: the planner's k never exceeds it).
    k = max(a.share_micro_batches, settings.share_micro_batches, settings.batch_micro_batches)
    if request.micro_batches > k * len(request.share_ids):
        return "micro_batches", BadRequest(
            f"shard {key}: a contribution for {len(request.share_ids)} share(s) claims "
            f"{request.micro_batches} micro-batches; at most {k} per share"
        )
    return None


VERIFY_IN_THREAD = 32
"""Tickets past which a contribution's are checked off the event loop (about 0.1-0.3 ms each
the first time this server sees them)."""


def ticket_pipelines(key: Shard, a: Assignment, sender: str, cell_holder: Callable[[Cell], str | None]) -> set[int]:
    """The pipelines whose shares ``sender`` may contribute to shard ``key``: those whose cell of
    the stage it holds, and every member's of a group it heads for the shard (a head sends its
    members' slices, summed or one by one)."""
    stage, size = key[0], a.group_size(key[0])
    own = {p for p in range(a.pipelines) if sender in (a.cells[p][stage], cell_holder((p, stage)))}
    headed = [p for p in own if head_of(p, a.pipelines, size, key[1]) == p]
    return own.union(*(group_of(p, a.pipelines, size) for p in headed))


async def ticket_error(
    verifier: TicketVerifier, request: Contribute, tickets: bytes, pipelines: Iterable[int], keepers: Sequence[str]
) -> TicketError | None:
    """Why ``tickets`` (the contribution's second blob) do not vouch for ``request`` from a sender
    whose pipelines are ``pipelines``, or None (``swarmd.peers.taskpool.tickets``). Long lists
    are checked off the event loop: each ticket not seen before costs a signature check."""

    def check() -> TicketError | None:
        try:
            verifier.check(
                request.run_id,
                unpack_tickets(tickets, request.tickets),
                share_ids=request.share_ids,
                micro_batches=request.micro_batches,
                pipelines=pipelines,
                keepers=keepers,
                now=time.time(),
            )
        except TicketError as e:
            return e
        return None

    return await asyncio.to_thread(check) if request.tickets > VERIFY_IN_THREAD else check()
