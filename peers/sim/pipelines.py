"""The pipelines of the simulated data path (``docs/data-path.md``, "One round of one pipeline").

A pipeline is a row of the plan's grid: one cell ``(p, s)`` per stage, each held by a device.

- **Shares** (``ledger_client``, ``segments``). The stage-0 cell asks the ledger (at shard
  ``(0, 0)``'s holder, one round trip) for the round's shares of ``k`` micro-batches, renewing
  the shares it holds (every third of a lease). They run one after the other as one event (a
  *segment*): each lasts ``exchange.share_seconds`` (1F1B over the cells' compute and the
  boundaries' activation transfers, flush to flush), and each boundary's activations and
  gradients are flows on the shared links (through a relay when the daemon's routing rule says
  so), so that they compete with the exchange's traffic: a boundary flow slower than the
  compute stretches the segment. A fault in the middle splits it where the compute schedule
  stands.
- **Rounds** (``rounds``). After H shares every cell contributes to each shard of its stage at
  once (``swarmd.peers.sim.shards``) and the pipeline goes on with its next round; a cell whose
  previous contribution has not arrived yet holds the pipeline back (at most one outstanding).
  Between two shares a cell applies the deltas its pulls brought: a contribution's base is
  the version its weights held when its last share of the round began.
- **Faults** (``cell_holders``). A cell whose device leaves breaks its pipeline's share in
  flight (abandoned at the ledger, which issues it again: recomputed), loses its own progress
  of the round (a later stage's is counted as a contribution lost; stage 0's shares are issued
  again when the departure is noticed), and leaves a hole. A spare fills it by the pool's rule
  (``cells.spare_for``) once the lease lapses, or the coordinator's repair does; the new
  device fetches its stage's weights whole before the pipeline starts again.

``Pipelines`` holds the list of pipelines, builds those parts and the reduction groups'
``Reducers`` (which read the list), and is what the rest of the path calls (the plan,
departures, and what the shard servers report).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from swarmd.peers.sim.cell_holders import CellHolders
from swarmd.peers.sim.reduction import Reducers
from swarmd.peers.sim.rounds import Rounds

if TYPE_CHECKING:
    from swarmd.peers.sim.ledger_client import LedgerClient
    from swarmd.peers.sim.pipeline_state import Cell, Pipeline
    from swarmd.peers.sim.shard_records import RoundGroup
    from swarmd.peers.sim.shards import ShardServers
    from swarmd.peers.sim.workload import RunSizes
    from swarmd.peers.sim.world import World


class Pipelines:
    def __init__(
        self, world: World, sizes: RunSizes, ledger: LedgerClient, shards: ShardServers, groups: tuple[int, ...]
    ) -> None:
        """``groups``: the first plan's reduction group size per stage."""
        self.world = world
        self.pipelines: list[Pipeline] = []
        self.ledger = ledger
        self.reducers = Reducers(world, sizes, self, shards, groups)
        self.rounds = Rounds(world, sizes, ledger, shards, self.reducers)
        self.holders = CellHolders(world, ledger, self.rounds, shards)

    def cells_of_stage(self, stage: int) -> list[Cell]:
        return [p.cells[stage] for p in self.pipelines]

    def grid(self) -> tuple[tuple[int, ...], ...]:
        """The assignment as it stands, for the coordinator's repair: a departed holder's
        index stays in its open cell (the repair sees it is gone and fills the hole)."""
        return tuple(tuple(c.device if c.device is not None else c.named for c in p.cells) for p in self.pipelines)

    # --- the plan and departures ----------------------------------------------------------------

    def apply(self, now: float, rows: tuple[tuple[int, ...], ...], seeded: bool = False) -> None:
        """Follow a plan's grid (``CellHolders.apply``), then start every pipeline that can.
        ``seeded``: the run's start, when every peer builds the initial weights itself."""
        self.pipelines = self.holders.apply(now, self.pipelines, rows, seeded)
        for p in self.pipelines:
            self.rounds.try_start(now, p)

    def departed(self, now: float, device: int) -> None:
        """``device`` left: every cell it held breaks; its contributions in flight are cut."""
        self.holders.departed(now, self.pipelines, device)

    def noticed_departure(self, now: float, device: int) -> None:
        """Its leases lapsed: the ledger issues its shares again, and spares take its cells."""
        self.ledger.forget(self.world.ids[device])
        self.holders.claim_open_cells(now, self.pipelines)

    # --- what the shards report ---------------------------------------------------------------

    def delivered(self, now: float, cell: Cell) -> None:
        self.rounds.delivered(now, cell)

    def cell_ready(self, now: float, cell: Cell) -> None:
        self.rounds.try_start(now, cell.pipeline)

    def pulled(self, now: float, cell: Cell) -> None:
        self.rounds.pulled(now, cell)

    def round_settled(self, now: float, group: RoundGroup) -> None:
        """A stage-0 round is through at every shard of stage 0 (applied, or dropped as stale
        as the daemon's shards drop it): its shares complete at the ledger."""
        self.ledger.complete(group.holder, group.share_ids)
        self._ledger_changed(now)

    def ledger_restarted(self, now: float) -> None:
        """Shard (0, 0) failed over: its ledger holds every share open before as to be issued again."""
        self.ledger.restarted()
        self._ledger_changed(now)

    def _ledger_changed(self, now: float) -> None:
        for p in self.pipelines:
            if p.waiting == "ledger":
                self.rounds.try_start(now, p)
