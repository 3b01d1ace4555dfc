"""The trainer's bookkeeping: what this peer claims of the pool, decided by a pure step.

The trainer reads the pool, feeds each reading to ``step`` and carries out the actions it
returns, in order (``lifecycle``). This module does no I/O and reads no clock, so the rules are
tested over synthetic leases; the trainer's own state between rounds is the frozen ``Books``.

A round is three readings, in this order, since each depends on what the one before changed:

1. ``Observed``: the live members and the assignment they put in force
   (``assignment_in_force``).
2. ``ShardsSeen``: every stage's shard leases. This peer claims (renews a lease for) the
   shards the assignment names it for, and takes over a shard whose named server is not a
   live member when the last rightful holder named it standby (its lease then carries that
   holder's signed lease as proof, ``swarmd.peers.taskpool.servers``). It serves a shard only
   while the pool's rule gives it the shard; a claim it no longer wants is closed first (the
   server's state handed over), then released.
3. ``CellsSeen``: the cell leases of the pipelines ``cells_to_scan`` names. That depends on
   whether this peer serves shard (0, 0) after step 2 (its ledger speaks to every pipeline),
   so it is scanned only then. Cells follow ``cells_to_hold``; a cell whose worker stopped by
   itself is opened afresh.

``Stopping`` hands everything back: cells stop, the reducer, then the servers (flushed and
copied to their standbys), and every claim is released at once so that nobody waits for the
leases to expire.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from swarmd.peers.records.plan_record import PlanRecord
from swarmd.peers.taskpool.assignment import Assignment, from_plan, provisional
from swarmd.peers.taskpool.cells import Cell, CellLease, cells_to_hold, open_cells, resolve_cells
from swarmd.peers.taskpool.reduction import group_of
from swarmd.peers.taskpool.servers import Shard, ShardLease, encode_proof, resolve_shards


@dataclass(frozen=True)
class Books:
    """What the trainer remembers of the pool between rounds; ``step`` returns a new one."""

    own: str
    assignment: Assignment | None = None
    live: frozenset[str] = frozenset()
    """The live training members, this peer among them."""
    cell_claims: Mapping[Cell, float] = field(default_factory=dict)
    """The cells this peer claims, each with when it first claimed it: a renewal keeps the
    claim's time, the tie-break of concurrent claims."""
    shard_claims: Mapping[Shard, float] = field(default_factory=dict)
    proofs: Mapping[Shard, str] = field(default_factory=dict)
    """The shards held by take-over: the encoded lease of the holder that named this peer standby."""
    rightful: Mapping[Shard, tuple[ShardLease, bytes]] = field(default_factory=dict)
    """The newest lease of each shard's rightful holder, with its signed bytes (a take-over's proof)."""
    standby: str | None = None
    """The peer this one logs its shards' steps at (the coordination's choice)."""
    cell_holders: Mapping[Cell, CellLease] = field(default_factory=dict)
    """Who holds each cell scanned last, by the pool's rule."""
    shard_holders: Mapping[Shard, ShardLease] = field(default_factory=dict)
    lease_holders: Mapping[Shard, tuple[ShardLease, ...]] = field(default_factory=dict)
    """Other live members' unexpired leases of each shard, released ones too: a holder the
    shard was just moved from has the state its next holder takes."""


# --- what the trainer reads ---------------------------------------------------------------------


@dataclass(frozen=True)
class Observed:
    live: frozenset[str]
    assignment: Assignment


@dataclass(frozen=True)
class ShardsSeen:
    leases: tuple[tuple[ShardLease, bytes], ...]
    """Every stage's shard leases, each with its signed bytes."""
    standby: str | None
    serving: tuple[Shard, ...]
    """The shards this peer's servers serve now, in the order they opened."""
    now: float


@dataclass(frozen=True)
class CellsSeen:
    leases: tuple[CellLease, ...]
    working: tuple[Cell, ...]
    """The cells this peer's workers work now, in the order they opened."""
    stopped: frozenset[Cell]
    """Those whose worker stopped by itself (a bug it logged)."""
    now: float


@dataclass(frozen=True)
class Stopping:
    working: tuple[Cell, ...]
    serving: tuple[Shard, ...]


Event = Observed | ShardsSeen | CellsSeen | Stopping


# --- what the trainer does ----------------------------------------------------------------------


@dataclass(frozen=True)
class Follow:
    """The assignment in force changed (said in the log)."""

    assignment: Assignment


@dataclass(frozen=True)
class NoteVersions:
    """The versions these leases show bound any state a new holder may believe (``SeenVersions``)."""

    leases: Mapping[Shard, ShardLease]


