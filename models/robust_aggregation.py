"""Robust statistics for a shard's contributions: a median that a few senders cannot drag,
centred clipping of each contribution around the shard's last aggregate, and a trust in each
sender from how its contributions agreed with the others'.

A shard combines a round's contributions into one step (``parameter_shard``). Their plain
weighted mean lets one contribution move the step as far as it likes; three defences live here:

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
- :class:`SenderTrust`: clipping bounds a contribution's distance, but a member that sends its
  own gradients negated stays within the honest spread (micro-batch gradients are noisy: their
  distances from the centre look alike), and the mean of two honest members and one such is a
  third of a step. What gives it away is direction: at each round's end, each contribution's
  cosine with the other senders' of that round, one unit vote each (gradients taken on the
  same weights agree; :func:`judge_round`), is added to its sender's record; a sender whose
  recent mean is negative is given less weight (its difference from the centre scaled down,
  to nothing: it then counts for the centre).
  ``tests/benchmarks/bench_robust.py`` measures both with and without such a member.

A contribution may be a reduction head's mean of several cells' (``parts``); it is clipped as
one point with the weight of all its micro-batches. An honest mean lies closer to the centre
than its parts, so this never clips honest work harder than the parts alone would be.

Pure torch, no network.
"""

from __future__ import annotations

import math
import statistics
from collections import OrderedDict, defaultdict, deque

import torch

AGGREGATIONS = ("mean", "centred-clip")
"""How a shard combines a round's contributions (the run spec's ``exchange.aggregation``)."""
TRUST_WINDOW = 64
"""Contributions per sender its trust is judged over."""
TRUST_WARMUP = 8
"""Contributions seen from a sender before its trust is judged."""
AGREEMENT_FLOOR = 0.05
"""The least mean agreement taken as the typical sender's: with two honest members and one
that negates its gradients, an honest one's agreement is near 0 until the liar is found out."""
SKETCH_COORDINATES = 16_384
"""At most this many coordinates of each contribution (every k-th) are kept until the round's
end, when its agreement with the others is judged: a cosine over a strided sample of a vector
spread over many coordinates is close to the whole one's, at a small part of the memory."""
MAX_JUDGED_PER_ROUND = 256
"""Contributions of one round kept for judgement (bounded memory: 16 MiB; later ones are taken
unjudged)."""


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


class SenderTrust:
    """How far each sender's recent contributions agree with the run's direction of descent: the
    mean cosine of its last ``window`` contributions with the reference they met, and from it
    the weight its next one gets.

    A sender whose contributions point, on average, against the reference is given less weight,
    down to none once its mean is as far below zero as the median sender's is above (or
    ``AGREEMENT_FLOOR``); a sender whose mean is positive, however small, keeps all of its
    weight (honest gradients of small micro-batches are noisy, but agree on average). Bounded:
    ``window`` values for each of at most ``max_senders`` senders."""

    def __init__(self, window: int, warmup: int, max_senders: int = 1024) -> None:
        if window < 1 or warmup < 1 or max_senders < 2:
            raise ValueError(f"window = {window}, warmup = {warmup} and max_senders = {max_senders} are too small")
        self._window, self._warmup, self._max_senders = window, warmup, max_senders
        # sender -> (its recent cosines, their sum); the least recently heard forgotten first.
        self._senders: OrderedDict[str, tuple[deque[float], list[float]]] = OrderedDict()

    def add(self, sender: str, cosine: float) -> None:
        found = self._senders.pop(sender) if sender in self._senders else None
        recent, total = found or (deque(maxlen=self._window), [0.0])
        if len(recent) == self._window:
            total[0] -= recent[0]
        recent.append(cosine)
        total[0] += cosine
        self._senders[sender] = (recent, total)
        while len(self._senders) > self._max_senders:
            self._senders.popitem(last=False)

    def mean(self, sender: str) -> float | None:
        """The sender's mean cosine (None: fewer than ``warmup`` seen from it)."""
        found = self._senders.get(sender)
        if found is None or len(found[0]) < self._warmup:
            return None
        return found[1][0] / len(found[0])

    def distrusted(self, limit: int = 16) -> dict[str, float]:
        """The senders given less than their whole weight now, the least trusted first (at
        most ``limit``): 0 is a sender excluded, whose contributions count for the centre."""
        weights = sorted((w, s) for s in self._senders if (w := self.weight(s)) < 1.0)
        return {s: round(w, 3) for w, s in weights[:limit]}

    def weight(self, sender: str) -> float:
        """1 for a sender that agrees (or is not known well enough to say), less for one that
        disagrees: ``clamp(1 + own / typical, 0, 1)``, ``typical`` the median of the senders'
        means, one vote each, and at least ``AGREEMENT_FLOOR``."""
        own = self.mean(sender)
        if own is None or own >= 0:
            return 1.0
        typical = statistics.median(m for s in self._senders if (m := self.mean(s)) is not None)
        return min(1.0, max(0.0, 1.0 + own / max(typical, AGREEMENT_FLOOR)))


