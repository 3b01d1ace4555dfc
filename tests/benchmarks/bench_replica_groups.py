"""What a replica of several devices would cost: a group reducing its gradient every inner step.

    .venv/bin/python tests/benchmarks/bench_replica_groups.py [--models 200M 1.3B] [--devices 1000] [--seed 0]

A DiLoCo replica made of G devices in one region (or a regional server synced every inner
step) all-reduces the model's gradient among them every inner step. For each synthetic
scenario (``scenario_gen``, three regions) this plans the swarm as the planner does, then
prints what one inner step of a replica trains (the plan's k micro-batches on the fastest
device) against a ring all-reduce of the gradient among G devices over the region's links:
the median and the fastest link inside a region (``2 (G - 1) / G`` of the bytes each), the
ratio of the two, and the micro-batches a device would have to train an inner step to hide
it. What the group would teach is measured by ``bench_token_efficiency --share`` (fewer,
larger replicas at the same global batch; docs/results.md). Figures only; nothing is asserted.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from swarmd.peers.planning.planner import PlannerConfig, plan
from swarmd.peers.planning.scenario import Scenario
from swarmd.peers.planning.throughput import fastest_device_tokens_per_s

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script: the scaling bench's models
from tests.benchmarks.bench_scaling import MODELS, synthetic_scenario  # noqa: E402

GROUP_SIZES = (2, 4, 8)


def ring_all_reduce_s(nbytes: float, members: int, link_Bps: float) -> float:
    """Seconds of a ring all-reduce of ``nbytes`` among ``members`` over links of ``link_Bps``:
    each member sends ``2 (N - 1) / N`` of the bytes (latency left out: it only adds)."""
    return 2.0 * (members - 1) / members * nbytes / link_Bps


def intra_region_links(scenario: Scenario) -> np.ndarray:
    """Bytes per second of every link between two devices of the same region."""
    regions = np.array([d.region for d in scenario.devices])
    same = regions[:, None] == regions[None, :]
    np.fill_diagonal(same, False)
    return np.asarray(scenario.bandwidth_Bps)[same]


def report(model: str, devices: int, seed: int) -> list[str]:
    scenario = synthetic_scenario(devices, regions=3, seed=seed, churn=False, model=MODELS[model])
    found = plan(scenario, PlannerConfig(time_budget_s=5.0, seed=seed))
    k = found.micro_batches_per_share(scenario)
    spec = scenario.model
    gradient = spec.params * spec.dtype_bytes
    micro_batch_s = scenario.micro_batch * spec.seq_len / fastest_device_tokens_per_s(scenario)
    inner_step_s = k * micro_batch_s
    links = intra_region_links(scenario)
    lines = [
        f"{model} on {devices:,} devices: plan {found.shape.stages} x {found.shape.data_parallel}, H = "
        f"{found.local_steps}, k = {k}; gradient {gradient / 1e6:,.0f} MB; an inner step {inner_step_s * 1e3:,.0f} ms "
        f"on the fastest device ({micro_batch_s * 1e3:.1f} ms a micro-batch); links inside a region "
        f"median {np.median(links) / 1e6:,.0f} MB/s, fastest {links.max() / 1e6:,.0f} MB/s",
        "| G | link | all-reduce s | x the inner step | micro-batches an inner step to hide it |",
        "|---:|---|---:|---:|---:|",
    ]
    for g in GROUP_SIZES:
        for name, rate in (("median", float(np.median(links))), ("fastest", float(links.max()))):
            seconds = ring_all_reduce_s(gradient, g, rate)
            lines.append(
                f"| {g} | {name} | {seconds:,.1f} | {seconds / inner_step_s:,.0f} | {seconds / micro_batch_s:,.0f} |"
            )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--devices", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    for model in args.models:
        print("\n".join(report(model, args.devices, args.seed)), end="\n\n", flush=True)


if __name__ == "__main__":
    main()
