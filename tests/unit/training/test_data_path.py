"""The training data path end to end, in one process (swarm_in_process.py): the daemon's own
trainers, cells, shard servers, ledger and replicas over an in-memory DHT and network.

What must hold (docs/data-path.md): a peer alone holds everything and learns; several peers
split into pipelines whose tensors go cell to cell; each cell contributes once per round; a
killed cell's share is issued again; a killed server's standby takes its shard over at the last
committed version, so no committed update is lost.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
import torch

from swarmd.models import parameter_shard
from swarmd.models.cell_compute import CellCompute
from swarmd.peers.records.plan_record import PlanRecord
from swarmd.peers.taskpool.exchange import outer_step_for
from tests.unit.training.swarm_in_process import Swarm

pytestmark = pytest.mark.timeout(240)

T = TypeVar("T")


def run(folder: Path, peers: int, scenario: Callable[[Swarm], Awaitable[T]], **swarm: Any) -> T:
    """Start a swarm, play ``scenario`` on it, stop it whatever happened."""

    async def main() -> T:
        s = Swarm(folder, peers, **swarm)
        s.start()
        try:
            return await scenario(s)
        finally:
            await s.stop()

    return asyncio.run(main())


def test_one_peer_holds_every_cell_and_shard_and_learns(tmp_path: Path) -> None:
    async def scenario(swarm: Swarm) -> tuple[dict[str, Any], dict[str, int]]:
        await swarm.wait_for("30 updates", lambda: swarm.updates() >= 30, 180)
        (member,) = swarm.members.values()
        return member.trainer.status(), dict(member.sent)

    status, sent = run(tmp_path, 1, scenario)
    assert len(status["cells"]) == 2 and len(status["shards"]) == 2
    losses = [loss for _, loss in status["losses"]]
    # ln(256) = 5.55 at the start; 30 updates of the tiny model take it well below.
    assert statistics.mean(losses[-8:]) < statistics.mean(losses[:8]) - 0.5, losses
    assert sent.get("CellForward", 0) == 0  # its own cells: every tensor stayed in process


def test_four_peers_make_two_pipelines_whose_cells_contribute_once_a_round(tmp_path: Path) -> None:
    async def scenario(swarm: Swarm) -> tuple[list[dict[str, Any]], int, int]:
        await swarm.wait_for("12 updates", lambda: swarm.updates() >= 12, 180)
        statuses = [m.trainer.status() for m in swarm.members.values()]
        forwards = sum(m.sent.get("CellForward", 0) for m in swarm.members.values())
        contributions = sum(m.sent.get("Contribute", 0) for m in swarm.members.values())
        return statuses, forwards, contributions

    statuses, forwards, contributions = run(tmp_path, 4, scenario)
    assert sorted(len(s["cells"]) for s in statuses) == [1, 1, 1, 1]
    shares = sum(c["shares"] for s in statuses for c in s["cells"])
    # Every micro-batch's activation crossed its pipeline's one boundary, and each cell sent one
    # contribution per round (a round is one share here, H = 1), not one per micro-batch.
    micro_batches = sum(c["forwards"] for s in statuses for c in s["cells"] if c["stage"] == 0)
    assert forwards >= micro_batches - 2 * 2
    assert contributions <= shares + 4
    assert sum(1 for s in statuses if s["ledger"]) == 1


def test_a_killed_cell_is_recomputed_and_no_data_is_skipped(tmp_path: Path) -> None:
    def ledger(swarm: Swarm) -> dict[str, Any]:
        found = [s["ledger"] for m in swarm.members.values() if m.alive and (s := m.trainer.status())["ledger"]]
        return found[0] if found else {"done_below": -1, "cursor": 0}

    async def scenario(swarm: Swarm) -> tuple[int, dict[str, Any]]:
        await swarm.wait_for("6 updates", lambda: swarm.updates() >= 6, 180)
        # The holder of pipeline 1's last cell holds no shard: its death costs only its share.
        victim = next(p for p, m in swarm.members.items() if (1, 1) in m.trainer.cells)
        issued = ledger(swarm)["cursor"]
        await swarm.kill(victim)
        # Every micro-batch issued before the kill is trained: completed, or issued again and
        # recomputed by the pipeline that is left.
        await swarm.wait_for("every issued micro-batch trained", lambda: ledger(swarm)["done_below"] >= issued, 180)
        return issued, ledger(swarm)

    issued, after = run(tmp_path, 4, scenario)
    assert after["done_below"] >= issued > 0


def test_a_killed_server_is_taken_over_by_its_standby_with_no_update_lost(tmp_path: Path) -> None:
    async def scenario(swarm: Swarm) -> tuple[int, int, int]:
        await swarm.wait_for("8 updates", lambda: swarm.updates() >= 8, 180)
        victim = next(p for p, m in swarm.members.items() if (1, 0) in m.trainer.servers)
        committed = swarm.members[victim].trainer.servers[(1, 0)].version
        await swarm.kill(victim)

        def served() -> list[int]:
            return [
                m.trainer.servers[(1, 0)].version
                for m in swarm.members.values()
                if m.alive and (1, 0) in m.trainer.servers
            ]

        await swarm.wait_for("the shard served again", lambda: bool(served()), 120)
        resumed = max(served())
        await swarm.wait_for("4 more steps", lambda: max(served(), default=0) >= committed + 4, 180)
        return committed, resumed, max(served())

    committed, resumed, final = run(tmp_path, 4, scenario)
    assert resumed >= committed  # every committed step was at the standby


def test_with_a_plan_a_spare_takes_the_dead_cell_and_the_named_standby_its_shard(tmp_path: Path) -> None:
    async def scenario(swarm: Swarm) -> tuple[str, str, str, int, dict[str, Any]]:
        a, b, spare = sorted(swarm.members)
        record = PlanRecord(
            run_id=swarm.spec.run_id,
            peer_id=a,
            issued_at=time.time(),
            expires_at=time.time() + 600,
            version=1,
            kind="full",
            devices=[a, b, spare],
            pipelines=[[0, 1]],
            layers_per_stage=[2, 2],
            parameter_servers=[0, 1],
        )
        for member in swarm.members.values():
            member.trainer.roles.plan = record
        await swarm.wait_for("6 updates", lambda: swarm.updates() >= 6, 180)
        standby = swarm.members[b].trainer.status()["standby"]
        committed = swarm.members[b].trainer.servers[(1, 0)].version
        await swarm.kill(b)

        def taken() -> bool:
            return (0, 1) in swarm.members[spare].trainer.cells and (1, 0) in swarm.members[standby].trainer.servers

        await swarm.wait_for("the spare and the standby to take over", taken, 120)
        resumed = swarm.members[standby].trainer.servers[(1, 0)].version
        before = swarm.updates()
        await swarm.wait_for("4 more updates", lambda: swarm.updates() >= before + 4, 180)
        return spare, standby, b, resumed - committed, swarm.members[standby].trainer.status()

    spare, standby, dead, gained, status = run(tmp_path, 3, scenario)
    assert standby != dead and gained >= 0  # the take-over resumed at the last committed step or later
    assert status["assignment"]["version"] == 1  # still the plan: the pool's rules filled its holes


def test_local_steps_contribute_a_pseudo_gradient_every_h_shares_and_learn(tmp_path: Path) -> None:
    local = {"exchange": {"local_steps": 4}}  # the outer step by H (exchange.outer_step_for)

    async def scenario(swarm: Swarm) -> list[dict[str, Any]]:
        await swarm.wait_for("4 outer steps", lambda: swarm.updates() >= 4, 200)
        for m in swarm.members.values():
            assert m.trainer.geometry.config().outer_lr == outer_step_for(4)[0]
        return [m.trainer.status() for m in swarm.members.values()]

    statuses = run(tmp_path, 2, scenario, spec_changes=local)
    assert all(s["mode"] == "local" for s in statuses)
    cells = [c for s in statuses for c in s["cells"]]
    # Each cell took an inner step per share and contributed once per round of H = 4 shares.
    assert all(c["rounds"] * 4 <= c["shares"] + 4 and c["rounds"] >= 1 for c in cells), cells
    losses = [loss for s in statuses for _, loss in s["losses"]]
    assert statistics.mean(losses[-8:]) < statistics.mean(losses[:8]) - 0.3, losses


def grouped_plan(swarm: Swarm, devices: list[str], pipelines: list[list[int]], servers: list[int]) -> PlanRecord:
    """A plan whose stages reduce in groups of 2: pipeline 0's cells head the one shard of each
    stage, so pipeline 1's cells send their slices to them and pull the deltas from them."""
    return PlanRecord(
        run_id=swarm.spec.run_id,
        peer_id=devices[0],
        issued_at=time.time(),
        expires_at=time.time() + 600,
        version=1,
        kind="full",
        devices=devices,
        pipelines=pipelines,
        layers_per_stage=[2, 2],
        parameter_servers=servers,
        reduce_groups=[2, 2],
    )


