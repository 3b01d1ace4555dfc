"""The pipelines of the simulated data path (``docs/data-path.md``, "One round of one pipeline").

A pipeline is a row of the plan's grid: one cell ``(p, s)`` per stage, each held by a device.

- **Shares.** The stage-0 cell asks the ledger (at shard ``(0, 0)``'s holder, one round trip)
  for the round's shares of ``k`` micro-batches, renewing the shares it holds (every third of
  a lease). They run one after the other as one event (a *segment*): each lasts
  ``exchange.share_seconds`` (1F1B over the cells' compute and the boundaries' activation
  transfers, flush to flush), and each boundary's activations and gradients are flows on the
  shared links (through a relay when the daemon's routing rule says so), so that they compete
  with the exchange's traffic: a boundary flow slower than the compute stretches the segment.
  A fault in the middle splits it where the compute schedule stands.
- **Rounds.** After H shares every cell contributes to each shard of its stage at once
  (``swarmd.peers.sim.shards``) and the pipeline goes on with its next round; a cell whose
  previous contribution has not arrived yet holds the pipeline back (at most one outstanding).
  Between two shares a cell applies the deltas its pulls brought: a contribution's base is
  the version its weights held when its last share of the round began.
- **Faults.** A cell whose device leaves breaks its pipeline's share in flight (abandoned at
  the ledger, which issues it again: recomputed), loses its own progress of the round (a
  later stage's is counted as a contribution lost; stage 0's shares are issued again when the
  departure is noticed), and leaves a hole. A spare fills it by the pool's rule
  (``cells.spare_for``) once the lease lapses, or the coordinator's repair does; the new
  device fetches its stage's weights whole before the pipeline starts again.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from swarmd.peers.sim.shards import Contribution, RoundGroup
from swarmd.peers.taskpool.cells import spare_for, spares
from swarmd.peers.taskpool.exchange import SYNC_WAIT_S, share_seconds
from swarmd.peers.taskpool.shares import LedgerError, Share

if TYPE_CHECKING:
    from swarmd.peers.sim.simulator import Simulation

OPEN_ROUNDS = 4
"""Rounds of shares a stage-0 cell may hold open at the ledger: the one it trains, and those
whose contributions are not committed yet (the ledger's ``limit``)."""


@dataclass(eq=False)
class Cell:
    pipeline: Pipeline
    stage: int
    shards: int
    device: int | None = None
    named: int = -1
    """The device the assignment names here (the last holder while the cell is open)."""
    serial: int = 0
    """Bumped when the cell changes hands: events for its previous holder lapse."""
    ready: bool = False
    """Holds its stage's weights."""
    arrived: list[int] = field(default_factory=list)
    """Per shard of its stage: the newest committed version its pulls brought."""
    base: list[int] = field(default_factory=list)
    pulling: list[bool] = field(default_factory=list)
    missing: set[int] = field(default_factory=set)
    loading_since: float = 0.0
    in_flight: set[int] = field(default_factory=set)
    """Contributions sent and not yet arrived at their shard."""
    round_shares: list[int] = field(default_factory=list)
    """Shares this holder trained in the pipeline's current round."""

    def __post_init__(self) -> None:
        self.arrived, self.base, self.pulling = [0] * self.shards, [0] * self.shards, [False] * self.shards


@dataclass
class Timing:
    """A pipeline's compute and boundary times per micro-batch, for ``exchange.share_seconds``."""

    forward_s: list[float]
    backward_s: list[float]
    send_s: list[float]
    nbytes: list[float]
    """A micro-batch's activation bytes across each boundary (as much again back)."""
    via: list[int | None]
    tail_forward: list[float]
    """After a boundary's activations are all in: the last micro-batch's way to the end and back."""
    tail_backward: list[float]
    floor_s: float
    """A device holding several cells computes them one after the other."""


@dataclass(eq=False)
class Pipeline:
    pid: int
    cells: list[Cell] = field(default_factory=list)
    epoch: int = 0
    segment: list[Share] = field(default_factory=list)
    """The shares of the round in flight, one after the other (issued together, run as one event)."""
    holder: str = ""
    """The ledger's holder of the segment (its stage-0 device's ID)."""
    per_share_s: float = 0.0
    """A share's compute schedule, flush to flush (``share_seconds``)."""
    shares_done: int = 0
    """Shares of the current round trained so far."""
    waiting: str = ""
    wait_since: float = 0.0
    round_started: float = 0.0
    started: float = 0.0
    compute_done: bool = False
    flows_left: int = 0
    flow_end: float = 0.0
    timing: Timing | None = None
    sync_bases: list[list[int]] | None = None
    """Gradient mode: per cell, the bases of the round just contributed; the next round waits
    until every cell's pulls brought a version past them, or until ``sync_until``."""
    sync_until: float = 0.0


class Pipelines:
    def __init__(self, sim: Simulation) -> None:
        self.sim = sim
        self.pipelines: list[Pipeline] = []
        self.held: dict[str, set[int]] = {}
        """Ledger holder -> the shares it holds open."""
        self.unspent: set[int] = set()
        """Shares given back before any of their work began: issuing one again is no recompute."""
        self.renewed: dict[str, float] = {}
        """Ledger holder -> when it last renewed its shares (a third of their lease at most ago)."""
        self._pid = 0

    def cells_of_stage(self, stage: int) -> list[Cell]:
        return [p.cells[stage] for p in self.pipelines]

    def grid(self) -> tuple[tuple[int, ...], ...]:
        """The assignment as it stands, for the coordinator's repair: a departed holder's
        index stays in its open cell (the repair sees it is gone and fills the hole)."""
        return tuple(tuple(c.device if c.device is not None else c.named for c in p.cells) for p in self.pipelines)

    # --- following the plan ---------------------------------------------------------------------

    def apply(self, now: float, rows: tuple[tuple[int, ...], ...], seeded: bool = False) -> None:
        """Follow a plan's grid: each row keeps the pipeline most of its cells come from;
        a cell that changes hands (or a new pipeline's) fetches its stage's weights first.
        ``seeded``: the run's start, when every peer builds the initial weights itself."""
        sim = self.sim
        where = {(s, c.device): p for p in self.pipelines for s, c in enumerate(p.cells) if c.device is not None}
        for p in self.pipelines:
            for s, c in enumerate(p.cells):
                where.setdefault((s, c.named), p)
        by_pid = {p.pid: p for p in self.pipelines}
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
                pipeline.cells = [Cell(pipeline, s, len(sim.shards.stages[s])) for s in range(len(row))]
            for cell, d in zip(pipeline.cells, row, strict=True):
                if cell.device != d:
                    self._hand(now, cell, d, seeded)
            pipeline.timing = None
            kept.append(pipeline)
        for p in self.pipelines:
            if p.pid not in taken:  # the plan dropped it: its holders' work of the round is lost
                for cell in p.cells:
                    self._hand(now, cell, None, seeded)
        self.pipelines = kept
        for p in self.pipelines:
            self.try_start(now, p)

    def _hand(self, now: float, cell: Cell, device: int | None, seeded: bool = False) -> None:
        """The cell changes hands: its previous holder's share in flight and progress of the
        round go (module doc); the new one fetches the stage's weights."""
        sim = self.sim
        p = cell.pipeline
        self._break(now, p)
        old = cell.device
        if old is not None:
            self._lose_round(now, cell, old)
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
            sim.shards.load(now, cell)

    def _lose_round(self, now: float, cell: Cell, device: int) -> None:
        """A holder leaves its cell with the round's work unsent: a later stage's is lost
        (counted); stage 0's shares are issued again (by the ledger, when the holder is known
        gone, or at once if it lives on elsewhere)."""
        sim = self.sim
        if cell.stage > 0:
            if cell.round_shares:
                sim.counts["contributions_lost"] += 1
            return
        holder = sim.ids[device]
        if sim.up[device] and cell.round_shares:
            mine = self.held.get(holder, set())
            gone = sim.ledger.abandon([i for i in cell.round_shares if i in mine], holder)
            mine.difference_update(gone)

    def _break(self, now: float, p: Pipeline) -> None:
        """The segment in flight cannot finish: the shares it completed by now (on its compute
        schedule) count for the round, the one in flight is abandoned at the ledger (issued
        again: recomputed), and those not begun go back unspent."""
        if p.segment:
            sim = self.sim
            begun = 0 if p.started < 0 else min(len(p.segment), int((now - p.started) // p.per_share_s) + 1)
            done, p.segment = p.segment[: max(0, begun - 1)], p.segment[max(0, begun - 1) :]
            for cell in p.cells:
                cell.round_shares.extend(x.share_id for x in done)
            p.shares_done += len(done)
            ids = [x.share_id for x in p.segment]
            gone = set(sim.ledger.abandon(ids, p.holder))
            self.held.get(p.holder, set()).difference_update(gone)
            self.unspent.update(i for i in ids[1 if begun else 0 :] if i in gone)
            sim.counts["shares_broken"] += 1
            p.segment = []
        p.epoch += 1
        p.sync_bases = None  # a pipeline that changed starts its next round afresh
        p.timing = None

    # --- faults -------------------------------------------------------------------------------

    def departed(self, now: float, device: int) -> None:
        """``device`` left: every cell it held breaks (module doc); its contributions in flight
        are cut with its flows."""
        sim = self.sim
        for p in self.pipelines:
            for cell in p.cells:
                if cell.device != device:
                    continue
                for shard in sim.shards.stages[cell.stage]:
                    cut = [cid for cid in cell.in_flight if cid in shard.in_flight]
                    for cid in cut:
                        del shard.in_flight[cid]
                        if cell.stage > 0:
                            sim.counts["contributions_lost"] += 1
                self._hand(now, cell, None)
                self.try_start(now, p)  # it waits for the cell (counted from now)

    def noticed_departure(self, now: float, device: int) -> None:
        """Its leases lapsed: the ledger issues its shares again, and spares take its cells."""
        sim = self.sim
        holder = sim.ids[device]
        sim.ledger.drop_holder(holder)
        self.held.pop(holder, None)
        self.renewed.pop(holder, None)
        self.claim_open_cells(now)

    def claim_open_cells(self, now: float) -> None:
        """Open cells go to live members that hold none, by the pool's rule (``spare_for``)."""
        sim = self.sim
        named = {
            (p.pid, c.stage): sim.ids[c.device if c.device is not None else c.named]
            for p in self.pipelines
            for c in p.cells
            if c.device is not None or c.named >= 0
        }
        open_cells = [(p.pid, c.stage) for p in self.pipelines for c in p.cells if c.device is None]
        if not open_cells:
            return
        live = {sim.ids[d] for d in sim.members()}
        holding = {sim.ids[c.device] for p in self.pipelines for c in p.cells if c.device is not None}
        candidates = [peer for peer in spares(named, live) if peer not in holding]
        by_pid = {p.pid: p for p in self.pipelines}
        for (pid, stage), peer in spare_for(open_cells, candidates).items():
            sim.counts["spare_claims"] += 1
            self._hand(now, by_pid[pid].cells[stage], sim.index[peer])

    # --- the round ------------------------------------------------------------------------------

    def try_start(self, now: float, p: Pipeline) -> None:
        """Start the rest of the pipeline's round (or end the round) if nothing holds it back."""
        sim = self.sim
        if p.segment:
            return
        if not all(c.ready and c.device is not None for c in p.cells):
            return self._wait(now, p, "cells")
        if p.shares_done >= sim.local_steps:
            return self._end_round(now, p)
        if p.sync_bases is not None:
            behind = any(
                arrived <= base
                for c, bases in zip(p.cells, p.sync_bases, strict=True)
                for arrived, base in zip(c.arrived, bases, strict=True)
            )
            if behind and now < p.sync_until:
                return self._wait(now, p, "sync")
            p.sync_bases = None
        server = sim.shards.ledger_shard.holder
        d0 = p.cells[0].device
        assert d0 is not None
        if not sim.up[server]:
            return self._wait(now, p, "ledger")
        holder = sim.ids[d0]
        mine = self.held.setdefault(holder, set())
        if now - self.renewed.get(holder, -math.inf) >= sim.settings.lease_s / 3:
            sim.ledger.renew(list(mine), holder, now)  # well before any lapses
            self.renewed[holder] = now
        segment = []
        for _ in range(sim.local_steps - p.shares_done):
            try:
                share = sim.ledger.issue(holder, now, OPEN_ROUNDS * sim.local_steps)
            except LedgerError:
                break
            if share.share_id in self.unspent:
                self.unspent.discard(share.share_id)
                sim.counts["reissued_unspent"] += 1
            mine.add(share.share_id)
            segment.append(share)
        if not segment:
            return self._wait(now, p, "ledger")
        self._waited(now, p)
        p.segment, p.holder, p.started = segment, holder, -1.0
        sim.engine.at(now + sim.engine.rtt(d0, server), self._go, p, p.epoch)

    def _wait(self, now: float, p: Pipeline, why: str) -> None:
        if p.waiting != why:
            self._waited(now, p)
            p.waiting, p.wait_since = why, now

    def _waited(self, now: float, p: Pipeline) -> None:
        if p.waiting:
            self.sim.phases.add("wait_" + p.waiting, now - p.wait_since)
            p.waiting = ""

    def _go(self, now: float, p: Pipeline, epoch: int) -> None:
        """The ledger's answer is in: the segment's shares run one after the other, flushing
        between them, as one event; each boundary carries all their activations and gradients
        as one stream each way. A contribution's base is taken when the last share begins."""
        if epoch != p.epoch:
            return
        sim = self.sim
        m = len(p.segment)
        t = p.timing = p.timing or pipeline_timing(sim, [c.device for c in p.cells])
        k = sim.share_micro_batches
        p.per_share_s = max(share_seconds(t.forward_s, t.backward_s, t.send_s, k), k * t.floor_s)
        sim.phases.add("share_compute", p.per_share_s, m)
        p.started, p.compute_done, p.flow_end = now, False, now
        p.flows_left = 2 * len(t.send_s)
        if m == 1:
            self._take_base(now, p, epoch)
        else:
            sim.engine.at(now + (m - 1) * p.per_share_s, self._take_base, p, epoch)
        sim.engine.at(now + m * p.per_share_s, self._computed, p, epoch)
        for b, (nbytes, via) in enumerate(zip(t.nbytes, t.via, strict=True)):
            a, c = p.cells[b].device, p.cells[b + 1].device
            assert a is not None and c is not None
            sim.engine.stream(now, a, c, m * k * nbytes, self._boundary, (p, epoch, t.tail_forward[b]), via)
            sim.engine.stream(now, c, a, m * k * nbytes, self._boundary, (p, epoch, t.tail_backward[b]), via)

    def _take_base(self, now: float, p: Pipeline, epoch: int) -> None:
        """Between two shares every cell applies what its pulls brought; the last share's
        weights are the base its contribution is weighed against."""
        if epoch == p.epoch:
            for cell in p.cells:
                cell.base = list(cell.arrived)

    def _boundary(self, now: float, p: Pipeline, epoch: int, tail: float) -> None:
        if epoch != p.epoch:
            return
        p.flows_left -= 1
        p.flow_end = max(p.flow_end, now + tail)
        self._maybe_done(now, p, epoch)

    def _computed(self, now: float, p: Pipeline, epoch: int) -> None:
        if epoch != p.epoch:
            return
        p.compute_done = True
        self._maybe_done(now, p, epoch)

    def _maybe_done(self, now: float, p: Pipeline, epoch: int) -> None:
        if not p.compute_done or p.flows_left:
            return
        if p.flow_end > now:
            self.sim.engine.at(p.flow_end, self._segment_end, p, epoch)
        else:
            self._segment_end(now, p, epoch)

    def _segment_end(self, now: float, p: Pipeline, epoch: int) -> None:
        if epoch != p.epoch or not p.segment:
            return
        m = len(p.segment)
        self.sim.phases.add("share", (now - p.started) / m, m)
        for cell in p.cells:
            cell.round_shares.extend(x.share_id for x in p.segment)
        p.shares_done += m
        p.segment = []
        self.try_start(now, p)

    def _end_round(self, now: float, p: Pipeline) -> None:
        """Every cell contributes to each shard of its stage, once its previous contribution
        has arrived (at most one outstanding), and the next round starts."""
        if any(c.in_flight for c in p.cells):
            return self._wait(now, p, "backpressure")
        self._waited(now, p)
        sim = self.sim
        shards = sim.shards
        for cell in p.cells:
            assert cell.device is not None
            ids = tuple(cell.round_shares)
            group = None
            if cell.stage == 0:
                group = RoundGroup(sim.ids[cell.device], ids, len(shards.stages[0]))
            for shard in shards.stages[cell.stage]:
                c = Contribution(
                    shards.next_cid(),
                    cell.device,
                    cell,
                    cell.serial,
                    cell.stage,
                    shard.index,
                    ids,
                    len(ids) * sim.share_micro_batches,
                    cell.base[shard.index],
                    group,
                )
                if not sim.reducers.send(now, c):
                    shards.contribute(now, c)
            cell.round_shares = []
        sim.phases.add("round", now - p.round_started)
        p.round_started, p.shares_done = now, 0
        if sim.exchange.mode == "gradient":  # synchronous rounds, as the daemons' cells run them
            p.sync_bases = [list(c.base) for c in p.cells]
            p.sync_until = now + SYNC_WAIT_S
            sim.engine.at(p.sync_until, self._sync_lapsed, p, p.epoch)
        self.try_start(now, p)

    def _sync_lapsed(self, now: float, p: Pipeline, epoch: int) -> None:
        if epoch == p.epoch and p.waiting == "sync":
            self.sim.counts["sync_timeouts"] += 1
            self.try_start(now, p)

    # --- what the shards report ---------------------------------------------------------------

    def delivered(self, now: float, cell: Cell) -> None:
        p = cell.pipeline
        if p.waiting == "backpressure" and not any(c.in_flight for c in p.cells):
            self.try_start(now, p)

    def cell_ready(self, now: float, cell: Cell) -> None:
        self.try_start(now, cell.pipeline)

    def pulled(self, now: float, cell: Cell) -> None:
        """A pull brought the cell a newer version: the round its pipeline waits on may start."""
        if cell.pipeline.waiting == "sync":
            self.try_start(now, cell.pipeline)

    def round_settled(self, now: float, group: RoundGroup) -> None:
        """A stage-0 round is through at every shard of stage 0 (applied, or dropped as stale
        as the daemon's shards drop it): its shares complete at the ledger."""
        sim = self.sim
        done = sim.ledger.complete(list(group.share_ids))
        self.held.get(group.holder, set()).difference_update(done)
        self.ledger_changed(now)

    def ledger_restarted(self, now: float) -> None:
        """Shard (0, 0) failed over: its ledger holds every share open before as to be issued again."""
        self.held.clear()
        self.ledger_changed(now)

    def ledger_changed(self, now: float) -> None:
        for p in self.pipelines:
            if p.waiting == "ledger":
                self.try_start(now, p)


def pipeline_timing(sim: Simulation, cells: Sequence[int | None]) -> Timing:
    """The times of a pipeline of these devices, stage by stage: compute from their TFLOPS,
    each boundary's activation in its link's codec, through a relay when the routing rule
    says so. A device holding several cells computes them one after the other."""
    w, engine = sim.workload, sim.engine
    devices = [d for d in cells if d is not None]
    assert len(devices) == len(cells), "every cell needs a device"
    tflops = [float(sim.tflops[d]) for d in devices]
    fwd = [f / t for f, t in zip(w.forward_flops, tflops, strict=True)]
    bwd = [b / t for b, t in zip(w.backward_flops, tflops, strict=True)]
    send: list[float] = []
    nbytes: list[float] = []
    vias: list[int | None] = []
    for a, c in zip(devices, devices[1:], strict=False):
        if a == c:
            send.append(0.0)
            nbytes.append(0.0)
            vias.append(None)
            continue
        act = w.activation_bytes(float(sim.scenario.bandwidth_Bps[a, c]))
        via = engine.route(a, c, act)
        rate = engine.path_rate(a, c, via)
        act = w.activation_bytes(rate)
        send.append(engine.way(a, c, via) + act / rate)
        nbytes.append(float(act))
        vias.append(via)
    stages = len(devices)
    per_device: dict[int, float] = {}
    for d, f, b in zip(devices, fwd, bwd, strict=True):
        per_device[d] = per_device.get(d, 0.0) + f + b
    return Timing(
        forward_s=fwd,
        backward_s=bwd,
        send_s=send,
        nbytes=nbytes,
        via=vias,
        tail_forward=[sum(fwd[b + 1 :]) + sum(bwd) + sum(send[b + 1 :]) + sum(send) for b in range(stages - 1)],
        tail_backward=[sum(bwd[: b + 1]) + sum(send[:b]) for b in range(stages - 1)],
        floor_s=max(per_device.values()) if len(per_device) < stages else 0.0,
    )
