"""The strategies the simulator compares, on the same seed and the same churn.

- ``swarmd``: the planner's full plan at the start, then ``repair`` on every noticed join or
  departure (what the coordinator does), the run's stage count fixed; swarmd's data path.
- ``swarmd/no-network``, ``/no-devices``, ``/no-reliability``: the same, blind to one concern
  (``swarmd.peers.planning.planner.Awareness``): the ablation a reader asks for first.
- ``dtfm-static``: DT-FM's evolutionary search for a plan, redone from scratch on every change,
  on DT-FM's own data path (synchronous 1F1B pipelines, an all-reduce every step:
  ``swarmd.peers.sim.sync_path``).
- ``swarm-wiring``: SWARM's throughput-balanced stages, redrawn on every change, on SWARM's data
  path (stochastic wiring per micro-batch, each stage's all-reduce every step).
- ``diloco``: DiLoCo's data parallelism where the model fits one device: every device that holds
  it alone a replica, H inner steps, then an all-reduce of pseudo-gradients; no pipelines.
- ``petals-greedy``: Petals' greedy block choice, redone on every change, on swarmd's data path
  (Petals publishes placement for inference, not a training data path).

Only swarmd and its ablations elect relays. The baselines' plans take the run's stages and at
most as many pipelines as swarmd's first plan has, fewer when fewer devices are live; they take
every live device as it comes, where only swarmd may leave unreliable ones out.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from swarmd.peers.planning.baselines import dtfm_evolutionary, petals_greedy, swarm_wiring
from swarmd.peers.planning.plan_cost import Plan
from swarmd.peers.planning.planner import Awareness, PlanError, PlannerConfig, plan, repair
from swarmd.peers.planning.scenario import Scenario, Shape
from swarmd.peers.sim.results import alone_memory_bytes
from swarmd.peers.sim.simulator import Strategy

NAMES = (
    "swarmd",
    "swarmd/no-network",
    "swarmd/no-devices",
    "swarmd/no-reliability",
    "dtfm-static",
    "swarm-wiring",
    "diloco",
    "petals-greedy",
)
ABLATIONS = {
    "swarmd": Awareness(),
    "swarmd/no-network": Awareness(network=False),
    "swarmd/no-devices": Awareness(devices=False),
    "swarmd/no-reliability": Awareness(reliability=False),
}


def _swarmd(name: str, stages: int, time_budget_s: float, seed: int) -> Strategy:
    settings = PlannerConfig(awareness=ABLATIONS[name], time_budget_s=time_budget_s, seed=seed, stages=stages)

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


def _baseline(name: str, build: Callable[[Scenario, Shape], Plan], shape: Shape, data_path: str) -> Strategy:
    def full(view: Scenario) -> Plan:
        pipelines = min(shape.data_parallel, view.n // shape.stages)
        if pipelines < 1:
            raise ValueError(f"{view.n} live devices cannot hold one pipeline of {shape.stages} stages")
        return build(view, Shape(shape.stages, pipelines))

    return Strategy(name, full, None, relays=False, data_path=data_path)


def diloco_plan(view: Scenario) -> Plan:
    """Every device that holds the model alone, with its optimizer state, is a replica."""
    fits = np.flatnonzero(view.device_arrays.memory_gib * (1 << 30) >= alone_memory_bytes(view))
    if len(fits) == 0:
        raise PlanError(
            f"no live device holds the model alone ({alone_memory_bytes(view) / (1 << 30):.1f} GiB with its "
            "optimizer state): DiLoCo needs a whole replica on each device"
        )
    replicas = tuple((int(d),) for d in fits)
    return Plan(pipelines=replicas, layers_per_stage=(view.model.layers,), parameter_servers=replicas[0])


def make_strategies(names: list[str], shape: Shape, time_budget_s: float = 0.5, seed: int = 0) -> list[Strategy]:
    """The named strategies for a run of ``shape`` (stages fixed; pipelines as a ceiling for
    the baselines)."""
    unknown = [n for n in names if n not in NAMES]
    if unknown:
        raise ValueError(f"unknown strategy {', '.join(unknown)}; known: {', '.join(NAMES)}")
    baselines: dict[str, tuple[Callable[[Scenario, Shape], Plan], str]] = {
        "dtfm-static": (lambda sc, sh: dtfm_evolutionary(sc, sh, seed=seed), "dtfm"),
        "swarm-wiring": (lambda sc, sh: swarm_wiring(sc, sh, seed=seed), "swarm"),
        "petals-greedy": (petals_greedy, "swarmd"),
    }
    out = []
    for n in names:
        if n in ABLATIONS:
            out.append(_swarmd(n, shape.stages, time_budget_s, seed))
        elif n == "diloco":
            out.append(Strategy(n, diloco_plan, None, relays=False, data_path="diloco"))
        else:
            build, path = baselines[n]
            out.append(_baseline(n, build, shape, path))
    return out
