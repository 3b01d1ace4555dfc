"""``swarmd plan``: a scenario file in, a plan out (FORMAT.md's formats, both ways).

The planner is the one the daemon's coordinator runs (``swarmd.peers.planning.planner``); here it reads
its snapshot from a file instead of the live measurements. ``--json`` prints FORMAT.md's plan
object with the data path's fields beside it (shard servers, H, k, spares, each device's roles,
the predicted throughput broken down); without it, a table a person reads.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

from swarmd.cli.progress import ProgressLine
from swarmd.peers.planning.learning import most_useful_replicas
from swarmd.peers.planning.plan_cost import Plan, reference_cost, reference_lower_bound
from swarmd.peers.planning.planner import Awareness, PlannerConfig, plan
from swarmd.peers.planning.scenario import Scenario, load_scenario
from swarmd.peers.planning.throughput import (
    Throughput,
    compute_bound_tokens_per_s,
    fastest_device_tokens_per_s,
    predict_throughput,
)
from swarmd.peers.taskpool.exchange import trained_tokens

SHOW_PROGRESS_BYTES = 32 * 2**20
"""A scenario file this large (about 1,000 devices) takes seconds to minutes: progress is shown."""


def _plan_showing_progress(path: Path, size: int, settings: PlannerConfig) -> tuple[Scenario, Plan]:
    """Parsing gives no progress (one ``json.loads``); checking its matrices and planning do."""
    print(f"reading {path} ({size / 2**20:,.0f} MiB of JSON)", file=sys.stderr, flush=True)
    checking = ProgressLine("reading and checking the scenario")
    scenario = load_scenario(path, checking.update)
    checking.done(f"{scenario.n} devices")
    planning = ProgressLine(f"planning {scenario.n} devices")
    result = plan(scenario, settings, planning.update)
    planning.done()
    return scenario, result


def runtime_s(result: Plan) -> float:
    found = result.meta.get("runtime_s", 0.0)
    return float(found) if isinstance(found, int | float) else 0.0


def prediction(scenario: Scenario, result: Plan) -> Throughput:
    found = result.meta.get("prediction")
    return found if isinstance(found, Throughput) else predict_throughput(scenario, result)


def plan_json(scenario: Scenario, result: Plan) -> dict[str, Any]:
    """FORMAT.md's plan object, and the data path's fields beside it."""
    out: dict[str, Any] = result.to_json(scenario)
    pred = prediction(scenario, result)
    out["predicted"] = pred.to_json()
    out["sync_comm_reference_s"] = round(reference_cost(scenario, result), 6)
    out["runtime_s"] = round(runtime_s(result), 6)
    useful = most_useful_replicas(scenario.model.params, result.local_steps, inner_batch_tokens(scenario, result))
    out["learning"] = {
        "efficiency": round(pred.efficiency, 6),
        "effective_tokens_per_s": round(pred.effective_tokens_per_s, 3),
        "most_useful_replicas": None if math.isinf(useful) else round(useful, 1),
    }
    out["bounds"] = {
        "compute_bound_tokens_per_s": round(compute_bound_tokens_per_s(scenario), 3),
        "fastest_device_tokens_per_s": round(fastest_device_tokens_per_s(scenario), 3),
    }
    return out


def inner_batch_tokens(scenario: Scenario, result: Plan) -> float:
    """Tokens of one pipeline's inner step (its share) under ``result``."""
    return trained_tokens(result.micro_batches_per_share(scenario), scenario.micro_batch, scenario.model.seq_len)


def _replicas_note(scenario: Scenario, result: Plan) -> str:
    useful = most_useful_replicas(scenario.model.params, result.local_steps, inner_batch_tokens(scenario, result))
    if math.isinf(useful):
        return "rounds of one step: every pipeline adds learning"
    return (
        f"{useful:.0f} pipelines would teach the most at this H; more add tokens but no learning, "
        "so the devices beyond are better spares, shard servers or left out"
    )


