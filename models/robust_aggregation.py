"""Robust statistics for a shard's contributions: a median that a few senders cannot drag, and
centred clipping of each contribution around the shard's last aggregate.

A shard combines a round's contributions into one step (``parameter_shard``). Their plain
weighted mean lets one contribution move the step as far as it likes; two defences live here:

- :class:`VoteMedian`, the running median behind every adaptive bound: each sender's recent
  values are reduced to its own median first, and the bound takes the lower median of those
  votes. A sender that sends a hundred huge contributions still casts one vote, and with two
  senders the honest (smaller) one decides, so an attacker holding fewer than half of the
  senders cannot raise a bound that is then used against the honest ones.
- :class:`CentredClip` (Karimireddy, He and Jaggi, "Learning from History for Byzantine Robust
  Optimization", ICML 2021): each contribution's difference from the centre ``v`` (the shard's
  previous aggregate, their "momentum" centre) is clipped to radius ``tau`` before it is
  averaged: ``v + sum_i w_i * clip(x_i - v, tau) / sum_i w_i``. One iteration with the previous
  aggregate as centre is the paper's recommended form, and it streams: every contribution is
  clipped as it comes, so the shard keeps one running sum, not a round of vectors. ``tau`` adapts
  to the honest spread: ``radius_factor`` times the :class:`VoteMedian` of recent distances,
  each recorded as clipped (an attacker's far-off vector counts as ``tau``, not as its distance).

A contribution may be a reduction head's mean of several cells' (``parts``); it is clipped as
one point with the weight of all its micro-batches. An honest mean lies closer to the centre
than its parts, so this never clips honest work harder than the parts alone would be.

Pure torch, no network.
"""

from __future__ import annotations

import statistics
from collections import defaultdict, deque

import torch

AGGREGATIONS = ("mean", "centred-clip")
"""How a shard combines a round's contributions (the run spec's ``exchange.aggregation``)."""


class VoteMedian:
    """A window of recent ``(sender, value)`` pairs; its median gives each sender one vote."""

    def __init__(self, window: int, warmup: int) -> None:
        if window < 1 or warmup < 1:
            raise ValueError(f"window = {window} and warmup = {warmup} must both be >= 1")
        self._warmup = warmup
        # Only the recent window counts: norms drift as training goes on.
        self._recent: deque[tuple[str, float]] = deque(maxlen=window)

    def __len__(self) -> int:
        return len(self._recent)

    def add(self, sender: str, value: float) -> None:
        self._recent.append((sender, value))

    def median(self) -> float | None:
        """The lower median of the senders' own medians; None below ``warmup`` values seen."""
        if len(self._recent) < self._warmup:
            return None
        by_sender: defaultdict[str, list[float]] = defaultdict(list)
        for sender, value in self._recent:
            by_sender[sender].append(value)
        # The lower median: with two voters the smaller decides, so one liar beside one honest
        # sender cannot raise it.
        return statistics.median_low(statistics.median(values) for values in by_sender.values())


class CentredClip:
    """One shard's centred clipping: the centre (its last aggregate) and the adaptive radius."""

    def __init__(self, size: int, radius_factor: float, window: int, warmup: int) -> None:
        if not radius_factor > 0:
            raise ValueError(f"radius_factor = {radius_factor} must be > 0")
        self.centre = torch.zeros(size, dtype=torch.float32)
        """The previous step's aggregate (zeros before the first: plain norm clipping)."""
        self.radius_factor = radius_factor
        self._distances = VoteMedian(window, warmup)

    def radius(self) -> float | None:
        """``tau`` now: ``radius_factor`` times the median recent distance (None: too few seen;
        contributions are then taken as they are, the norm bound alone guarding them)."""
        median = self._distances.median()
        return None if median is None else self.radius_factor * median

    def clip(self, vector: torch.Tensor, sender: str) -> tuple[torch.Tensor, bool]:
        """``centre + clip(vector - centre, tau)`` and whether it was clipped; the distance,
        as clipped, is recorded toward the radius."""
        centre = self.centre.to(vector.device)
        difference = vector - centre
        distance = float(torch.linalg.vector_norm(difference))
        tau = self.radius()
        clipped = tau is not None and distance > tau
        if clipped:
            assert tau is not None
            vector = centre + difference * (tau / distance)
            distance = tau
        self._distances.add(sender, distance)
        return vector, clipped

    def recentre(self, aggregate: torch.Tensor) -> None:
        """The step's aggregate becomes the next round's centre."""
        self.centre = aggregate.detach().to(torch.float32).clone()