def test_a_reduction_group_sums_its_cells_slices_before_the_server_and_learns(tmp_path: Path) -> None:
    async def scenario(swarm: Swarm) -> list[dict[str, Any]]:
        peers = sorted(swarm.members)
        record = grouped_plan(swarm, peers, [[0, 1], [2, 3]], [0, 1])
        for member in swarm.members.values():
            member.trainer.roles.plan = record

        def pulled_from_heads() -> bool:
            cells = [c for m in swarm.members.values() for c in m.trainer.status()["cells"]]
            return len(cells) == 4 and all(c["weights"]["head_pulls"] >= 4 for c in cells if c["pipeline"] == 1)

        await swarm.wait_for("10 updates", lambda: swarm.updates() >= 10, 200)
        # (a head that had not opened its cell yet, or read its member's lease, sent the member
        # to the server for a few seconds at the start)
        await swarm.wait_for("pipeline 1's cells to pull from their heads", pulled_from_heads, 120)
        return [m.trainer.status() for m in swarm.members.values()]

    statuses = run(tmp_path, 4, scenario)
    reducers = [s["reducer"] for s in statuses]
    # The heads sent sums of both pipelines' slices: one contribution per shard and round where
    # there were two, and none of pipeline 1's cells had to go to the server itself.
    assert sum(r["sums"] for r in reducers) >= 4, str(reducers)
    assert sum(r["summed"] for r in reducers) >= 2 * sum(r["sums"] for r in reducers)
    cells = [c for s in statuses for c in s["cells"]]
    assert all(c["contributions"]["direct"] == 0 for c in cells), cells
    # The deltas came back the same way: pipeline 1's cells pulled them from their heads, which
    # pulled them from the servers.
    assert sum(r["pulls"] for r in reducers) >= 8, str(reducers)
    losses = [loss for s in statuses for _, loss in s["losses"]]
    assert statistics.mean(losses[-8:]) < statistics.mean(losses[:8]) - 0.3, losses