@dataclass(frozen=True)
class StandbyChanged:
    """Every server starts its new standby from a fresh copy, not from the log."""


@dataclass(frozen=True)
class PublishCell:
    cell: Cell
    claimed_at: float
    released: bool


@dataclass(frozen=True)
class OpenCell:
    """Start a worker on a cell the pool now gives this peer."""

    cell: Cell


@dataclass(frozen=True)
class CloseCell:
    cell: Cell
    restart: bool = False
    """Its worker stopped by itself: it is opened again in the same round."""


@dataclass(frozen=True)
class PublishShard:
    """A shard lease; its version is the server's when it is published (steps go on meanwhile)."""

    key: Shard
    shards: int
    claimed_at: float
    standby: str
    proof: str
    released: bool


@dataclass(frozen=True)
class OpenShard:
    """Serve a shard from the newest state this peer may believe (``opening``); it may wait."""

    key: Shard


@dataclass(frozen=True)
class CloseShard:
    key: Shard
    """Its server flushes and its final state stays here for the shard's next holder."""


@dataclass(frozen=True)
class StopReducer:
    """Between the cells, which feed the reducer, and the servers it feeds."""


Action = (
    Follow
    | NoteVersions
    | StandbyChanged
    | PublishCell
    | PublishShard
    | OpenCell
    | CloseCell
    | OpenShard
    | CloseShard
    | StopReducer
)


# --- the step -----------------------------------------------------------------------------------


def assignment_in_force(record: PlanRecord | None, live: Iterable[str], stages: int, batch: int) -> Assignment:
    """The coordinator's plan when it fits the run, else the provisional rule over ``live``."""
    members = sorted(live)
    # A plan of S stages needs S members: with fewer, the coordinator cannot plan (nor repair
    # the last plan), and the provisional rule spreads the cells over whoever is here.
    if record is not None and len(members) >= stages:
        planned = from_plan(record, stages, batch)
        if planned is not None:
            return planned
    return provisional(members, stages, batch)


def step(books: Books, event: Event) -> tuple[Books, list[Action]]:
    """``books`` after ``event``, and what to do about it, in the order to do it (module doc)."""
    if isinstance(event, Observed):
        actions: list[Action] = [] if event.assignment == books.assignment else [Follow(event.assignment)]
        return replace(books, live=event.live, assignment=event.assignment), actions
    if isinstance(event, ShardsSeen):
        return _settle_shards(books, event)
    if isinstance(event, CellsSeen):
        return _settle_cells(books, event)
    return _stop(books, event)


def cells_to_scan(books: Books, serving_first: bool, asked: Iterable[int]) -> list[Cell]:
    """The cells whose leases this round reads: the pipelines this peer is named in, claims, or
    may take as a spare; those its ledger asked about (``asked``); every pipeline while it
    serves shard (0, 0) (``serving_first``: its ledger checks each pipeline's stage-0 holder);
    and the reduction groups of all of these (their heads and members are its to reach)."""
    a = _assignment(books)
    named = a.named_cells()
    pipelines = {p for (p, _), peer in named.items() if peer == books.own}
    pipelines |= {p for p, _ in books.cell_claims} | {p for p, _ in open_cells(named, books.live)}
    pipelines |= {p for p in asked if p < a.pipelines}
    pipelines |= set(range(a.pipelines)) if serving_first else set()
    pipelines |= {
        q
        for p in list(pipelines)
        if p < a.pipelines
        for s in range(a.stages)
        for q in group_of(p, a.pipelines, a.group_size(s))
    }
    return [(p, s) for p in sorted(pipelines) for s in range(a.stages)]


def _assignment(books: Books) -> Assignment:
    assert books.assignment is not None, "the pool is read only after an assignment is observed"
    return books.assignment


