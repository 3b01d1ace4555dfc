"""Grids for a shape: which devices form each pipeline, in which order, before any search.

On the data path of ``docs/data-path.md`` a pipeline's cells exchange activations only with
their neighbours, and each cell exchanges its weights only with its stage's shard servers:
stage groups no longer reduce among themselves. So pipelines are built first, each of devices
close for the activations (``balanced_clusters`` on the activation links' times), each ordered
along its cheapest open path (``open_path``), turned so that its first stage, which keeps the
most activations in flight, is on the device with the most memory; then each boundary is
re-paired across pipelines so that the links' times sum least (``rematch``). One stage is the
degenerate case: the devices themselves, best first.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.optimize import linear_sum_assignment

from swarmd.peers.planning.open_path import best_stage_order
from swarmd.peers.planning.scenario import Shape
from swarmd.peers.planning.transfers import Links

LARGE = 200
"""Past this many candidates, clustering places devices in batches and fewer candidate pools
are drawn, so that a thousand devices plan in seconds."""


def balanced_clusters(d: np.ndarray, candidates: np.ndarray, k: int, size: int) -> list[np.ndarray]:
    """``k`` clusters of exactly ``size`` devices from ``candidates`` (at least ``k * size``),
    close under ``d`` (symmetric, among the candidates, in their order): seeds spread by
    farthest-point, then devices placed in order of regret (how much worse their second-best
    cluster is), each cluster's distance the mean to its members so far. Devices left over are
    the ones farthest from every cluster."""
    cand = np.asarray(candidates)
    # The first seed: the device with the tightest neighbourhood of ``size``.
    tight = np.sort(np.partition(d, size - 1, axis=1)[:, :size], axis=1).sum(axis=1)
    seeds = [int(np.argmin(tight))]
    nearest = d[seeds[0]].copy()
    for _ in range(1, k):
        nearest_masked = nearest.copy()
        nearest_masked[seeds] = -np.inf
        seeds.append(int(np.argmax(nearest_masked)))
        nearest = np.minimum(nearest, d[seeds[-1]])
    members: list[list[int]] = [[s] for s in seeds]
    sums = d[:, seeds].copy()  # sum of distances from each device to each cluster's members
    open_ = np.ones(k, dtype=bool)
    unplaced = np.setdiff1d(np.arange(len(cand)), seeds)
    need = k * size - k
    while need > 0:
        counts = np.array([len(m) for m in members], dtype=float)
        mean = sums[unplaced] / counts[None, :]
        mean[:, ~open_] = np.inf
        if open_.sum() >= 2:
            two = np.partition(mean, 1, axis=1)[:, :2]
            regret = np.where(np.isfinite(two[:, 1]), two[:, 1] - np.minimum(two[:, 0], two[:, 1]), 0.0)
        else:
            regret = np.zeros(len(unplaced))
        choice = np.argmin(mean, axis=1)
        # Decided devices first (large regret), and among them the close ones. Small swarms
        # place one device per round; large ones a batch per round on the same means, which
        # keeps a thousand devices to a few dozen rounds.
        order = np.argsort(-(regret - mean[np.arange(len(unplaced)), choice]), kind="stable")
        batch = 1 if len(cand) <= LARGE else max(1, len(unplaced) // 16)
        done = []
        for row in order[:batch]:
            c = int(choice[row])
            if not open_[c] or need == 0:
                continue
            i = int(unplaced[row])
            members[c].append(i)
            sums[:, c] += d[:, i]
            done.append(row)
            need -= 1
            if len(members[c]) == size:
                open_[c] = False
        unplaced = np.delete(unplaced, done)
    return [cand[np.array(m)] for m in members]


def path_order(cost: np.ndarray) -> list[int]:
    """An open path through every node minimising the summed ``cost[a][b]`` of its steps
    (``swarmd.peers.planning.open_path``)."""
    if len(cost) == 0:
        return []
    return list(best_stage_order(cost)[0])


def rematch(grid: np.ndarray, links: Links) -> np.ndarray:
    """Re-pair the pipelines at every boundary so that the boundary's links' times sum least,
    stage by stage from the first (permuting the rows of the later stages together keeps the
    boundaries already matched). Pipelines run on their own, so the sum over them, not the
    slowest one, is what their throughput follows."""
    grid = grid.copy()
    for s in range(grid.shape[1] - 1):
        _, cols = linear_sum_assignment(links.activation_block(grid[:, s], grid[:, s + 1]))
        grid[:, s + 1 :] = grid[cols, s + 1 :]
    return grid


def pipelines_first(links: Links, candidates: np.ndarray, shape: Shape, memory_gib: np.ndarray) -> np.ndarray:
    """``shape.data_parallel`` pipelines of ``shape.stages`` devices from ``candidates``, each of
    devices close for the activations and ordered along its cheapest path, first stage on the
    end with more memory; then re-matched at every boundary."""
    if shape.stages == 1:
        return np.asarray(candidates[: shape.data_parallel], dtype=int)[:, None]
    pipes = balanced_clusters(links.activation_symmetric(candidates), candidates, shape.data_parallel, shape.stages)
    rows = []
    for members in pipes:
        row = members[path_order(links.activation_block(members, members))]
        rows.append(row if memory_gib[row[0]] >= memory_gib[row[-1]] else row[::-1])
    return rematch(np.stack(rows), links)


def candidate_pools(links: Links, usable: np.ndarray, shape: Shape, pools: int) -> list[np.ndarray]:
    """The device sets a construction draws from when the shape leaves devices out, each a
    quarter more than it needs so that the clustering can still pass over a bad one: the best
    (``usable`` is best first), and the tightest neighbourhoods on the activation graph (a seed
    and its nearest devices), from seeds that differ."""
    need = min(len(usable), math.ceil(shape.devices * 1.25))
    if need >= len(usable) or shape.stages == 1:
        return [usable]
    out = [usable[:need]]
    sub = links.activation_symmetric(usable)
    nearest = np.argsort(sub, axis=1)[:, :need]  # each row starts with the device itself
    tightness = np.take_along_axis(sub, nearest, axis=1).sum(axis=1)
    taken: set[int] = set()
    for seed in np.argsort(tightness):
        if len(out) > pools or int(seed) in taken:
            continue
        out.append(usable[nearest[seed]])
        taken.update(int(i) for i in nearest[seed])
    return out
