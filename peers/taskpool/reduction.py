"""Reduction groups: a stage's cells sum their contributions before the shard servers.

With ``N`` pipelines and ``K`` shards, every round each server takes ``N`` slices of ``P / K``
elements: ``N / K`` cells' worth of bytes through one link. Where ``N > K`` the plan cuts each
stage's pipelines into **groups** of ``G = ceil(N / K)`` consecutive pipelines (the planner
orders pipelines so that neighbours are near each other). For shard ``k`` one member of the
group, its **head** (``group[k mod |group|]``, so the shards' heads are spread over the
members), takes the group's slices of that shard, sums those that build on about the same
version (``summable``; weighted by their micro-batches: a mean over all of them) and sends the server one
contribution that covers all their shares. A server then takes about ``K`` slices per round,
one cell's worth of bytes, and each member sends and receives about one stage's worth (the
reduce-scatter of an all-reduce, ending at the servers instead of going round again).

The deltas come back the same way: a member pulls shard ``k`` from its head for ``k``, which
pulls it from the server and keeps the last ``HEAD_KEEP_VERSIONS`` deltas as they came, and
asks the server, with its own pulls, which of its members' share IDs are committed. A server
then sends each delta to about ``K`` heads instead of ``N`` cells.

The group tolerates a member that is slow or gone: a head waits for the group's live members
at most ``reduce_wait_s`` (a share of the round, bounded), then sends what it has; a member
whose head does not answer sends its slice straight to the server. A combined contribution is
taken whole or not at all (``AlreadyApplied`` when any of its shares is already in, after a
member's direct resend): the head then forwards the members' own slices one by one, which the
server takes once each. So a head that dies mid-reduction costs the time until its members
notice, never an update.

Pure functions: the daemon's cells and reducers, the planner's cost model and the simulator
use the same ones.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from swarmd.peers.records.plan_record import MAX_GROUP

HEAD_KEEP_VERSIONS = 4
"""Deltas a head keeps of each shard it heads, for its members' pulls: members pull as soon as
the head has a version, so a few cover them; one further behind pulls from the server."""
REDUCE_WAIT_FRACTION = 1.0
"""A head waits for its group at most a round after the first slice came: every member sends
one a round, and a server steps once about a round of every pipeline is in, so a slice that
waits for its group's others delays the step hardly at all; a shorter wait catches few of the
others where pipelines run local steps at their own pace (measured in the simulator: with a
quarter round, 88% of a 64-device swarm's buckets went with one slice)."""
REDUCE_WAIT_S = (1.0, 900.0)
"""The bounds of that wait: a round of a few seconds still gives late members a second; no
slice waits more than 15 minutes for a member that may be gone."""
SUM_BASE_SPREAD = 1
"""Versions a part's base may lag the bucket's newest and still go into its sum."""


def group_size(pipelines: int, shards: int) -> int:
    """G: the pipelines per group of a stage with ``shards`` shards (1: no reduction, each cell
    sends to the servers itself).

    With ``K >= G`` every member heads about ``K / G`` shards and takes about one stage's worth
    of slices; ``G = ceil(N / K)`` then leaves each server about one slice a round. With fewer
    shards than that, only ``K`` members head and each takes ``(G - 1) / K`` stages' worth,
    while a server takes ``N / G / K``: the two balance at ``G = sqrt(N)`` (with one shard and
    64 pipelines, one group of 64 would pour 63 slices into one head)."""
    if pipelines < 1 or shards < 1:
        raise ValueError(f"{pipelines} pipelines, {shards} shards: both must be >= 1")
    if pipelines <= shards:
        return 1
    return min(MAX_GROUP, math.ceil(pipelines / shards), math.ceil(math.sqrt(pipelines)))


def groups(pipelines: int, size: int) -> list[range]:
    """The groups of consecutive pipeline indices, ``size`` each (the last may be smaller)."""
    if pipelines < 0 or size < 1:
        raise ValueError(f"{pipelines} pipelines in groups of {size}: need pipelines >= 0 and size >= 1")
    return [range(g, min(g + size, pipelines)) for g in range(0, pipelines, size)]


def group_of(pipeline: int, pipelines: int, size: int) -> range:
    """The group pipeline ``pipeline`` belongs to."""
    if not 0 <= pipeline < pipelines:
        raise ValueError(f"pipeline {pipeline} is not one of {pipelines}")
    first = (pipeline // size) * size
    return range(first, min(first + size, pipelines))


def head_of(pipeline: int, pipelines: int, size: int, shard: int) -> int | None:
    """The pipeline whose cell reduces ``pipeline``'s slices of ``shard`` (None: the cell sends
    them to the server itself, being in no group of two or more)."""
    members = group_of(pipeline, pipelines, size)
    if len(members) < 2:
        return None
    return members[shard % len(members)]


def reduce_wait_s(round_s: float) -> float:
    """How long a head waits for its group's slices after the first one, for rounds of ``round_s``."""
    low, high = REDUCE_WAIT_S
    return min(high, max(low, REDUCE_WAIT_FRACTION * max(0.0, round_s)))


def summable(bases: Sequence[int]) -> tuple[list[int], int]:
    """Which of a bucket's parts (by their base versions) go into one sum, and its base: those
    within ``SUM_BASE_SPREAD`` versions of the newest, at the oldest of their bases (the server
    weighs the sum by that base's staleness: a part one version fresher counts as the older
    one, a few per cent less in local mode and the same in gradient mode). Parts further behind
    go by themselves. Pipelines that run H local steps end their rounds at their own times and
    rebase at their own pulls, so a head that summed only equal bases would sum almost none."""
    if not bases:
        raise ValueError("a bucket without parts has nothing to sum")
    newest = max(bases)
    chosen = [i for i, b in enumerate(bases) if b >= newest - SUM_BASE_SPREAD]
    return chosen, min(bases[i] for i in chosen)


def mean_factors(micro_batches: Sequence[int]) -> list[float]:
    """The factor of each part of a combined contribution: each part is a mean over its
    micro-batches, so the combined mean weighs each by its share of all of them."""
    total = sum(micro_batches)
    if not micro_batches or min(micro_batches) < 1:
        shown = list(micro_batches)[:8]
        raise ValueError(f"a combined contribution needs parts of at least one micro-batch each, got {shown}")
    return [m / total for m in micro_batches]
