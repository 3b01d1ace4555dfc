"""What a simulated run's tokens teach, and how long it takes to reach a target loss.

A run's trained tokens are priced by ``learning.token_efficiency`` of its first plan (its
pipelines or replicas averaging rounds of H inner steps, late by the applied contributions'
mean staleness in local mode) into effective tokens: tokens of synchronous training. The
target loss becomes the synchronous tokens it needs on ``loss_curve``'s fit, and the time to
target is when the run's effective tokens, accumulated over its timeline, reach them. A run
shorter than that is extrapolated at its mean effective rate over the whole simulated time
(churn included), and says so.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from swarmd.peers.planning.learning import token_efficiency
from swarmd.peers.planning.loss_curve import default_target_loss, loss_at, tokens_to_loss
from swarmd.peers.planning.scenario import Scenario
from swarmd.peers.sim.results import SimResult


@dataclass(frozen=True)
class Learning:
    efficiency: float
    """What a trained token teaches against synchronous training (``learning.token_efficiency``)."""
    effective_tokens_per_s: float
    target_loss: float
    tokens_to_target: float
    """Synchronous tokens the target needs (``loss_curve.tokens_to_loss``)."""
    time_to_target_s: float | None
    """Seconds from the run's start until its effective tokens reach the target (None: it
    trained nothing, so it never does)."""
    extrapolated: bool
    """The simulated hours ended first: the rest is at the run's mean effective rate."""
    loss_at_end: float | None
    """The fit's loss after the run's effective tokens (None: it trained none)."""


def run_efficiency(scenario: Scenario, result: SimResult) -> float:
    """``token_efficiency`` of the run's first plan: its pipelines (or replicas) as replicas,
    its H and, in local mode, the applied contributions' mean staleness in outer steps (in
    gradient mode the servers' staleness weights have priced a stale gradient already)."""
    applied = sum(result.staleness.values())
    local = result.local_steps > 1
    stale = sum(s * n for s, n in result.staleness.items()) / applied if applied and local else 0.0
    inner_batch = result.share_micro_batches * result.tokens_per_micro_batch
    return token_efficiency(scenario.model.params, result.shape[1], result.local_steps, inner_batch, stale)


def time_to_tokens(
    gained: Sequence[float], bucket_s: float, horizon_s: float, tokens: float
) -> tuple[float | None, bool]:
    """When the tokens ``gained`` in each ``bucket_s`` of a run ``horizon_s`` long first add up
    to ``tokens``, in seconds from the start (interpolated within the bucket), and whether that
    lies past the horizon: extrapolated at the run's mean rate, churn and all (None: it gained
    nothing, so it never gets there)."""
    if tokens <= 0 or bucket_s <= 0 or horizon_s <= 0:
        raise ValueError(f"tokens = {tokens}, bucket_s = {bucket_s} and horizon_s = {horizon_s} must be > 0")
    reached = 0.0
    for i, now in enumerate(gained):
        if now > 0 and reached + now >= tokens:
            return (i + (tokens - reached) / now) * bucket_s, False
        reached += now
    if reached <= 0:
        return None, True
    return tokens / (reached / horizon_s), True


def hours_text(seconds: float | None, extrapolated: bool, simulated_hours: float, mark: str = "*") -> str:
    """A time to target for a table: hours, ``mark`` after one extrapolated past the simulated
    hours, and what a run that committed nothing in them shows instead."""
    if seconds is None:
        return f"none in {simulated_hours:g} h"
    return f"{seconds / 3600:,.1f}" + (mark if extrapolated else "")


def learning_figures(scenario: Scenario, result: SimResult, target_loss: float | None = None) -> Learning:
    """Efficiency, effective tokens/s and the time to ``target_loss`` (default: the loss at
    Chinchilla's compute-optimal budget for the scenario's model, ``loss_curve``)."""
    params = scenario.model.params
    target = default_target_loss(params) if target_loss is None else target_loss
    needed = tokens_to_loss(params, target)
    efficiency = run_efficiency(scenario, result)
    per_micro_batch = result.tokens_per_micro_batch * efficiency
    gained = [n * per_micro_batch for n in result.timeline]
    seconds, extrapolated = time_to_tokens(gained, result.bucket_s, result.hours * 3600.0, needed)
    total = sum(gained)
    end = loss_at(params, total) if total > 0 else None
    return Learning(efficiency, result.tokens_per_s * efficiency, target, needed, seconds, extrapolated, end)
