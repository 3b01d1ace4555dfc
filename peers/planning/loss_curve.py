"""A model's loss against the tokens it was trained on: what turns effective tokens into time to a loss.

Time to a target loss is what users compare swarms, clusters and strategies by. A strategy's
effective tokens (its trained tokens times what each teaches, ``learning.token_efficiency``)
are tokens of synchronous training, so one curve of loss against synchronous tokens serves
every strategy: the target loss gives the tokens needed, and each strategy's effective rate
the time.

The curve is Chinchilla's parametric fit (Hoffmann et al. 2022, arXiv 2203.15556, approach 3):
``L(N, D) = E + A / N ** alpha + B / D ** beta`` with E = 1.69, A = 406.4, B = 410.7,
alpha = 0.34, beta = 0.28, in nats per token of their tokenizer and data. The absolute losses
are theirs, not those of a swarm's model and corpus; what the simulator uses is the curve's
shape (how many more tokens each step down in loss costs) and the default target: the loss a
model reaches at Chinchilla's compute-optimal budget of ``TOKENS_PER_PARAM`` tokens per
parameter. A run that knows its own curve (held-out losses against tokens) may give its target
in tokens instead; the ranking of strategies does not change, since every one is charged the
same tokens.
"""

from __future__ import annotations

E = 1.69
A = 406.4
B = 410.7
ALPHA = 0.34
BETA = 0.28
TOKENS_PER_PARAM = 20.0
"""Chinchilla's compute-optimal tokens per parameter: the default target's budget."""


def loss_at(params: float, tokens: float) -> float:
    """The fit's loss of a model of ``params`` parameters after ``tokens`` tokens of synchronous training."""
    if params <= 0 or tokens <= 0:
        raise ValueError(f"params = {params} and tokens = {tokens} must both be > 0")
    return E + A / params**ALPHA + B / tokens**BETA


def floor_loss(params: float) -> float:
    """The loss the fit says a model of ``params`` parameters approaches with unlimited tokens."""
    if params <= 0:
        raise ValueError(f"params = {params} must be > 0")
    return E + A / params**ALPHA


def tokens_to_loss(params: float, loss: float) -> float:
    """The synchronous tokens a model of ``params`` parameters needs to reach ``loss``."""
    above = loss - floor_loss(params)
    if above <= 0:
        raise ValueError(
            f"loss {loss:.3f} is out of reach for {params:.3g} parameters: the fit's floor for that size is "
            f"{floor_loss(params):.3f} (give a higher target or a larger model)"
        )
    return float((B / above) ** (1.0 / BETA))


def default_target_loss(params: float) -> float:
    """The loss at Chinchilla's compute-optimal budget (``TOKENS_PER_PARAM`` tokens a parameter)."""
    return loss_at(params, TOKENS_PER_PARAM * params)