def test_a_head_killed_during_a_reduction_loses_no_update_and_its_members_go_to_the_server(tmp_path: Path) -> None:
    async def scenario(swarm: Swarm) -> tuple[int, int, int, list[dict[str, Any]]]:
        peers = sorted(swarm.members)
        # Pipelines 0 and 1 (peers 0-3) reduce in a group; peer 4 serves both stages' shards;
        # peer 5 is a spare that takes the dead head's cell.
        record = grouped_plan(swarm, peers, [[0, 1], [2, 3]], [4, 4])
        for member in swarm.members.values():
            member.trainer.roles.plan = record
        head = peers[0]
        # One budget for the three waits, below the test's timeout, so a slow machine fails
        # with the trainers' states rather than a bare timeout.
        deadline = time.monotonic() + 220

        def left() -> float:
            return max(1.0, deadline - time.monotonic())

        await swarm.wait_for("4 updates", lambda: swarm.updates() >= 4, left())
        # Kill the head the moment it holds a member's slice waiting for its own, mid-reduction.
        reducer = swarm.members[head].trainer.reducer
        killed = asyncio.Event()
        original = reducer.reduce

        async def reduce_then_die(sender: str, request: Any, blob: bytes, tickets: bytes) -> Any:
            if sender != head and not killed.is_set():
                killed.set()
                asyncio.get_running_loop().call_soon(lambda: asyncio.ensure_future(swarm.kill(head)))
            return await original(sender, request, blob, tickets)

        reducer.reduce = reduce_then_die  # type: ignore[method-assign]
        await asyncio.wait_for(killed.wait(), left())
        server = swarm.members[peers[4]].trainer.servers
        committed = min(s.version for s in server.values())
        await swarm.wait_for("4 more updates", lambda: min(s.version for s in server.values()) >= committed + 4, left())
        after = min(s.version for s in server.values())
        statuses = [m.trainer.status() for p, m in swarm.members.items() if m.alive]
        return committed, after, len(server), statuses

    committed, after, shards, statuses = run(tmp_path, 6, scenario)
    assert shards == 2 and after >= committed + 4  # the server never went back: no update lost
    cells = [c for s in statuses for c in s["cells"]]
    # The member whose slice was at the dead head sent it (and later ones, until the spare
    # headed again) to the server itself.
    assert sum(c["contributions"]["direct"] for c in cells) >= 1, cells
    assert all(c["contributions"]["lost"] == 0 for c in cells), cells


