"""``swarmd plan``: a scenario file in, a plan out (FORMAT.md's formats, both ways).

The planner is the one the daemon's coordinator runs (``swarmd.peers.planning.planner``); here it reads
its snapshot from a file instead of the live measurements. ``--json`` prints exactly the plan
object of FORMAT.md; without it, a table a person reads.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from swarmd.peers.planning.plan_cost import Plan, predict, reference_cost, reference_lower_bound
from swarmd.peers.planning.planner import Awareness, PlannerSettings, plan
from swarmd.peers.planning.scenario import Scenario, load_scenario


def plan_json(scenario: Scenario, result: Plan) -> dict[str, Any]:
    """The plan object of FORMAT.md."""
    out: dict[str, Any] = result.to_json(scenario)
    out["predicted"] = predict(scenario, result).to_json()
    out["sync_comm_reference_s"] = round(reference_cost(scenario, result), 6)
    out["runtime_s"] = round(float(result.meta.get("runtime_s", 0.0)), 6)  # type: ignore[arg-type]
    return out


def describe(scenario: Scenario, result: Plan) -> str:
    ids = scenario.ids
    pred = predict(scenario, result)
    shape = result.shape
    lines = [
        f"scenario {scenario.name}: {scenario.n} devices; plan {shape.stages} stages x {shape.data_parallel} "
        f"pipelines ({shape.devices} devices used) in {float(result.meta.get('runtime_s', 0.0)):.3f} s",  # type: ignore[arg-type]
        "",
        "stage  layers  parameter server  devices (pipeline 0, 1, ...)",
    ]
    for s, group in enumerate(result.stage_groups()):
        members = " ".join(ids[d] for d in group)
        lines.append(f"{s:>5}  {result.layers_per_stage[s]:>6}  {ids[result.parameter_servers[s]]:>16}  {members}")
    if result.relays:
        lines.append(f"relays: {' '.join(ids[r] for r in result.relays)}")
    lines += [
        "",
        f"predicted iteration {pred.iteration_s:.3f} s = compute {pred.compute_s:.3f} + pipeline traffic "
        f"{pred.pipeline_comm_s:.3f} + parameter-server traffic {pred.sync_comm_s:.3f} + churn {pred.churn_s:.3f}",
        f"reference cost {reference_cost(scenario, result):.3f} s "
        f"(no plan of this shape below {reference_lower_bound(scenario, shape):.3f} s)",
    ]
    return "\n".join(lines)


def run_plan(
    scenario_path: Path, *, as_json: bool, network: bool, devices: bool, reliability: bool, time_budget_s: float
) -> int:
    scenario = load_scenario(scenario_path)
    settings = PlannerSettings(Awareness(network, devices, reliability), time_budget_s=time_budget_s)
    result = plan(scenario, settings)
    if as_json:
        print(json.dumps(plan_json(scenario, result), indent=2))
    else:
        print(describe(scenario, result))
    return 0
