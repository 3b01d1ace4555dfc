"""What a token teaches: the swarm's exchange against synchronous training, as a token efficiency.

``token_efficiency`` is the share of a run's trained tokens that synchronous data-parallel
training (the same model and global batch, every step averaged over every token) would need to
reach the same loss. A plan's *effective* tokens per second is its raw rate times that: the
rate users compare swarms, clusters and strategies by, as time to a target loss.

The model, and where each part comes from:

- **The loss gap.** M replicas that each take H inner steps between two outer steps (DiLoCo's
  rounds; the swarm's pipelines in local mode) end a run with a relative loss gap ``g`` over
  synchronous training at equal tokens. ``g = GAP_AT_ANCHOR * (N / ANCHOR_PARAMS) ** -GAP_PARAMS_EXPONENT
  * replicas_factor(M) * rounds_factor(H)``.
- **Model size** (Charles et al. 2025, arXiv 2503.09799, Table 4, H = 30, Chinchilla budgets,
  M = 8): +3.9% at 35M, +1.7% at 550M, +1.1% at 2.4B. A power law through the ends,
  ``N ** -0.30``, gives 1.71% at 550M.
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
  does not charge).
  ``rounds_factor`` grows with log H from 0 at one step to 1 at ``FLAT_FROM_STEPS`` and stays
  there. Rounds count in steps, whatever each step's batch: AdamW moves every weight about
  one learning rate a step, so a replica drifts from the others by its steps, not its tokens
  (the published rounds are of inner batches of about half a million tokens; INTELLECT-1's
  H = 100 and Covenant-72B's H = 30 of 0.4 to 1M; none of a few thousand).
- **Staleness.** A contribution ``s`` versions old was computed that many outer steps from where
  it lands: it counts as a round ``1 + s`` times as long (``H * (1 + s)`` steps). The
  throughput model passes it in local mode only: in gradient mode the exchange's staleness
  weights price a stale gradient already (its tokens count at its weight).
- **From a loss gap to tokens.** A relative loss gap of 1% is worth about 12 to 19% of the
  tokens on the Chinchilla-style curves the scaling-law paper fits (``TOKENS_PER_GAP_POINT``,
  the midpoint): the efficiency is ``(1 - 0.155) ** (100 * g)``.

Checked against every published configuration above within a factor of 1.5, and against the
swarm's own exchange on the default run's 875K-parameter model
(``tests/benchmarks/bench_token_efficiency.py``, 100 outer steps, docs/results.md): one replica
at H = 16 ended below the synchronous curve (model 1.00); two replicas measured 0.92 at H = 4
and 0.89 at 16 (model 0.84, 0.70), four 0.55 and 0.60 (model 0.66, 0.43), all within 1.5
(``tests/unit/peers/planning/test_learning.py``). Where none of them says: inner batches of a
few thousand tokens (no published run uses them; their steps are noisier, which this does not
charge), more than 64 replicas (the plateau above is the papers' trend, not a measurement), and
models under 35M (the size law is extrapolated, and is pessimistic at 875K by the above). It
assumes an outer step tuned to the round, as the papers' were and ``exchange.outer_step_for``
is: DiLoCo's rate 0.7 with momentum 0.9 at H = 4 and 16 measured 0.03 to 0.17.
"""

from __future__ import annotations

import math

ANCHOR_PARAMS = 35e6
"""The smallest model of the scaling-law paper's Table 4, where ``GAP_AT_ANCHOR`` was measured."""
GAP_AT_ANCHOR = 0.039
"""Relative loss gap of 8 replicas at H = 30 against data-parallel training, 35M parameters."""
GAP_PARAMS_EXPONENT = 0.30
"""The gap shrinks as ``N ** -0.30``: 3.9% at 35M to 1.1% at 2.4B (log-log line through both)."""
ANCHOR_REPLICAS = 8
REPLICAS_EXPONENT = 0.78
"""``((M - 1) / 7) ** 0.78``: the gap of 64 replicas is 5.6 times that of 8 (DiLoCo, H = 500)."""
FLAT_FROM_STEPS = 30.0
"""Rounds of this many published-size steps or more cost the full gap; none, one step."""
TOKENS_PER_GAP_POINT = 0.155
"""Share of the tokens a relative loss gap of one percent is worth (12 to 19%, the midpoint)."""


def replicas_factor(replicas: float) -> float:
    """How the loss gap grows with the replicas that average their rounds: 0 for one (it is
    synchronous training), 1 at ``ANCHOR_REPLICAS``."""
    if replicas < 1:
        raise ValueError(f"replicas = {replicas} must be at least 1")
    return ((replicas - 1) / (ANCHOR_REPLICAS - 1)) ** REPLICAS_EXPONENT


def rounds_factor(local_steps: int, staleness: float = 0.0) -> float:
    """How much of the loss gap a round of ``local_steps`` inner steps costs, ``staleness``
    outer steps late: 0 for one step on time, 1 from ``FLAT_FROM_STEPS`` steps on (module doc)."""
    if local_steps < 1 or staleness < 0:
        raise ValueError(f"local_steps = {local_steps} must be >= 1 and staleness = {staleness} >= 0")
    steps = local_steps * (1.0 + staleness)
    if steps <= 1.0:
        return 0.0
    return min(1.0, math.log(steps) / math.log(FLAT_FROM_STEPS))


def loss_gap(params: float, replicas: float, local_steps: int, staleness: float = 0.0) -> float:
    """The relative loss gap over synchronous data-parallel training at equal tokens (0.017: 1.7%)."""
    if params <= 0:
        raise ValueError(f"params = {params} must be > 0")
    size = (params / ANCHOR_PARAMS) ** -GAP_PARAMS_EXPONENT
    return GAP_AT_ANCHOR * size * replicas_factor(replicas) * rounds_factor(local_steps, staleness)


def _gap_efficiency(gap: float) -> float:
    return (1.0 - TOKENS_PER_GAP_POINT) ** (100.0 * gap)


def most_useful_replicas(params: float, local_steps: int, staleness: float = 0.0) -> float:
    """The replica count whose tokens teach the most in all (``M x efficiency`` at its peak):
    past it, the gap's growth outruns the tokens. Where rounds cost no gap, no count is."""
    gap_at_anchor = loss_gap(params, ANCHOR_REPLICAS, local_steps, staleness)
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


def token_efficiency(params: float, replicas: int, local_steps: int, staleness: float = 0.0) -> float:
    """The share of the tokens trained that synchronous training would need for the same loss
    (1.0: every token teaches as much; module doc). Replicas past ``most_useful_replicas``
    add no learning and take none away: their tokens together teach what that many's do."""
    efficiency = _gap_efficiency(loss_gap(params, replicas, local_steps, staleness))
    peak = most_useful_replicas(params, local_steps, staleness)
    if replicas <= peak:
        return efficiency
    at_peak = _gap_efficiency(loss_gap(params, peak, local_steps, staleness))
    return max(efficiency, at_peak * peak / replicas)
