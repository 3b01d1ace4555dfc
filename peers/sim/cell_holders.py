"""Who holds each cell (``pipelines`` module doc, "Faults").

Following the plan's grid, cells that change hands, departures, and spares that fill the holes.

A cell whose device leaves breaks its pipeline's segment, loses its holder's progress of the
round (a later stage's is counted as a contribution lost; stage 0's shares are issued again
when the departure is noticed), and leaves a hole. A spare fills it by the pool's rule
(``cells.spare_for``) once the lease lapses, or the coordinator's repair does; the new device
fetches its stage's weights whole before the pipeline starts again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from swarmd.peers.sim.pipeline_state import Cell, Pipeline
from swarmd.peers.taskpool.cells import spare_for, spares

if TYPE_CHECKING:
    from swarmd.peers.sim.ledger_client import LedgerClient
    from swarmd.peers.sim.rounds import Rounds
    from swarmd.peers.sim.shards import ShardServers
    from swarmd.peers.sim.world import World


class CellHolders:
    def __init__(self, world: World, ledger: LedgerClient, rounds: Rounds, shards: ShardServers) -> None:
        self.world = world
        self.ledger = ledger
        self.shards = shards
        self.rounds = rounds
        self._pid = 0

    def apply(
        self, now: float, pipelines: list[Pipeline], rows: tuple[tuple[int, ...], ...], seeded: bool
    ) -> list[Pipeline]:
        """The pipelines that follow a plan's grid: each row keeps the pipeline most of its
        cells come from; a cell that changes hands (or a new pipeline's) fetches its stage's
        weights first. ``seeded``: the run's start, when every peer builds the initial weights."""
        where = {(s, c.device): p for p in pipelines for s, c in enumerate(p.cells) if c.device is not None}
        for p in pipelines:
            for s, c in enumerate(p.cells):
                where.setdefault((s, c.named), p)
        by_pid = {p.pid: p for p in pipelines}
        kept: list[Pipeline] = []
        taken: set[int] = set()
        for row in rows:
            votes: dict[int, int] = {}
            for s, d in enumerate(row):
                held = where.get((s, d))
                if held is not None and held.pid not in taken:
                    votes[held.pid] = votes.get(held.pid, 0) + 1
            if votes:
                pid = max(votes, key=lambda q: (votes[q], -q))
                pipeline = by_pid[pid]
                taken.add(pid)
            else:
                self._pid += 1
                pipeline = Pipeline(self._pid, round_started=now)
                pipeline.cells = [Cell(pipeline, s, len(self.shards.stages[s])) for s in range(len(row))]
            for cell, d in zip(pipeline.cells, row, strict=True):
                if cell.device != d:
                    self.hand(now, cell, d, seeded)
            pipeline.timing = None
            kept.append(pipeline)
        for p in pipelines:
            if p.pid not in taken:  # the plan dropped it: its holders' work of the round is lost
                for cell in p.cells:
                    self.hand(now, cell, None, seeded)
        return kept

    def hand(self, now: float, cell: Cell, device: int | None, seeded: bool = False) -> None:
        """The cell changes hands: its previous holder's share in flight and progress of the
        round go (module doc); the new one fetches the stage's weights."""
        self.rounds.interrupt(now, cell.pipeline)
        old = cell.device
        if old is not None:
            self._lose_round(cell, old)
        cell.serial += 1
        cell.device, cell.ready, cell.round_shares = device, False, []
        cell.in_flight.clear()
        cell.missing.clear()
        cell.pulling = [False] * cell.shards
        if device is None:
            return
        cell.named = device
        if seeded:
            cell.ready = True
        else:
            self.shards.load(now, cell)

    def _lose_round(self, cell: Cell, device: int) -> None:
        """A holder leaves its cell with the round's work unsent: a later stage's is lost
        (counted); stage 0's shares are issued again (by the ledger, when the holder is known
        gone, or at once if it lives on elsewhere)."""
        world = self.world
        if cell.stage > 0:
            if cell.round_shares:
                world.counts["contributions_lost"] += 1
            return
        if world.up[device] and cell.round_shares:
            self.ledger.abandon(world.ids[device], cell.round_shares)

    def departed(self, now: float, pipelines: list[Pipeline], device: int) -> None:
        """``device`` left: every cell it held breaks (module doc); its contributions in flight
        are cut with its flows."""
        for p in pipelines:
            for cell in p.cells:
                if cell.device != device:
                    continue
                cut = self.shards.cut(cell)
                if cell.stage > 0 and cut:  # stage 0's shares are issued again instead
                    self.world.counts["contributions_lost"] += cut
                self.hand(now, cell, None)
                self.rounds.try_start(now, p)  # it waits for the cell (counted from now)

    def claim_open_cells(self, now: float, pipelines: list[Pipeline]) -> None:
        """Open cells go to live members that hold none, by the pool's rule (``spare_for``)."""
        world = self.world
        named = {
            (p.pid, c.stage): world.ids[c.device if c.device is not None else c.named]
            for p in pipelines
            for c in p.cells
            if c.device is not None or c.named >= 0
        }
        open_cells = [(p.pid, c.stage) for p in pipelines for c in p.cells if c.device is None]
        if not open_cells:
            return
        live = {world.ids[d] for d in world.members()}
        holding = {world.ids[c.device] for p in pipelines for c in p.cells if c.device is not None}
        candidates = [peer for peer in spares(named, live) if peer not in holding]
        by_pid = {p.pid: p for p in pipelines}
        for (pid, stage), peer in spare_for(open_cells, candidates).items():
            world.counts["spare_claims"] += 1
            self.hand(now, by_pid[pid].cells[stage], world.index[peer])
