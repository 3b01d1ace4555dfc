"""A grid's exchange schedule and roles: k, the shard servers, H, the relays and the spares.

Each rule is a pure function of the grid and the scenario as the planner sees it, so that the
full plan and a repair choose alike (``docs/data-path.md`` for what the words mean).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from swarmd.peers.planning.learning import LONGEST_FITTED_STEPS
from swarmd.peers.planning.plan_cost import Plan, stage_parameters
from swarmd.peers.planning.scenario import Scenario
from swarmd.peers.planning.throughput import Throughput, ThroughputModel
from swarmd.peers.planning.transfers import Links, PipelineTimes
from swarmd.peers.taskpool.exchange import MAX_LOCAL_STEPS
from swarmd.peers.taskpool.reduction import group_size

FILL_TARGET = 0.1
"""The share of a pipeline's time k may leave to filling and draining at each flush."""
MAX_SHARDS_PER_STAGE = 128
"""Each cell keeps a contribution and a long-poll open at every shard of its stage: past a
hundred or so concurrent streams a volunteer's daemon spends more on streams than on bytes."""
SERVER_RESERVE = 0.1
"""Of the devices that may serve, this share is left out of a stage's first choice, so that a
server that leaves is replaced in its place rather than its stage's shards cut anew."""
MIN_SHARD_ELEMENTS = 1 << 20
"""A shard of fewer parameters (2 MB in fp16) is mostly request overhead and round trips."""
HIDE_MARGIN = 1.25
"""H makes H shares of compute last this much longer than the exchange (and the busiest
server this far under its rate): measured links vary, and a round that only just hides its
exchange stalls on the first slow transfer."""
HIDE_QUANTILE = 0.9
"""H hides the exchange of the pipelines that carry this share of the tokens: one pipeline on
a poor link must not lengthen every other pipeline's rounds (it still trains, more slowly)."""
REDUCE_GAIN = 1.05
"""Reduction groups are kept only when predicted this much faster: they add a hop and a wait
that the model prices only through the links."""
LOCAL_STEP_ROUNDS = 5
"""H is raised at most this many times while the exchange does not hide (it converges in two
or three: the exchange hardly depends on H)."""
LONGER_GAIN = 1.02
"""Past the H that hides the exchange, H is doubled while that trains this much more effective
tokens per second, up to ``learning.LONGEST_FITTED_STEPS``: a longer round's contribution
arrives fewer server steps behind (a round late costs much, ``learning.staleness_gap``), while
raw tokens hardly change once the exchange hides. The simulator agrees: 200M on 256 devices
with churn, 8 pipelines, H = 35 / 70 / 140 (contributions 0.64 / 0.31 / 0.17 steps late)
trained 584,000 / 689,000 / 728,000 effective tokens/s."""


