"""peers/sim/cell_holders.py, through swarmd's path in a small world: the pipelines follow a
plan's grid (keeping those most of whose cells stay), a departed holder's cells break and open,
and spares claim the open cells once the departure is noticed."""

from __future__ import annotations

import pytest

from swarmd.peers.planning.plan_cost import Plan
from swarmd.peers.sim.swarmd_path import SwarmdPath
from tests.unit.peers.sim.small_world import world

pytestmark = pytest.mark.timeout(20)

TWO_BY_TWO = Plan(pipelines=((0, 1), (2, 3)), layers_per_stage=(2, 2), parameter_servers=(0, 1), share_micro_batches=4)
"""Pipelines (d0, d1) and (d2, d3); d0 and d1 serve the stages; d4 holds nothing."""


def test_the_first_grid_is_seeded_and_a_new_one_keeps_the_pipelines_its_cells_come_from() -> None:
    w = world(5)
    path = SwarmdPath(w, TWO_BY_TWO)
    first = list(path.pipelines.pipelines)
    assert [[c.device for c in p.cells] for p in first] == [[0, 1], [2, 3]]
    assert all(c.ready for p in first for c in p.cells)  # every peer built the seeded weights
    w.engine.run_until(10.0, 100_000)
    path.pipelines.apply(10.0, ((2, 4), (0, 1)))
    kept = path.pipelines.pipelines
    assert [p.pid for p in kept] == [first[1].pid, first[0].pid]  # (2, _) is pipeline 2's
    moved = kept[0].cells[1]
    assert moved.device == 4 and not moved.ready and moved.missing == {0}  # fetching stage 1
    w.engine.run_until(20.0, 100_000)
    assert moved.ready


def test_a_departed_holder_leaves_its_cell_open_and_a_spare_claims_it_once_noticed() -> None:
    w = world(5)
    path = SwarmdPath(w, TWO_BY_TWO)
    p = path.pipelines.pipelines[1]
    w.engine.run_until(30.0, 100_000)
    w.changed(3, False)
    path.departed(30.0, 3)
    assert p.cells[1].device is None and p.cells[1].named == 3
    assert path.pipelines.grid() == ((0, 1), (2, 3))  # the repair sees the hole by its holder
    assert p.waiting == "cells"
    w.engine.run_until(90.0, 1_000_000)
    assert p.waiting == "cells" and p.cells[1].device is None  # the lease has not lapsed yet
    w.noticed(90.0, 3, False)
    path.noticed_departure(90.0, 3)
    assert w.counts["spare_claims"] == 1 and p.cells[1].device == 4
    w.engine.run_until(200.0, 1_000_000)
    assert p.cells[1].ready and p.waiting != "cells"
