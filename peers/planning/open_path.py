"""The cheapest open path through a small complete graph: the order of pipeline stages.

Stage groups are nodes, ``edges[i, j]`` the cost of putting group ``j`` right after group ``i``
(the bottleneck matching of their links, DT-FM's coarsened graph); a pipeline is an open path
through all of them. Exact (Held-Karp over subsets, vectorised per subset size) up to
``EXACT_ORDER_MAX_STAGES`` nodes, else nearest neighbour from every start improved by 2-opt.
The planner and the DT-FM baseline both order stages with it.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

EXACT_ORDER_MAX_STAGES = 10
"""Up to this many stages the open path through the groups is found exactly (2^S * S^2 work);
past it, nearest neighbour and 2-opt."""


def best_stage_order(edges: np.ndarray) -> tuple[tuple[int, ...], float]:
    """The open path through all nodes of ``edges`` (``edges[i, j]``: cost of going i -> j) of
    least summed cost, and that cost: exact up to ``EXACT_ORDER_MAX_STAGES`` nodes, else nearest
    neighbour from every start improved by 2-opt."""
    s = len(edges)
    if s == 1:
        return (0,), 0.0
    if s <= EXACT_ORDER_MAX_STAGES:
        return _exact_path(edges)
    return _two_opt_path(edges)


@lru_cache(maxsize=EXACT_ORDER_MAX_STAGES)
def _subset_levels(s: int) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """For each subset size from 2 up: the subsets (bit masks), for each end node ``j`` the
    subset without ``j``, and whether ``j`` is in the subset at all."""
    bits = 1 << np.arange(s)
    masks = np.arange(1 << s)
    sizes = np.array([bin(m).count("1") for m in masks])
    levels = []
    for k in range(2, s + 1):
        level = masks[sizes == k]
        levels.append((level, level[:, None] ^ bits[None, :], (level[:, None] & bits[None, :]) != 0))
    return levels


def _exact_path(edges: np.ndarray) -> tuple[tuple[int, ...], float]:
    """Held-Karp over subsets, one numpy step per subset size: best[m, j] is the cheapest path
    through the nodes of ``m`` that ends at ``j``."""
    s = len(edges)
    best = np.full((1 << s, s), np.inf)
    best[1 << np.arange(s), np.arange(s)] = 0.0
    parent = np.zeros((1 << s, s), dtype=int)
    for level, without, member in _subset_levels(s):
        # via[m, j, i]: reach j from i, the path through m without j ending at i
        via = best[without] + edges.T[None, :, :]
        parent[level] = via.argmin(axis=2)
        best[level] = np.where(member, via.min(axis=2), np.inf)
    mask = (1 << s) - 1
    end = int(np.argmin(best[mask]))
    total = float(best[mask, end])
    order = [end]
    while mask != 1 << end:
        prev = int(parent[mask, end])
        mask ^= 1 << end
        end = prev
        order.append(end)
    return tuple(reversed(order)), total


@lru_cache(maxsize=8)
def _reversals(s: int) -> np.ndarray:
    """Every 2-opt move on a path of ``s`` nodes, as index arrays: positions i..j reversed."""
    moves = []
    for i in range(s - 1):
        for j in range(i + 1, s):
            idx = np.arange(s)
            idx[i : j + 1] = idx[i : j + 1][::-1]
            moves.append(idx)
    return np.array(moves)


def _path_costs(edges: np.ndarray, orders: np.ndarray) -> np.ndarray:
    return edges[orders[:, :-1], orders[:, 1:]].sum(axis=1)


def _two_opt_path(edges: np.ndarray) -> tuple[tuple[int, ...], float]:
    s = len(edges)
    # nearest neighbour from every start at once
    orders = np.empty((s, s), dtype=int)
    orders[:, 0] = np.arange(s)
    seen = np.eye(s, dtype=bool)
    for k in range(1, s):
        step = np.where(seen, np.inf, edges[orders[:, k - 1]]).argmin(axis=1)
        orders[:, k] = step
        seen[np.arange(s), step] = True
    costs = _path_costs(edges, orders)
    order, cost = orders[int(np.argmin(costs))], float(costs.min())
    # best-improvement 2-opt; reversing a segment turns its edges round, so costs are recounted
    while True:
        moves = order[_reversals(s)]
        costs = _path_costs(edges, moves)
        k = int(np.argmin(costs))
        if costs[k] >= cost - 1e-12 * max(1.0, abs(cost)):
            return tuple(int(d) for d in order), cost
        order, cost = moves[k], float(costs[k])