def share_micro_batches(times: PipelineTimes, batch_micro_batches: int, *, gradient: bool = False) -> int:
    """k: the fewest micro-batches per share for which a share's idle time costs at most
    ``FILL_TARGET`` of it, within the run's batch split over the pipelines (``ceil(batch / N)``).

    A share's idle time is what it takes beyond its micro-batches at the pipeline's bottleneck:
    the fill and drain at each flush (``exchange.fill_fraction``: ``S - 1`` micro-batches' worth
    when the stages are even) and the stage-0 cell's round trip to the ledger for the next share.
    It is paid once per share, so k must be large enough to amortise it: ``k >= idle / bottleneck
    x (1 - F) / F`` for the median pipeline. The round trip is asked for as a share opens and
    hides behind a share that long (``PipelineTimes.share_s``); k is sized as if it were paid,
    so that it hides with room to spare, whatever the link's round trip does meanwhile: sized
    only to outlast it, shares of 200M across regions fell from 26 micro-batches to 3, under a
    round trip of the median link, and the planner chose 23 pipelines of them, predicted 26%
    below the plan the old k gave.

    Why the fewest: past that, a longer share makes the pipeline no faster, but its
    contributions staler (a cell applies what the servers stepped only between shares) and, with
    H local steps, the inner steps fewer and larger; and each server step waits for
    ``step_micro_batches`` micro-batches, so a round of fewer of them (H must make ``H x k``
    outlast the exchange either way) brings fewer steps, and fewer deltas to pull, per round.
    Why within the batch split: with ``N x k`` above the batch, servers step more than once per
    round of every pipeline, and every round pulls several deltas of its stage's size and counts
    less for its staleness. Where even the split is too few, the pipeline pays the idle time,
    and fewer pipelines of more micro-batches is a shape the planner compares.

    In gradient mode (H = 1) a share is a whole round: its exchange can only hide behind its own
    compute, and a server steps only once ``batch`` micro-batches are in, so a share shorter
    than the split buys nothing but more exchanges per step: k is the split."""
    n_pipes = len(times.ledger_s)
    if n_pipes < 1 or batch_micro_batches < 1:
        raise ValueError(f"{n_pipes} pipelines, batch of {batch_micro_batches} micro-batches: both must be >= 1")
    if gradient:
        return math.ceil(batch_micro_batches / n_pipes)
    one, two = times.flush_s(1), times.flush_s(2)
    bottleneck = np.maximum(two - one, 1e-12)
    idle = float(np.median((one - bottleneck + times.ledger_s) / bottleneck))
    k = math.ceil(idle * (1.0 - FILL_TARGET) / FILL_TARGET - 1e-9)
    return max(1, min(k, math.ceil(batch_micro_batches / n_pipes)))


