"""What a token teaches: the swarm's exchange against synchronous training, as a token efficiency.

``token_efficiency`` is the share of a run's trained tokens that synchronous data-parallel
training (the same model and global batch, every step averaged over every token) would need to
reach the same loss. A plan's *effective* tokens per second is its raw rate times that: the
rate users compare swarms, clusters and strategies by, as time to a target loss.

The model, and where each part comes from:

- **The loss gap.** M replicas that each take H inner steps of B tokens between two outer
  steps (DiLoCo's rounds; the swarm's pipelines in local mode) end a run with a relative loss
  gap ``g`` over synchronous training at equal tokens:
  ``g = size_gap(N) * replicas_factor(M) * rounds_factor(H) + staleness_gap(N, M, s)``,
  whatever B (below).
- **Model size** (Charles et al. 2025, arXiv 2503.09799, Table 4, H = 30, Chinchilla budgets,
  M = 8): +3.9% at 35M, +1.7% at 550M, +1.1% at 2.4B. A power law through the ends,
  ``N ** -0.30``, gives 1.71% at 550M. Below 35M the swarm's own measurements set it
  (``bench_token_efficiency``, the default run's 875K parameters): the gap there is about
  what it is at 35M, ``N ** -SMALL_PARAMS_EXPONENT``, where the published law extrapolated
  would have charged three times as much.
- **Replicas** (Douillard et al. 2023, arXiv 2311.08105, 150M, H = 500): 8 replicas reach
  perplexity 15.02 where the same tokens trained in sequence reach 14.72, and 8 -> 16 -> 64
  replicas at a fixed number of inner steps each give 15.02 -> 14.91 -> 14.96: interpolated on
  the sequential curve, 8 replicas deliver about 65% of their tokens' worth and 64 about 9%.
  Those two are gaps of 2.6% and 14.1% (below), a factor of 5.6 for 9 times the replicas past
  the first: ``replicas_factor(M) = ((M - 1) / 7) ** 0.78`` (1 at M = 8, 0 for one replica).
  Past the count where ``M x efficiency`` peaks (``most_useful_replicas``: 29 replicas at 150M
  and H = 500, 8.3 replicas' worth, where DiLoCo's 8, 16 and 64 are 5.2, 7.4 and 5.8), more
  replicas add nothing and take nothing away: their tokens together teach what the peak's do.
  The exponent alone would have 759 replicas teach less than one, which no paper saw.
- **Rounds.** H = 1 is synchronous training (no gap); the 35M-2.4B anchor is at H = 30 and the
  150M one at H = 500, and the size law alone puts 150M at H = 30 at 2.5%, the gap DiLoCo
  measured at H = 500: past 30 steps the round's length no longer matters at these sizes (the
  scaling-law paper swept H from 1 to 300 and its loss rises with H past its best, which this
  does not charge). Below 30, ``rounds_factor = (ln H / ln 30) ** 0.5``: the swarm's exchange
  lost about as much at H = 4 as at 16 (0.55 and 0.60 with four replicas, 0.55 and 0.48 with
  eight), so most of the gap comes with the first few steps.
- **Inner batch.** The gap does not depend on it, as far as measured: four replicas at H = 4
  with inner steps of 512, 1,024 and 2,048 tokens (1, 2 and 4 micro-batches) measured 0.55,
  0.67 and 0.49, no trend through the scatter of one run each; a larger batch makes each step less
  noisy, but AdamW moves each weight about one learning rate a step either way, so the
  replicas drift apart by their steps. The argument is there because plans differ in it and
  callers state it; ``inner_batch_tokens`` must be positive.
- **Staleness** (measured here; Kale et al. 2025, arXiv 2502.12996, Table 2). A contribution
  ``s`` outer steps late adds its own gap, ``STALENESS_GAP * s ** 1.5`` at the default run's
  875K parameters, shrinking as ``N ** -0.09``: on the swarm's exchange with two replicas
  (``bench_token_efficiency --staleness``), half the replicas a step late, every replica one
  step and two steps late added 0.017, 0.037 and 0.069 at H = 4 and 0.012, 0.043 and 0.19 at
  H = 16 (``s ** 1.5`` with 0.040 is within a factor of 1.7 of each); at 500M and H = 30 an
  outer step applied one round late with its rate lowered cost +2.2% (2.73 against 2.67). A
  round that trains on without the step its last contribution went into, and rebases on it
  when it comes (the swarm's cells do; ``bench_token_efficiency --pull-after``), costs at most
  what as much staleness does, and is priced as that: with two replicas a quarter and half a
  round late cost nothing measurable at H = 4 (0.90 against 0.92 on time) and at H = 16 0.80
  and 0.72 against 0.89, what ``s`` of 0.25 and 0.5 charge; with four at H = 4, half a round
  0.42 against 0.55 (a whole step late, 0.36; the model 0.58 and 0.37). One replica is
  charged nothing: the weights it trains on late are its own. In gradient mode the exchange's
  staleness weights price a stale gradient already, and callers pass 0 there.
- **From a loss gap to tokens.** A relative loss gap of 1% is worth about 12 to 19% of the
  tokens on the Chinchilla-style curves the scaling-law paper fits (``TOKENS_PER_GAP_POINT``,
  the midpoint): the efficiency is ``(1 - 0.155) ** (100 * g)``.

Checked against every published configuration above within a factor of 1.5, and against the
configurations measured on the swarm's own exchange (``tests/benchmarks/bench_token_efficiency.py``,
100 outer steps, docs/results.md) but three, two whole steps late and a step late whose step
also came half a round late (``tests/unit/peers/planning/test_learning.py`` holds the rest and
names those).
Where none of them says: more than 64 replicas (the plateau above is the papers' trend, not a
measurement), inner batches between the measured 2,048 tokens and the published half million,
and whether staleness costs less in larger models than Kale et al.'s one point says. It assumes
an outer step tuned to the round, as the papers' were and ``exchange.outer_step_for`` is:
DiLoCo's rate 0.7 with momentum 0.9 at H = 4 and 16 measured 0.03 to 0.17.
"""

