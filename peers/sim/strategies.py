"""The placement strategies the simulator compares, on the same seed and the same churn.

- ``swarmd``: the planner's full plan at the start, then ``repair`` on every noticed join or
  departure (what the coordinator does), the run's stage count fixed.
- ``swarmd/no-network``, ``/no-devices``, ``/no-reliability``: the same, blind to one concern
  (``swarmd.peers.planning.planner.Awareness``): the ablation a reader asks for first.
- ``dtfm-static``: DT-FM's evolutionary search for a plan, redone from scratch on every change
  (a static offline plan has nothing else to do when its devices change).
- ``swarm-wiring``: SWARM's throughput-proportional stochastic wiring, redrawn and rebalanced
  on every change.
- ``petals-greedy``: Petals' greedy block choice, redone on every change.

Every strategy gets swarmd's data path (cells, the share ledger, sharded parameter servers
with their standbys) and elected coordinator; only swarmd and its ablations send messages
through elected relays. A baseline's plan names one shard per stage, at its parameter server,
H = 1 and k = the batch over the pipelines.

The baselines need a shape: the run's stages, and as many pipelines as swarmd's first plan
has, fewer when fewer devices are live. They take every live device as it comes; only swarmd
may leave unreliable ones out.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from swarmd.peers.planning.baselines import dtfm_evolutionary, petals_greedy, swarm_wiring
from swarmd.peers.planning.plan_cost import Plan
from swarmd.peers.planning.planner import Awareness, PlannerSettings, plan, repair
from swarmd.peers.planning.scenario import Scenario, Shape
from swarmd.peers.sim.simulator import Strategy

NAMES = (
    "swarmd", "swarmd/no-network", "swarmd/no-devices", "swarmd/no-reliability",
    "dtfm-static", "swarm-wiring", "petals-greedy",
)  # fmt: skip
ABLATIONS = {
    "swarmd": Awareness(),
    "swarmd/no-network": Awareness(network=False),
    "swarmd/no-devices": Awareness(devices=False),
    "swarmd/no-reliability": Awareness(reliability=False),
}


def _swarmd(name: str, stages: int, time_budget_s: float, seed: int) -> Strategy:
    settings = PlannerSettings(awareness=ABLATIONS[name], time_budget_s=time_budget_s, seed=seed, stages=stages)

    def full(view: Scenario) -> Plan:
        return plan(view, settings)

    def mend(view: Scenario, previous: Plan, previous_ids: list[str]) -> Plan:
        return repair(view, previous, previous_ids, settings).plan

    if settings.awareness != Awareness():
        # Blind to the network, the planner's view is the live devices' mean: mend on them.
        return Strategy(name, full, mend)

    def mend_live(scenario: Scenario, live: np.ndarray, previous: Plan) -> Plan:
        return repair(scenario, previous, scenario.ids, settings, live=live).plan

    return Strategy(name, full, mend, mend_live)


def _baseline(name: str, build: Callable[[Scenario, Shape], Plan], shape: Shape) -> Strategy:
    def full(view: Scenario) -> Plan:
        pipelines = min(shape.data_parallel, view.n // shape.stages)
        if pipelines < 1:
            raise ValueError(f"{view.n} live devices cannot hold one pipeline of {shape.stages} stages")
        return build(view, Shape(shape.stages, pipelines))

    return Strategy(name, full, None, relays=False)


def make_strategies(names: list[str], shape: Shape, time_budget_s: float = 0.5, seed: int = 0) -> list[Strategy]:
    """The named strategies for a run of ``shape`` (stages fixed; pipelines as a ceiling for
    the baselines)."""
    unknown = [n for n in names if n not in NAMES]
    if unknown:
        raise ValueError(f"unknown strategy {', '.join(unknown)}; known: {', '.join(NAMES)}")
    builders: dict[str, Callable[[Scenario, Shape], Plan]] = {
        "dtfm-static": lambda sc, sh: dtfm_evolutionary(sc, sh, seed=seed),
        "swarm-wiring": lambda sc, sh: swarm_wiring(sc, sh, seed=seed),
        "petals-greedy": petals_greedy,
    }
    return [
        _swarmd(n, shape.stages, time_budget_s, seed) if n in ABLATIONS else _baseline(n, builders[n], shape)
        for n in names
    ]
