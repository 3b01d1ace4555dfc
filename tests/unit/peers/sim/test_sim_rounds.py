"""peers/sim/rounds.py, through swarmd's path in a small world: a pipeline's rounds start when
nothing holds them back (its cells, the ledger's holder, the step the last round went into, a
contribution still on its way) and end with a contribution of every cell to each shard."""

from __future__ import annotations

import pytest

from swarmd.peers.planning.plan_cost import Plan
from swarmd.peers.sim.swarmd_path import SwarmdPath
from tests.unit.peers.sim.small_world import world

pytestmark = pytest.mark.timeout(20)

SERVED = Plan(pipelines=((0, 1), (2, 3)), layers_per_stage=(2, 2), parameter_servers=(4, 4), share_micro_batches=4)
"""Two pipelines of two stages; d4, holding no cell, serves both stages and the ledger."""


def test_rounds_end_with_a_contribution_to_each_shard_and_the_steps_they_make() -> None:
    w = world(5)
    path = SwarmdPath(w, SERVED)
    w.engine.run_until(120.0, 1_000_000)
    rounds = w.phases.status()["round"]["n"]
    assert rounds >= 10
    # Every round of a pipeline sends one contribution per cell (one shard a stage here), and
    # two pipelines' rounds of 4 micro-batches make the batch of 8: a step per round pair.
    assert w.phases.status()["contribution"]["n"] >= 2 * rounds - 4
    for row in path.shards.stages:
        assert abs(row[0].version - rounds // 2) <= 2
    assert path.ledger.ledger.counters.completed >= rounds - 2  # stage 0's rounds settled


def test_a_round_waits_while_the_ledgers_holder_is_away_and_counts_the_wait() -> None:
    w = world(5)
    path = SwarmdPath(w, SERVED)
    w.engine.run_until(30.0, 1_000_000)
    w.changed(4, False)
    w.engine.run_until(60.0, 1_000_000)
    assert all(p.waiting == "ledger" for p in path.pipelines.pipelines)
    w.changed(4, True)
    w.engine.returned(60.0, 4)
    for p in path.pipelines.pipelines:
        path.pipelines.rounds.try_start(60.0, p)
    assert all(p.waiting == "" for p in path.pipelines.pipelines)
    assert w.phases.status()["wait_ledger"]["n"] == 2


def test_a_contribution_still_on_its_way_holds_the_round_back_until_it_arrives() -> None:
    w = world(5)
    path = SwarmdPath(w, SERVED)
    p = path.pipelines.pipelines[0]
    w.engine.run_until(30.0, 1_000_000)
    p.segment = []
    p.shares_done = 1  # H = 1: the round is through
    p.cells[1].in_flight.add(-1)  # a contribution the shard has not had yet
    path.pipelines.rounds.try_start(30.0, p)
    assert p.waiting == "backpressure" and p.shares_done == 1
    p.cells[1].in_flight.clear()
    path.pipelines.rounds.delivered(30.5, p.cells[1])
    assert p.waiting != "backpressure" and p.shares_done == 0  # the next round began