def _settle_shards(books: Books, seen: ShardsSeen) -> tuple[Books, list[Action]]:
    a, own, live = _assignment(books), books.own, books.live
    named = a.named_shards()
    holders = resolve_shards((lease for lease, _ in seen.leases), named, a.shard_counts(), live, seen.now)
    raw_of = {(lease.peer_id, lease.key): raw for lease, raw in seen.leases}
    rightful = {**books.rightful, **{key: (lease, raw_of[(lease.peer_id, key)]) for key, lease in holders.items()}}
    # Live members' leases of a shard the assignment gives someone else: the holders it was
    # just moved from, whose state (and versions) its next holder takes. Only members count.
    held: dict[Shard, list[ShardLease]] = {}
    for lease, _ in seen.leases:
        if lease.expires_at > seen.now and lease.peer_id in live and lease.peer_id != own:
            held.setdefault(lease.key, []).append(lease)
    actions: list[Action] = [
        NoteVersions(holders),
        NoteVersions({key: max(leases, key=lambda x: x.version) for key, leases in held.items()}),
    ]
    if seen.standby != books.standby:
        actions.append(StandbyChanged())
    books = replace(
        books,
        rightful=rightful,
        shard_holders=holders,
        lease_holders={key: tuple(leases) for key, leases in held.items()},
        standby=seen.standby,
    )
    wanted = {key for key, peer in named.items() if peer == own} | _takeovers(books, named)
    claims, proofs, serving = dict(books.shard_claims), dict(books.proofs), list(seen.serving)
    for key in sorted(set(claims) - wanted):
        if key in serving:
            serving.remove(key)
            actions.append(CloseShard(key))
        actions.append(_shard_lease(books, key, claims.pop(key), proofs, released=True))
        proofs.pop(key, None)
    for key in sorted(wanted):
        actions.append(_shard_lease(books, key, claims.setdefault(key, seen.now), proofs, released=False))
    for key in list(serving):
        if key not in wanted or (key in holders and holders[key].peer_id != own):
            serving.remove(key)
            actions.append(CloseShard(key))
    for key, lease in holders.items():
        if lease.peer_id == own and key not in serving and key in wanted:
            actions.append(OpenShard(key))
    return replace(books, shard_claims=claims, proofs=proofs), actions


def _takeovers(books: Books, named: Mapping[Shard, str]) -> set[Shard]:
    """Shards whose named server is gone and whose last rightful holder named us its standby
    (or is us: a shard we took over stays ours until the assignment names a live server)."""
    out = set()
    for key, peer in named.items():
        known = books.rightful.get(key)
        if peer in books.live or known is None:
            continue
        lease, _ = known
        if lease.peer_id == books.own or (lease.standby == books.own and lease.peer_id not in books.live):
            out.add(key)
    return out


def _shard_lease(books: Books, key: Shard, claimed_at: float, proofs: dict[Shard, str], released: bool) -> PublishShard:
    """This peer's lease of ``key``; a take-over's carries the lease of the holder that named
    us standby, kept (in ``proofs``) for as long as we hold the shard by take-over. A release
    carries none: the holder then rightful is whoever the plan moved the shard to, whose lease
    names us nobody's standby, and a proof that does not name its signer the standby makes the
    whole lease unreadable (``ShardLease.parse``), so the release would never be seen."""
    a = _assignment(books)
    named = a.named_shards().get(key)
    known = books.rightful.get(key)
    if named == books.own or released:
        proofs.pop(key, None)
    elif known is not None and known[0].peer_id != books.own and known[0].standby == books.own:
        proofs[key] = encode_proof(known[1])
    return PublishShard(
        key=key,
        shards=a.shard_counts()[key[0]],
        claimed_at=claimed_at,
        standby=books.standby or "",
        proof=proofs.get(key, ""),
        released=released,
    )


def _settle_cells(books: Books, seen: CellsSeen) -> tuple[Books, list[Action]]:
    own, live = books.own, books.live
    named = _assignment(books).named_cells()
    holders = resolve_cells(seen.leases, named, live, seen.now)
    wanted = set(cells_to_hold(own, named, holders, live))
    claims, working = dict(books.cell_claims), list(seen.working)
    actions: list[Action] = []
    for cell in sorted(set(claims) - wanted):
        if cell in working:
            working.remove(cell)
            actions.append(CloseCell(cell))
        actions.append(PublishCell(cell, claims.pop(cell), released=True))
    for cell in sorted(wanted):
        actions.append(PublishCell(cell, claims.setdefault(cell, seen.now), released=False))
    for cell in list(working):
        if cell not in wanted or (cell in holders and holders[cell].peer_id != own):
            working.remove(cell)
            actions.append(CloseCell(cell))
        elif cell in seen.stopped:
            working.remove(cell)
            actions.append(CloseCell(cell, restart=True))
    for cell, lease in holders.items():
        if lease.peer_id == own and cell in wanted and cell not in working:
            actions.append(OpenCell(cell))
    return replace(books, cell_claims=claims, cell_holders=holders), actions


def _stop(books: Books, event: Stopping) -> tuple[Books, list[Action]]:
    actions: list[Action] = [CloseCell(cell) for cell in event.working]
    actions.append(StopReducer())
    actions += [CloseShard(key) for key in event.serving]
    actions += [PublishCell(cell, claimed, released=True) for cell, claimed in books.cell_claims.items()]
    proofs = dict(books.proofs)
    actions += [_shard_lease(books, key, claimed, proofs, released=True) for key, claimed in books.shard_claims.items()]
    return replace(books, cell_claims={}, shard_claims={}, proofs=proofs), actions