from __future__ import annotations

import math

ANCHOR_PARAMS = 35e6
"""The smallest model of the scaling-law paper's Table 4, where ``GAP_AT_ANCHOR`` was measured."""
GAP_AT_ANCHOR = 0.039
"""Relative loss gap of 8 replicas at H = 30 against data-parallel training, 35M parameters."""
GAP_PARAMS_EXPONENT = 0.30
"""The gap shrinks as ``N ** -0.30``: 3.9% at 35M to 1.1% at 2.4B (log-log line through both)."""
SMALL_PARAMS_EXPONENT = 0.10
"""Below 35M, as ``N ** -0.10``: fitted to the swarm's exchange at 875K (module doc)."""
ANCHOR_REPLICAS = 8
REPLICAS_EXPONENT = 0.78
"""``((M - 1) / 7) ** 0.78``: the gap of 64 replicas is 5.6 times that of 8 (DiLoCo, H = 500)."""
FLAT_FROM_STEPS = 30.0
"""Rounds of this many steps or more cost the full gap; of one step, none."""
LONGEST_FITTED_STEPS = 500
"""The longest rounds a configuration the model is fitted to ran (DiLoCo's H = 500): past it the
model charges nothing more for longer rounds only because nothing it knows measured them, so
a planner that lengthens rounds to make them less stale stops here."""
ROUNDS_POWER = 0.5
"""``(ln H / ln 30) ** 0.5`` below ``FLAT_FROM_STEPS``: H = 4 costs 0.64 of the gap, 16 0.90."""
MEASURED_PARAMS = 875_264
"""The default run's model, on which the swarm's own exchange was measured."""
STALENESS_GAP = 0.040
"""Gap one outer step of staleness adds at ``MEASURED_PARAMS`` (``s ** STALENESS_POWER`` for ``s``)."""
STALENESS_POWER = 1.5
STALENESS_PARAMS_EXPONENT = 0.09
"""0.040 at 875K to 0.022 at 500M (Kale et al. 2025, Table 2: delayed, rate lowered, +2.2%)."""
TOKENS_PER_GAP_POINT = 0.155
"""Share of the tokens a relative loss gap of one percent is worth (12 to 19%, the midpoint)."""


def size_gap(params: float) -> float:
    """The gap of 8 replicas at long rounds and published batches, for ``params`` parameters."""
    if params <= 0:
        raise ValueError(f"params = {params} must be > 0")
    exponent = GAP_PARAMS_EXPONENT if params >= ANCHOR_PARAMS else SMALL_PARAMS_EXPONENT
    return GAP_AT_ANCHOR * (params / ANCHOR_PARAMS) ** -exponent


