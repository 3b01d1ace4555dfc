"""How many of the model's layers each stage runs: a split for pipelines that run on their own.

Every pipeline uses the same cut (a stage's shards hold one range of layers), but pipelines do
not wait for one another: the swarm trains at the sum of their rates, each set by its slowest
stage. ``split_layers`` gives each further layer to the stage where it costs that sum least,
within every member's memory (``plan_cost.cell_layer_caps``); layers that fit nowhere are
reported, not dropped.
"""

from __future__ import annotations

import numpy as np

from swarmd.peers.planning.plan_cost import even_layers
from swarmd.peers.planning.scenario import Scenario


class LayerSplitter:
    """Layer splits over one scenario for grids of a given stage count, memoised on what a
    split depends on (the grid's speeds and capacities: most of a search's moves change neither)."""

    MEMO = 50_000

    def __init__(self, view: Scenario, caps: np.ndarray, *, even: bool = False) -> None:
        """``caps[d, s]``: the layers device ``d`` holds at stage ``s`` (``cell_layer_caps``);
        ``even``: every split is ``even_layers`` (what fits is still checked against ``caps``)."""
        self.even = even
        self.total = view.model.layers
        self.layer_flops = view.model.layer_flops_per_sequence()
        self.head_flops = view.model.head_flops_per_sequence()
        self.speed = view.device_arrays.tflops * 1e12
        self.caps = caps
        self._memo: dict[bytes, tuple[np.ndarray, int]] = {}

    def stage_caps(self, grid: np.ndarray) -> np.ndarray:
        """The layers each stage can take: what its member with least room holds there."""
        return self.caps[grid, np.arange(grid.shape[1])[None, :]].min(axis=0)

    def split(self, grid: np.ndarray) -> tuple[tuple[int, ...], int]:
        """Layers per stage for ``grid`` and how many of the model's fit on no stage."""
        speed = self.speed[grid]
        caps = self.stage_caps(grid)
        if self.even:
            fixed = np.asarray(even_layers(self.total, grid.shape[1]))
            return tuple(int(x) for x in fixed), int(np.maximum(0, fixed - caps).sum())
        key = speed.tobytes() + caps.tobytes()
        found = self._memo.get(key)
        if found is None:
            if len(self._memo) > self.MEMO:
                self._memo.clear()
            found = self._memo[key] = self._split(speed, caps)
        return tuple(int(x) for x in found[0]), found[1]

    def _split(self, speed: np.ndarray, caps: np.ndarray) -> tuple[np.ndarray, int]:
        n_stages = speed.shape[1]
        head = np.zeros(n_stages)
        head[-1] = self.head_flops
        layers = np.ones(n_stages, dtype=int)
        if n_stages == 1:
            layers[0] = min(self.total, int(caps[0]))
            return layers, self.total - int(layers[0])
        # Closed form first (each stage's share of the summed speed), then exact greedy steps.
        share = speed.sum(axis=0) / speed.sum()
        start = np.floor(
            (self.total * self.layer_flops + head.sum()) * share / self.layer_flops - head / self.layer_flops
        )
        layers = np.clip(start.astype(int), 1, np.maximum(caps, 1))
        while layers.sum() > self.total:
            layers[int(np.argmax(np.where(layers > 1, self._rates_without(layers, speed, head), -np.inf)))] -= 1
        while layers.sum() < self.total:
            gain = self._rates_with(layers, speed, head)
            gain[layers >= caps] = -np.inf
            s = int(np.argmax(gain))
            if not np.isfinite(gain[s]):
                return layers, self.total - int(layers.sum())
            layers[s] += 1
        return self._polish(layers, speed, head, caps), 0

    def _polish(self, layers: np.ndarray, speed: np.ndarray, head: np.ndarray, caps: np.ndarray) -> np.ndarray:
        """Move single layers between stages while that raises the summed rate: adding layers
        one at a time can stall where the pipelines' slowest stages differ."""
        n = len(layers)
        moves = np.array([(a, b) for a in range(n) for b in range(n) if a != b])
        step = np.zeros((len(moves), n), dtype=int)
        step[np.arange(len(moves)), moves[:, 0]] -= 1
        step[np.arange(len(moves)), moves[:, 1]] += 1
        current = float(self._rates(layers[None, :], speed, head)[0])
        for _ in range(self.total * n):
            trial = layers[None, :] + step
            ok = (trial >= 1).all(axis=1) & (trial <= np.maximum(caps, 1)[None, :]).all(axis=1)
            if not ok.any():
                break
            rates = np.where(ok, self._rates(np.maximum(trial, 1), speed, head), -np.inf)
            best = int(np.argmax(rates))
            if rates[best] <= current * (1 + 1e-12):
                break
            layers, current = trial[best], float(rates[best])
        return layers

    def _rates(self, layers: np.ndarray, speed: np.ndarray, head: np.ndarray) -> np.ndarray:
        """For each row of ``layers`` (splits), the summed rate of the pipelines (per second)."""
        step = (layers[:, None, :] * self.layer_flops + head) / speed[None, :, :]
        return (1.0 / step.max(axis=2)).sum(axis=1)

    def _rates_with(self, layers: np.ndarray, speed: np.ndarray, head: np.ndarray) -> np.ndarray:
        """The summed rate after one more layer on each stage in turn."""
        return self._rates(layers[None, :] + np.eye(len(layers), dtype=int), speed, head)

    def _rates_without(self, layers: np.ndarray, speed: np.ndarray, head: np.ndarray) -> np.ndarray:
        return self._rates(layers[None, :] - np.eye(len(layers), dtype=int), speed, head)