def test_a_round_that_comes_out_non_finite_is_dropped_and_its_shares_trained_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Seen in the four-daemon test: stage 0's round came out NaN, no codec could carry it, and
    # its shares stayed open at the ledger, holding the pipeline for the ledger's 10-minute lease.
    real = CellCompute.contribution
    poisoned: list[int] = []

    def contribution(self: CellCompute) -> tuple[torch.Tensor, int]:
        vector, count = real(self)
        if self.module.stage == 0 and not poisoned:
            poisoned.append(count)
            vector = vector.clone()
            vector[0] = float("nan")
        return vector, count

    monkeypatch.setattr(CellCompute, "contribution", contribution)

    async def scenario(swarm: Swarm) -> dict[str, Any]:
        await swarm.wait_for("12 updates", lambda: swarm.updates() >= 12, 120)
        (member,) = swarm.members.values()
        return member.trainer.status()

    status = run(tmp_path, 1, scenario)
    (first,) = [c for c in status["cells"] if c["stage"] == 0]
    assert poisoned and first["dropped_rounds"] == 1
    ledger = status["ledger"]
    assert ledger["abandoned"] >= 1 and ledger["reissued"] >= 1
    assert ledger["done_below"] >= 6 * 4  # the dropped shares (the first) were trained again: no gap


def test_a_step_dropped_at_the_server_is_sent_again_through_the_groups_head(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A server's step that comes out non-finite is undone and its shares forgotten; the cells
    # that sent them must send them again. A member of a reduction group pulls through its head,
    # so the head must pass the server's "unknown" on: else the member's round stays undelivered,
    # the server waits for its share of the batch, and training stops.
    real = parameter_shard._all_finite
    calls: list[int] = []

    def once_not_finite(x: torch.Tensor) -> bool:
        calls.append(1)
        return False if len(calls) == 40 else real(x)

    monkeypatch.setattr(parameter_shard, "_all_finite", once_not_finite)

    async def scenario(swarm: Swarm) -> list[dict[str, Any]]:
        peers = sorted(swarm.members)
        record = grouped_plan(swarm, peers, [[0, 1], [2, 3]], [0, 1])
        for member in swarm.members.values():
            member.trainer.roles.plan = record

        def dropped() -> int:
            return sum(s["dropped_steps"] for m in swarm.members.values() for s in m.trainer.status()["shards"])

        await swarm.wait_for("a step dropped", lambda: dropped() >= 1, 150)
        at = swarm.updates()
        await swarm.wait_for("6 updates after the dropped step", lambda: swarm.updates() >= at + 6, 60)
        return [m.trainer.status() for m in swarm.members.values()]

    statuses = run(tmp_path, 4, scenario)
    cells = [c for s in statuses for c in s["cells"]]
    assert all(c["contributions"]["lost"] == 0 for c in cells), cells
    assert sum(r["reducer"]["pulls"] for r in statuses) >= 4  # the members did pull through their heads
