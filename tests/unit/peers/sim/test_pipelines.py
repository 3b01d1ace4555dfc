"""peers/sim/pipelines.py, through swarmd's path in a small world: the pipelines' cells by
stage and the grid a repair sees, and what the shard servers' reports start again (a settled
round's shares completed at the ledger, the ledger rebuilt at a failover)."""

from __future__ import annotations

import pytest

from swarmd.peers.planning.plan_cost import Plan
from swarmd.peers.sim.shard_records import RoundGroup
from swarmd.peers.sim.swarmd_path import SwarmdPath
from tests.unit.peers.sim.small_world import world

pytestmark = pytest.mark.timeout(20)

SERVED = Plan(pipelines=((0, 1), (2, 3)), layers_per_stage=(2, 2), parameter_servers=(4, 4), share_micro_batches=4)


def test_the_cells_of_a_stage_are_its_pipelines_in_the_plans_order() -> None:
    w = world(5)
    pipes = SwarmdPath(w, SERVED).pipelines
    assert [c.device for c in pipes.cells_of_stage(0)] == [0, 2]
    assert [c.device for c in pipes.cells_of_stage(1)] == [1, 3]
    assert pipes.grid() == ((0, 1), (2, 3))


def test_a_settled_round_completes_its_shares_at_the_ledger() -> None:
    w = world(5)
    path = SwarmdPath(w, SERVED)
    pipes = path.pipelines
    ids = tuple(s.share_id for s in path.ledger.issue(0.0, "d4", 2))
    pipes.round_settled(1.0, RoundGroup("d4", ids, 0))
    assert path.ledger.ledger.counters.completed == 2 and not path.ledger.held["d4"]


def test_a_rebuilt_ledger_reissues_the_open_shares_and_starts_the_pipelines_that_waited_on_it() -> None:
    w = world(5)
    path = SwarmdPath(w, SERVED)
    pipes = path.pipelines
    w.engine.run_until(20.0, 1_000_000)
    w.changed(4, False)
    w.engine.run_until(40.0, 1_000_000)
    assert all(p.waiting == "ledger" for p in pipes.pipelines)
    w.changed(4, True)
    before = path.ledger.ledger
    pipes.ledger_restarted(40.0)
    assert path.ledger.ledger is not before
    assert all(p.waiting == "" and p.segment for p in pipes.pipelines)
    assert path.ledger.ledger.counters.reissued >= 1  # shares open before the failover, again


def test_a_noticed_departure_has_the_ledger_issue_its_stage_0_shares_again() -> None:
    w = world(6)
    path = SwarmdPath(w, SERVED)
    pipes = path.pipelines
    w.engine.run_until(20.5, 1_000_000)
    held = set(path.ledger.held["d0"])
    assert held
    w.changed(0, False)
    path.departed(20.5, 0)
    w.noticed(80.0, 0, False)
    pipes.noticed_departure(80.0, 0)
    assert "d0" not in path.ledger.held
    assert w.counts["spare_claims"] == 1 and pipes.pipelines[0].cells[0].device == 4  # the first holding none