class CentredClip:
    """One shard's centred clipping: the centre (its last aggregate), the adaptive radius, and
    each sender's trust (``SenderTrust``), judged at the end of each round by how its
    contributions agreed with the rest of that round's."""

    def __init__(self, size: int, radius_factor: float, window: int, warmup: int) -> None:
        if not radius_factor > 0:
            raise ValueError(f"radius_factor = {radius_factor} must be > 0")
        self.centre = torch.zeros(size, dtype=torch.float32)
        """The previous step's aggregate (zeros before the first: plain norm clipping)."""
        self.radius_factor = radius_factor
        self.trust = SenderTrust(TRUST_WINDOW, TRUST_WARMUP)
        self._distances = VoteMedian(window, warmup)
        self._stride = max(1, math.ceil(size / SKETCH_COORDINATES))
        self._round: list[tuple[str, torch.Tensor, float]] = []
        """This round's contributions so far: sender, a strided sample of the vector as sent (on
        the CPU), and the weight its difference from the centre was taken with."""

    def radius(self) -> float | None:
        """``tau`` now: ``radius_factor`` times the median recent distance (None: too few seen;
        contributions are then taken as they are, the norm bound alone guarding them)."""
        median = self._distances.median()
        return None if median is None else self.radius_factor * median

    def clip(self, vector: torch.Tensor, sender: str) -> tuple[torch.Tensor, bool]:
        """``centre + clip(w * (vector - centre), tau)``, ``w`` the sender's trust, and whether
        it was cut (``w`` below 1, or clipped); the distance, as clipped, is recorded toward the
        radius, and a sample of the vector kept for the round's judgement (``recentre``)."""
        centre = self.centre.to(vector.device)
        difference = vector - centre
        weight = self.trust.weight(sender)
        distance = weight * float(torch.linalg.vector_norm(difference))
        tau = self.radius()
        if tau is not None and distance > tau:
            weight *= tau / distance
            distance = tau
        self._distances.add(sender, distance)
        if len(self._round) < MAX_JUDGED_PER_ROUND:
            # A copy: a view would keep the whole vector alive until the round's end.
            sample = vector[:: self._stride].detach().to(device="cpu", dtype=torch.float32, copy=True)
            self._round.append((sender, sample, min(weight, 1.0)))
        if weight >= 1.0:
            return vector, False
        return centre + difference * weight, True

    def recentre(self, aggregate: torch.Tensor) -> None:
        """The step's aggregate becomes the next round's centre, and the round's senders are
        judged (``judge_round``)."""
        sent, self._round = self._round, []
        for sender, agreement in judge_round(sent, self.centre[:: self._stride].cpu()).items():
            self.trust.add(sender, agreement)
        self.centre = aggregate.detach().to(torch.float32).clone()


def judge_round(sent: list[tuple[str, torch.Tensor, float]], centre: torch.Tensor) -> dict[str, float]:
    """Each sender's agreement with one round's other senders: the cosine of each of its
    contributions (as sent) with the other senders' votes, averaged over its own.

    A sender's vote is the direction of its contributions as they were taken (``centre + w *
    (x - centre)``: a sender already given no weight votes for the centre, so two honest members
    do not look as if they disagreed because a third negates its gradients), each one a unit
    vector, so that one large liar weighs no more than any other sender. Gradients taken on the
    same weights agree on average, however noisy: an honest sender's agreement is above zero, a
    negated one's below. A sender's own contributions do not count for it."""
    votes: dict[str, torch.Tensor] = {}
    for sender, sample, weight in sent:
        taken = centre + (sample - centre) * weight
        norm = float(torch.linalg.vector_norm(taken))
        if norm > 0:
            votes[sender] = votes.get(sender, torch.zeros_like(taken)) + taken / norm
    votes = {sender: vote / n for sender, vote in votes.items() if (n := float(torch.linalg.vector_norm(vote))) > 0}
    if len(votes) < 2:
        return {}
    total = torch.stack(list(votes.values())).sum(0)
    by_sender: defaultdict[str, list[float]] = defaultdict(list)
    for sender, sample, _ in sent:
        others = total - votes.get(sender, 0.0)
        scale = float(torch.linalg.vector_norm(sample)) * float(torch.linalg.vector_norm(others))
        if scale > 0:
            by_sender[sender].append(float(torch.dot(sample, others)) / scale)
    return {sender: statistics.fmean(values) for sender, values in by_sender.items()}