def replicas_factor(replicas: float) -> float:
    """How the loss gap grows with the replicas that average their rounds: 0 for one (it is
    synchronous training), 1 at ``ANCHOR_REPLICAS``."""
    if replicas < 1:
        raise ValueError(f"replicas = {replicas} must be at least 1")
    return ((replicas - 1) / (ANCHOR_REPLICAS - 1)) ** REPLICAS_EXPONENT


def rounds_factor(local_steps: int) -> float:
    """How much of the loss gap a round of ``local_steps`` inner steps costs: 0 for one step,
    1 from ``FLAT_FROM_STEPS`` steps on (module doc)."""
    if local_steps < 1:
        raise ValueError(f"local_steps = {local_steps} must be >= 1")
    return min(1.0, math.log(local_steps) / math.log(FLAT_FROM_STEPS)) ** ROUNDS_POWER


def staleness_gap(params: float, replicas: float, staleness: float) -> float:
    """The gap contributions ``staleness`` outer steps late add (module doc); none for one replica."""
    if staleness < 0:
        raise ValueError(f"staleness = {staleness} must be >= 0")
    size = (params / MEASURED_PARAMS) ** -STALENESS_PARAMS_EXPONENT
    return STALENESS_GAP * size * staleness**STALENESS_POWER * min(1.0, replicas - 1.0)


def _rounds_gap(params: float, local_steps: int, inner_batch_tokens: float) -> float:
    """The gap of ``ANCHOR_REPLICAS`` replicas on time: what ``replicas_factor`` scales."""
    if inner_batch_tokens <= 0:
        raise ValueError(f"inner_batch_tokens = {inner_batch_tokens} must be > 0")
    return size_gap(params) * rounds_factor(local_steps)


def loss_gap(
    params: float, replicas: float, local_steps: int, inner_batch_tokens: float, staleness: float = 0.0
) -> float:
    """The relative loss gap over synchronous data-parallel training at equal tokens (0.017: 1.7%)."""
    on_time = _rounds_gap(params, local_steps, inner_batch_tokens) * replicas_factor(replicas)
    return on_time + staleness_gap(params, replicas, staleness)


def _gap_efficiency(gap: float) -> float:
    return (1.0 - TOKENS_PER_GAP_POINT) ** (100.0 * gap)


def most_useful_replicas(params: float, local_steps: int, inner_batch_tokens: float) -> float:
    """The replica count whose tokens teach the most in all (``M x efficiency`` at its peak):
    past it, the gap's growth outruns the tokens. Where rounds cost no gap, no count is.
    Staleness does not move it: its gap is the same for any count past one."""
    gap_at_anchor = _rounds_gap(params, local_steps, inner_batch_tokens)
    if gap_at_anchor <= 0:
        return math.inf
    # ln M - c x^p with M = 1 + 7x peaks where x^(p-1) + 7 x^p = 7 / (p c); the left side rises
    # for x above (1 - p) / (7 p), so a bisection there finds the one peak.
    c = 100.0 * gap_at_anchor * -math.log(1.0 - TOKENS_PER_GAP_POINT)
    p, span = REPLICAS_EXPONENT, ANCHOR_REPLICAS - 1
    want = span / (p * c)

    def side(x: float) -> float:
        return x ** (p - 1.0) + span * x**p

    lo, hi = (1.0 - p) / (span * p), 1.0
    if side(lo) >= want:
        return 1.0 + span * lo
    while side(hi) < want:
        hi *= 2.0
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if side(mid) < want else (lo, mid)
    return 1.0 + span * hi


def token_efficiency(
    params: float, replicas: int, local_steps: int, inner_batch_tokens: float, staleness: float = 0.0
) -> float:
    """The share of the tokens trained that synchronous training would need for the same loss
    (1.0: every token teaches as much; module doc). Replicas past ``most_useful_replicas``
    add no learning and take none away: their tokens together teach what that many's do."""
    efficiency = _gap_efficiency(loss_gap(params, replicas, local_steps, inner_batch_tokens, staleness))
    peak = most_useful_replicas(params, local_steps, inner_batch_tokens)
    if replicas <= peak:
        return efficiency
    at_peak = _gap_efficiency(loss_gap(params, peak, local_steps, inner_batch_tokens, staleness))
    return max(efficiency, at_peak * peak / replicas)
