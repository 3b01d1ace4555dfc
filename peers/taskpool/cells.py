"""Cell leases: which worker holds which cell (pipeline p, stage s), and the pool's rule.

A worker holds a cell through a signed, expiring lease stored under
``swarmd/<run>/cells/<p>`` (one key per pipeline, the holder's peer ID as subkey), renewed
while it lives and released when it stops. The DHT has no compare-and-swap, so every reader
settles a cell by the same rule (``resolve_cells``) over the same records:

1. A lease counts only when it is live and its signer is a **live member** of the run (a
   valid heartbeat): a key that never joined cannot hold anything.
2. The peer the assignment in force names for the cell (the plan's, or the provisional one,
   ``swarmd.peers.taskpool.assignment``) holds it as soon as it has a lease there.
3. A cell whose named peer is not a live member is **open**: it may be held by a *spare*
   (a live member the assignment gives no cell), the earliest claim first, then the lowest
   peer ID. Which spare should claim which open cell is ``spare_for``: a deterministic draw,
   so that spares do not all rush the same cell; the coordinator's repair then names one.

A pipeline's **epoch** (``pipeline_epoch``) is a digest of its holders: every message between
its cells carries it, and a change (a cell changed hands) voids the share in flight.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Set
from dataclasses import dataclass
from typing import Any, ClassVar

from swarmd.peers.records.envelope import Fields
from swarmd.peers.records.signed import Head
from swarmd.peers.taskpool.lease import Lease

KIND = "cell-lease"
MAX_LEASE_BYTES = 2048
MAX_PIPELINES = 100_000
MAX_STAGES = 1024

Cell = tuple[int, int]
"""(pipeline, stage)."""


@dataclass(frozen=True, kw_only=True)
class CellLease(Lease):
    KIND: ClassVar[str] = KIND
    MAX_BYTES: ClassVar[int] = MAX_LEASE_BYTES
    pipeline: int
    stage: int

    @property
    def cell(self) -> Cell:
        return (self.pipeline, self.stage)

    @classmethod
    def _read_claim(cls, f: Fields, head: Head) -> dict[str, Any]:
        return {"pipeline": f.integer("pipeline", 0, MAX_PIPELINES - 1), "stage": f.integer("stage", 0, MAX_STAGES - 1)}


def resolve_cells(
    leases: Iterable[CellLease], named: Mapping[Cell, str], live: Set[str], now: float
) -> dict[Cell, CellLease]:
    """Who holds each cell of ``named`` (the assignment in force), by the rule of the module doc.

    ``live`` is the set of live members' peer IDs (this peer included). A spare may hold at
    most one open cell: its earliest claim wins, so a spare that raced for two keeps one."""
    valid = [lease for lease in leases if lease.is_live(now) and lease.peer_id in live and lease.cell in named]
    assigned = set(named.values())
    holders: dict[Cell, CellLease] = {}
    claims: dict[Cell, list[CellLease]] = {}
    for lease in valid:
        if named[lease.cell] == lease.peer_id:
            holders[lease.cell] = lease
        elif named[lease.cell] not in live and lease.peer_id not in assigned:
            claims.setdefault(lease.cell, []).append(lease)
    taken: set[str] = set()
    order = sorted(
        (min(c, key=_claim_order) for c in claims.values()), key=_claim_order
    )  # the earliest claims settle first
    for best in order:
        for lease in sorted(claims[best.cell], key=_claim_order):
            if lease.peer_id not in taken:
                holders[lease.cell] = lease
                taken.add(lease.peer_id)
                break
    return holders


def _claim_order(lease: CellLease) -> tuple[float, str]:
    return (lease.claimed_at, lease.peer_id)


def open_cells(named: Mapping[Cell, str], live: Set[str]) -> list[Cell]:
    """Cells whose named peer is not a live member: spares may take them."""
    return sorted(cell for cell, peer in named.items() if peer not in live)


def spares(named: Mapping[Cell, str], live: Iterable[str]) -> list[str]:
    """Live members the assignment gives no cell."""
    assigned = set(named.values())
    return sorted(p for p in live if p not in assigned)


def spare_for(cells: list[Cell], candidates: list[str]) -> dict[Cell, str]:
    """Which spare should claim which open cell: each cell, in order, takes the candidate of
    lowest ``hash(peer, cell)`` not yet given one. Every reader computes the same."""
    left = set(candidates)
    out: dict[Cell, str] = {}
    for cell in sorted(cells):
        if not left:
            break
        best = min(left, key=lambda peer: _draw(peer, cell))
        out[cell] = best
        left.discard(best)
    return out


def _draw(peer: str, cell: Cell) -> bytes:
    return hashlib.sha256(f"{peer}/{cell[0]}/{cell[1]}".encode()).digest()


def pipeline_epoch(pipeline: int, holders: list[str | None]) -> str | None:
    """A digest of a pipeline's holders, stage by stage (None while a cell has none)."""
    if any(h is None for h in holders):
        return None
    text = f"{pipeline}:" + ",".join(h for h in holders if h is not None)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def cells_to_hold(me: str, named: Mapping[Cell, str], holders: Mapping[Cell, CellLease], live: Set[str]) -> list[Cell]:
    """The cells ``me`` should claim or keep: those the assignment names it for; a spare keeps
    the open cell it already holds, else claims the one ``spare_for`` draws for it among the
    open cells no spare holds yet."""
    mine = sorted(cell for cell, peer in named.items() if peer == me)
    if mine:
        return mine
    taken = {cell: lease.peer_id for cell, lease in holders.items() if named[cell] not in live}
    held = sorted(cell for cell, peer in taken.items() if peer == me)
    if held:
        return held[:1]
    free = [cell for cell in open_cells(named, live) if cell not in taken]
    draw = spare_for(free, [p for p in spares(named, live) if p not in taken.values()])
    return sorted(cell for cell, peer in draw.items() if peer == me)