def describe(scenario: Scenario, result: Plan) -> str:
    ids = scenario.ids
    pred = prediction(scenario, result)
    shape = result.shape
    roles = result.roles()
    lines = [
        f"scenario {scenario.name}: {scenario.n} devices; plan {shape.stages} stages x {shape.data_parallel} "
        f"pipelines ({shape.devices} cells) in {runtime_s(result):.3f} s",
        f"exchange: H = {result.local_steps} local steps of k = {result.micro_batches_per_share(scenario)} "
        f"micro-batches per round ({'gradients' if result.local_steps == 1 else 'pseudo-gradients'})",
        "",
        "stage  layers  shards  parameter server  devices (pipeline 0, 1, ...)",
    ]
    for s, group in enumerate(result.stage_groups()):
        members = " ".join(ids[d] for d in group)
        server = ids[result.parameter_servers[s]]
        lines.append(
            f"{s:>5}  {result.layers_per_stage[s]:>6}  {len(result.shard_servers[s]):>6}  {server:>16}  {members}"
        )
    serving = sorted({d for row in result.shard_servers for d in row})
    lines.append(
        f"shard servers: {len(serving)} devices, {sum(1 for d in serving if 'cell' not in roles[d])} of them "
        "holding no cell"
    )
    if result.relays:
        lines.append(f"relays: {' '.join(ids[r] for r in result.relays)}")
    standby = [d for d in result.spares if roles[d] == ["spare"]]
    lines.append(f"spares: {len(standby)} devices that can take a lapsed cell; {scenario.n - len(roles)} left out")
    bound, alone = compute_bound_tokens_per_s(scenario), fastest_device_tokens_per_s(scenario)
    b = pred.breakdown()
    lines += [
        "",
        f"predicted {pred.tokens_per_s:,.0f} trained tokens/s = {pred.tokens_per_s / bound:.1%} of the compute bound "
        f"({bound:,.0f}), {pred.tokens_per_s / alone:.1f}x the fastest device alone ({alone:,.0f})",
        f"  learning: each trained token teaches {pred.efficiency:.0%} of a synchronous one "
        f"({shape.data_parallel} pipelines averaging rounds of H = {result.local_steps}): "
        f"{pred.effective_tokens_per_s:,.0f} effective tokens/s, what the plan was chosen by",
        f"  replicas: {_replicas_note(scenario, result)}",
        f"  tokens/s: compute {pred.compute_tokens_per_s:,.0f} -> with pipeline fill and activations "
        f"{pred.pipeline_tokens_per_s:,.0f} -> with the exchange {pred.exchange_tokens_per_s:,.0f} -> with churn "
        f"{pred.tokens_per_s:,.0f}",
        f"  per server step ({pred.step_tokens:,.0f} tokens): {b['iteration_s']:.3f} s = compute {b['compute_s']:.3f} "
        f"+ pipeline {b['pipeline_comm_s']:.3f} + exchange {b['sync_comm_s']:.3f} + churn {b['churn_s']:.3f}",
        f"  median pipeline: share {pred.share_s:.3f} s (fill {pred.fill_fraction:.0%}), "
        f"exchange {pred.exchange_s:.3f} s, "
        f"round {pred.round_s:.3f} s; busiest server at {pred.server_utilisation:.0%} of its link; contributions "
        f"{pred.staleness:.2f} versions behind, counting {pred.staleness_weight:.0%}; churn costs "
        f"{pred.churn_fraction:.1%}; the ledger issues {pred.ledger_requests_per_s:,.0f} shares/s",
        f"reference cost {reference_cost(scenario, result):.3f} s "
        f"(no plan of this shape below {reference_lower_bound(scenario, shape):.3f} s)",
    ]
    return "\n".join(lines)


def run_plan(
    scenario_path: Path, *, as_json: bool, network: bool, devices: bool, reliability: bool, time_budget_s: float
) -> int:
    settings = PlannerConfig(Awareness(network, devices, reliability), time_budget_s=time_budget_s)
    size = scenario_path.stat().st_size if scenario_path.is_file() else 0
    if size < SHOW_PROGRESS_BYTES:
        scenario = load_scenario(scenario_path)
        result = plan(scenario, settings)
    else:
        scenario, result = _plan_showing_progress(scenario_path, size, settings)
    if as_json:
        print(json.dumps(plan_json(scenario, result), indent=2))
    else:
        print(describe(scenario, result))
    return 0