def shard_counts(view: Scenario, layers: Sequence[int], servers_available: int) -> list[int]:
    """K_s per stage: as many shards as the devices that may serve (less ``SERVER_RESERVE`` of
    them), ``MAX_SHARDS_PER_STAGE`` and shards of ``MIN_SHARD_ELEMENTS`` allow.

    A cell's exchange is its slowest shard link's (latency and that shard's bytes) or all of its
    bytes through its interface, whichever is longer: more shards shorten the first until the
    second, which no sharding changes, decides. Across regions a cell's slowest link to some
    server is a tenth of its interface or less, so that takes the most shards there are. And a
    server then carries ``N / K_s`` cells' worth of traffic: with ``K_s >= N`` no more than one
    cell does, so no server link is the bottleneck (where ``K_s < N``, H makes rounds long
    enough for the servers: ``choose_local_steps``)."""
    available = servers_available - math.ceil(SERVER_RESERVE * servers_available) if servers_available > 1 else 1
    return [
        max(1, min(MAX_SHARDS_PER_STAGE, available, params // MIN_SHARD_ELEMENTS))
        for params in stage_parameters(view, layers)
    ]


def server_pool(view: Scenario, min_availability: float, among: np.ndarray, at_least: int = 1) -> np.ndarray:
    """Who may serve a shard, most dependable first: devices up at least ``min_availability``
    of the time, those that leave least often first (a server's departure stalls its stage
    until its standby takes over), then the faster interfaces; where fewer than ``at_least``
    pass, the most available of the others after them."""
    arrays = view.device_arrays
    among = np.asarray(among, dtype=int)
    avail = arrays.availability[among]
    ok = among[avail >= min_availability]
    up, down = view.interface_Bps
    ok = ok[np.lexsort((-np.minimum(up[ok], down[ok]), arrays.leave_rate_per_s[ok]))]
    if len(ok) >= at_least:
        return ok
    rest = among[avail < min_availability]
    return np.concatenate([ok, rest[np.argsort(-arrays.availability[rest], kind="stable")]])


def choose_servers(
    view: Scenario,
    grid: np.ndarray,
    layers: Sequence[int],
    pool: np.ndarray,
    counts: Sequence[int],
    keep: Sequence[Sequence[int]] | None = None,
) -> tuple[tuple[int, ...], ...]:
    """Each stage's ``counts[s]`` servers from ``pool``: shard by shard, the device whose
    exchange of one shard with the stage's cells is quickest (latency and the shard's bytes
    both ways, over the cells' links), counted twice for a device that holds a cell (its
    interface already carries the cell's traffic) and once more for every shard it was given
    already. ``keep[s][k]``: shard k's server to keep in its place (-1: none, choose one), as a
    repair keeps what the swarm has replicated. Holes in the grid (-1, a repair's) are no cells."""
    pool = np.asarray(pool, dtype=int)
    where = {int(d): i for i, d in enumerate(pool)}
    load = np.isin(pool, grid).astype(float)
    params = stage_parameters(view, layers)
    lat, bw = view.latency_s, view.bandwidth_Bps
    out = []
    for s, count in enumerate(counts):
        kept = list(keep[s])[:count] if keep is not None and s < len(keep) else []
        chosen = [int(d) for d in kept] + [-1] * (count - len(kept))
        taken = np.zeros(len(pool), dtype=bool)
        for d in chosen:
            if d in where:
                taken[where[d]] = True
                load[where[d]] += 1
        holes = [k for k, d in enumerate(chosen) if d < 0]
        if holes:
            members = grid[:, s]
            members = members[members >= 0]
            if not len(members):
                members = pool
            nbytes = 2.0 * params[s] / count
            reach = (
                lat[np.ix_(members, pool)]
                + lat[np.ix_(pool, members)].T
                + nbytes / bw[np.ix_(members, pool)]
                + nbytes / bw[np.ix_(pool, members)].T
            ).mean(axis=0)
        for slot in holes:
            if taken.all():
                raise ValueError(f"stage {s} needs {count} shard servers; the pool holds {len(pool)} devices")
            i = int(np.argmin(np.where(taken, np.inf, reach * (1.0 + load))))
            chosen[slot] = int(pool[i])
            taken[i] = True
            load[i] += 1
        out.append(tuple(chosen))
    return tuple(out)


def reduction_options(pipelines: int, servers: Sequence[Sequence[int]], gradient: bool) -> list[tuple[int, ...]]:
    """The reductions a grid of ``pipelines`` may use: none, and, in gradient mode where some
    stage has more pipelines than shards (each server would take several cells' slices a
    round), groups of ``reduction.group_size`` in every stage. The planner prices both and
    keeps the faster by ``REDUCE_GAIN``: a group moves a server's load onto its members' links,
    which is a loss where servers have far faster links than the cells.

    Why gradient mode only: there every pipeline waits for the step its round went into, so
    the group's rounds end together and a head's wait costs nothing. With H local steps each
    pipeline runs at its own pace, and a member whose slice waits at its head for the others
    (at most one may be undelivered) is held to the group's slowest pace: simulated on 64
    devices (200M, H = 79, groups of 2), 1.06M tokens/s against 2.42M without groups, where
    the model, which does not price that coupling, predicted the same for both."""
    sizes = tuple(group_size(pipelines, len(row)) for row in servers)
    return [()] if not gradient or max(sizes, default=1) <= 1 else [(), sizes]


def regroup(previous: Sequence[int], pipelines: int, servers: Sequence[Sequence[int]]) -> tuple[int, ...]:
    """A repair's reduction: the previous plan's choice (to reduce or not) at the new sizes."""
    if max(previous, default=1) <= 1:
        return ()
    return reduction_options(pipelines, servers, gradient=True)[-1]


def choose_local_steps(model: ThroughputModel, plan: Plan, *, start: int = 2) -> tuple[int, Throughput]:
    """The H >= ``start`` that trains the most effective tokens per second, with the plan's
    throughput at it. First the smallest H for which the exchange hides behind H shares of
    compute with ``HIDE_MARGIN`` to spare, for the pipelines that carry ``HIDE_QUANTILE`` of the
    tokens, and the busiest server stays that far under its rate (its load falls as rounds
    lengthen): found by raising H to what the exchange at the current H asks (it hardly depends
    on H, so this settles in a few rounds). Raw tokens per second rise to there; what a token
    teaches falls as rounds lengthen (``learning.token_efficiency``), so H is then halved while
    that trains more effective tokens, or, where it does not, doubled while that trains
    ``LONGER_GAIN`` more (shorter rounds run staler)."""
    h = max(1, min(start, MAX_LOCAL_STEPS))
    result = model.evaluate(replace(plan, local_steps=h))
    for _ in range(LOCAL_STEP_ROUNDS):
        f = result.per_pipeline
        ratio = f.exchange_s / f.share_s
        order = np.argsort(ratio)
        weight = np.cumsum(f.tokens_per_s[order])
        at = int(np.searchsorted(weight, HIDE_QUANTILE * weight[-1])) if weight[-1] > 0 else len(order) - 1
        need = max(
            HIDE_MARGIN * float(ratio[order[min(at, len(order) - 1)]]), h * result.server_utilisation * HIDE_MARGIN
        )
        wanted = min(MAX_LOCAL_STEPS, max(h, math.ceil(need)))
        if wanted <= h:
            break
        h = wanted
        result = model.evaluate(replace(plan, local_steps=h))
    floor = max(1, min(start, MAX_LOCAL_STEPS))
    hid = h
    while h // 2 >= floor:
        shorter = model.evaluate(replace(plan, local_steps=h // 2))
        if shorter.effective_tokens_per_s <= result.effective_tokens_per_s:
            break
        h, result = h // 2, shorter
    while h == hid and h > 1 and 2 * hid <= min(MAX_LOCAL_STEPS, LONGEST_FITTED_STEPS):
        longer = model.evaluate(replace(plan, local_steps=2 * hid))
        if longer.effective_tokens_per_s < LONGER_GAIN * result.effective_tokens_per_s:
            break
        h = hid = 2 * hid
        result = longer
    return h, result


def routing_relays(view: Scenario, links: Links, grid: np.ndarray, min_availability: float) -> list[int]:
    """Reliable devices through which some pipeline link is faster than direct (forwarding in
    chunks: both latencies, the slower of the two bandwidths), best first; at most one per link."""
    if grid.shape[1] < 2:
        return []
    reliable = np.flatnonzero(view.device_arrays.availability >= min_availability)
    if len(reliable) == 0:
        return []
    chosen: dict[int, float] = {}
    for s in range(grid.shape[1] - 1):
        a, b = grid[:, s], grid[:, s + 1]
        direct = links.activation_s(a, b)[0]
        slowest = np.minimum(view.bandwidth_Bps[np.ix_(a, reliable)], view.bandwidth_Bps[np.ix_(reliable, b)].T)
        via = view.latency_s[np.ix_(a, reliable)] + view.latency_s[np.ix_(reliable, b)].T
        via += links.activation_bytes(slowest) / slowest
        via[(reliable[None, :] == a[:, None]) | (reliable[None, :] == b[:, None])] = np.inf
        best = np.argmin(via, axis=1)
        for p in np.flatnonzero(via[np.arange(len(a)), best] < direct):
            relay = int(reliable[best[p]])
            chosen[relay] = chosen.get(relay, 0.0) + float(direct[p] - via[p, best[p]])
    return sorted(chosen, key=lambda r: -chosen[r])


def spares(
    usable: np.ndarray, grid: np.ndarray, caps: np.ndarray, layers: Sequence[int], others: Sequence[int]
) -> tuple[int, ...]:
    """The devices outside the grid the plan gives a role: those that can hold some cell of it
    (``caps[d, s] >= layers[s]`` somewhere), in ``usable``'s order (best first), then the
    servers and relays among ``others`` that cannot."""
    placed = set(grid.ravel().tolist())
    need = np.asarray(layers)
    holders = [int(d) for d in usable if int(d) not in placed and (caps[int(d)] >= need).any()]
    rest = [int(d) for d in dict.fromkeys(others) if int(d) not in placed and int(d) not in set(holders)]
    return tuple(holders + rest)
