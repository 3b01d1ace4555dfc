"""Local search on a grid: moves costed on the throughput model, on the pipelines they change.

With the swarm-wide figures held (``throughput.Frozen``: the servers' step rate, their cap),
a pipeline's trained tokens per second depend only on its own devices, so a move (a cell's
device for a spare, two cells' devices swapped) is costed on the one or two pipelines it
touches, many candidates at once (``ThroughputModel.rows``). The planner settles the swarm-wide
figures again between searches. Moves that do not fit a device's memory are not made.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from swarmd.peers.planning.throughput import Frozen, ThroughputModel
from swarmd.peers.planning.transfers import StageShards
from swarmd.peers.taskpool.exchange import ExchangeConfig

SHORTLIST = 64
"""Spares costed per cell at most: the fastest half and a random half of the rest."""
SWAP_SAMPLE = 256
"""Cells a cell may trade with per move at most (all on a small grid): each candidate is a
pair of pipelines to cost, and a thousand-device grid has a thousand cells."""
IMPROVEMENT = 1e-6
"""A move must raise the swarm's tokens per second by this fraction to count."""


@dataclass(frozen=True)
class Move:
    gain: float
    """Tokens per second the move adds."""
    spare: int | None = None
    """The spare that takes the cell ..."""
    trade: tuple[int, int] | None = None
    """... or the cell it trades devices with."""


class Search:
    """Improving moves on ``grid`` until none is left or ``deadline`` passes (``run``)."""

    def __init__(
        self,
        model: ThroughputModel,
        grid: np.ndarray,
        spare: Iterable[int],
        layers: tuple[int, ...],
        stages: list[StageShards],
        settings: ExchangeConfig,
        frozen: Frozen,
        caps: np.ndarray,
        deadline: float,
        seed: int,
    ) -> None:
        self.model, self.layers, self.stages, self.settings, self.frozen = model, layers, stages, settings, frozen
        self.grid = grid.copy()
        self.spare = list(spare)
        self.caps, self.need = caps, np.asarray(layers)
        self.deadline = deadline
        self.rng = np.random.default_rng(seed)
        self.tokens = self.rates(self.grid)
        self.moves = 0

    def rates(self, rows: np.ndarray) -> np.ndarray:
        return self.model.rows(rows, self.layers, self.stages, self.settings, self.frozen).tokens_per_s

    def fits(self, devices: np.ndarray, stages: np.ndarray) -> np.ndarray:
        return self.caps[devices, stages] >= self.need[stages]

    def improve_cell(self, p: int, s: int, within: set[tuple[int, int]] | None = None) -> bool:
        """The best move of cell (p, s): its device for a spare, or traded with another cell
        (of ``within`` only, when given). True if one was made."""
        floor = IMPROVEMENT * max(float(self.tokens.sum()), 1e-12)
        moves = [m for m in (self._best_spare(p, s), self._best_trade(p, s, within)) if m is not None]
        best = max(moves, key=lambda m: m.gain, default=None)
        if best is None or best.gain <= floor:
            return False
        self._apply(p, s, best)
        return True

    def _best_spare(self, p: int, s: int) -> Move | None:
        spares = self._shortlist()
        ok = spares[self.fits(spares, np.full(len(spares), s))] if spares.size else spares
        if not ok.size:
            return None
        rows = np.repeat(self.grid[p][None, :], len(ok), axis=0)
        rows[:, s] = ok
        gain = self.rates(rows) - self.tokens[p]
        i = int(np.argmax(gain))
        return Move(float(gain[i]), spare=int(ok[i]))

    def _best_trade(self, p: int, s: int, within: set[tuple[int, int]] | None) -> Move | None:
        n_pipes, n_stages = self.grid.shape
        if n_stages < 2:
            return None  # one-cell pipelines: a trade changes nothing
        others = [(q, t) for q in range(n_pipes) for t in range(n_stages) if (q, t) != (p, s)]
        if within is not None:
            others = [c for c in others if c in within]
        if len(others) > SWAP_SAMPLE:
            others = [others[i] for i in self.rng.choice(len(others), SWAP_SAMPLE, replace=False)]
        if not others:
            return None
        here = int(self.grid[p, s])
        q, t = np.array([c[0] for c in others]), np.array([c[1] for c in others])
        there = self.grid[q, t]
        ok = self.fits(there, np.full(len(q), s)) & self.fits(np.full(len(q), here), t)
        q, t, there = q[ok], t[ok], there[ok]
        if not q.size:
            return None
        mine = np.repeat(self.grid[p][None, :], len(q), axis=0)
        mine[np.arange(len(q)), s] = there
        theirs = self.grid[q].copy()
        theirs[np.arange(len(q)), t] = here
        same = q == p  # a trade inside the pipeline: one row with both cells changed
        mine[same, t[same]] = here
        rates = self.rates(np.concatenate([mine, theirs[~same]]))
        gain = rates[: len(q)] - self.tokens[p]
        gain[~same] += rates[len(q) :] - self.tokens[q[~same]]
        i = int(np.argmax(gain))
        return Move(float(gain[i]), trade=(int(q[i]), int(t[i])))

    def _apply(self, p: int, s: int, move: Move) -> None:
        if move.trade is None:
            assert move.spare is not None
            self.spare[self.spare.index(move.spare)] = int(self.grid[p, s])
            self.grid[p, s] = move.spare
            touched = [p]
        else:
            q, t = move.trade
            self.grid[p, s], self.grid[q, t] = self.grid[q, t], self.grid[p, s]
            touched = sorted({p, q})
        self.tokens[touched] = self.rates(self.grid[touched])
        self.moves += 1

    def _shortlist(self) -> np.ndarray:
        pool = np.asarray(self.spare, dtype=int)
        if len(pool) <= SHORTLIST:
            return pool
        speed = self.model.speed[pool]
        fastest = np.argsort(-speed, kind="stable")[: SHORTLIST // 2]
        rest = np.setdiff1d(np.arange(len(pool)), fastest)
        drawn = self.rng.choice(rest, SHORTLIST - len(fastest), replace=False)
        return pool[np.sort(np.concatenate([fastest, drawn]))]

    def critical_cells(self) -> list[tuple[int, int]]:
        """The cells of the pipelines that train least, worst first."""
        worst = np.argsort(self.tokens, kind="stable")[: max(1, min(4, len(self.tokens)))]
        return [(int(p), s) for p in worst for s in range(self.grid.shape[1])]

    def run(self) -> None:
        while time.perf_counter() < self.deadline:
            if any(self.improve_cell(p, s) for p, s in self.critical_cells()):
                continue
            if not self._sweep():
                break

    def _sweep(self) -> bool:
        """One pass over every cell in random order; True if anything improved."""
        n_pipes, n_stages = self.grid.shape
        improved = False
        for k in self.rng.permutation(n_pipes * n_stages):
            if time.perf_counter() >= self.deadline:
                break
            improved |= self.improve_cell(int(k) // n_stages, int(k) % n_stages)
        return improved
