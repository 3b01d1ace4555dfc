"""The shard servers of the simulated data path (``docs/data-path.md``, "A shard server").

Each shard ``(s, k)`` of a stage's parameters has a holder and a standby:

- **Contributions** arrive as flows from the cells of stage ``s`` (one per cell per round per
  shard). One for shares this shard already committed (a recompute) is acknowledged and not
  applied again; the others are weighed by ``exchange.staleness_weight`` (weight 0: dropped
  as stale, counted, and its share IDs settled here as done, as the daemon's
  ``ParameterShard`` settles them: its work is not applied at this shard, and its shares are
  not trained again) and buffered.
- **Steps**: once the weighted micro-batches buffered reach ``exchange.step_micro_batches``
  the shard steps; the step's delta (fp16) is logged at the standby, a flow on the holder's
  uplink, and the step is **committed** when it is there (and the standby holds a checkpoint
  to replay it on). Every ``checkpoint_every`` steps a checkpoint crosses the same uplink.
  With nobody to be a standby, a step is committed at once, and a failover may lose it.
- **Pulls**: every cell keeps one pull per shard in flight (the long poll); it brings a delta
  per committed version the cell lacks, or the whole fp32 slice when the cell is further
  behind than ``keep_versions``. A new cell first fetches every slice of its stage whole.
- **Failover**: when the holder's departure is noticed, its standby takes the shard over at
  the last committed version (committed updates lost: those no live copy holds, counted);
  every contribution not yet committed (buffered, stepped but not logged, or in flight) is
  sent again by its cell if that cell is still up (a later stage's is lost with its cell).
  A shard also moves, with a checkpoint and nothing lost, to the server a new plan names.

The ledger of shares (``swarmd.peers.taskpool.shares.ShareLedger``) lives with shard ``(0, 0)``:
its failover rebuilds the ledger from its checkpoint's metadata, so every share open then is
issued again, as the daemon's standby does. Trained tokens are counted at that shard's commits.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from swarmd.peers.membership.election import elect_standby
from swarmd.peers.taskpool.exchange import staleness_weight, step_micro_batches
from swarmd.peers.taskpool.reduction import HEAD_KEEP_VERSIONS
from swarmd.peers.taskpool.shares import ShareLedger

if TYPE_CHECKING:
    from swarmd.peers.sim.pipelines import Cell
    from swarmd.peers.sim.simulator import Simulation

MAX_DONE_SHARES = 1 << 16
"""Share IDs a shard remembers as committed (a recompute of an older one is rare)."""
MAX_VERSION_TOKENS = 4096
"""Committed versions of shard (0, 0) whose micro-batches are kept, to take off a lost one's."""


@dataclass(eq=False)
class RoundGroup:
    """A stage-0 cell's contributions of one round, one per shard of stage 0: the round's
    shares complete at the ledger once each is committed, acknowledged or dropped as stale
    (the daemon's cell settles a refused slice and completes its round: recomputing a round
    that one of K shards found stale would train 1/K of the model again at the cost of all)."""

    holder: str
    share_ids: tuple[int, ...]
    left: int


@dataclass(eq=False)
class Contribution:
    cid: int
    device: int
    cell: Cell
    serial: int
    """The cell's serial when it was made: a cell that changed hands since no longer waits on it."""
    stage: int
    shard: int
    share_ids: tuple[int, ...]
    micro_batches: int
    base: int
    """The shard version the cell's weights held when its last share of the round began."""
    group: RoundGroup | None
    sent_at: float = 0.0
    parts: list[Contribution] = field(default_factory=list)
    """A reduction head's sum (``swarmd.peers.sim.reduction``): the members' contributions it
    covers, each delivered, settled or sent again as its own; empty for a cell's own."""


@dataclass(eq=False)
class Shard:
    stage: int
    index: int
    holder: int
    standby: int | None = None
    standby_ready: bool = False
    checkpoint_version: int = 0
    """The version of the checkpoint the standby holds (it replays the logged steps above it)."""
    version: int = 0
    committed: int = 0
    logged: set[int] = field(default_factory=set)
    """Versions above ``committed`` whose delta reached the standby."""
    buffer: list[Contribution] = field(default_factory=list)
    buffered: float = 0.0
    steps: deque[tuple[int, list[Contribution], float]] = field(default_factory=deque)
    """Applied, not yet committed: (version, its contributions, when it stepped)."""
    in_flight: dict[int, Contribution] = field(default_factory=dict)
    done: set[int] = field(default_factory=set)
    """Share IDs committed (or settled) here: the recent ``MAX_DONE_SHARES`` or so."""
    done_batches: deque[tuple[int, ...]] = field(default_factory=deque)
    """``done``'s IDs in the batches they came in, oldest first: forgotten a batch at a time
    (a contribution's H shares at once, in C: per ID it was most of a 200M run's time)."""
    done_count: int = 0
    replicas: dict[int, int] = field(default_factory=dict)
    """Device -> the committed version its copy of the shard holds."""
    epoch: int = 0
    """Bumped when the shard changes hands: events for the previous holder lapse."""
    moving_to: int | None = None


class ShardServers:
    def __init__(self, sim: Simulation, servers: tuple[tuple[int, ...], ...]) -> None:
        self.sim = sim
        self.stages: list[list[Shard]] = [[Shard(s, k, d) for k, d in enumerate(row)] for s, row in enumerate(servers)]
        self.step_mb = step_micro_batches(sim.exchange)
        self.version_mb: OrderedDict[int, int] = OrderedDict()  # shard (0, 0)'s recent versions -> micro-batches
        self._cid = 0
        for shard in self.all():
            # Every peer builds the initial weights from the run's seed: a standby needs no copy.
            self._elect_standby(0.0, shard, seeded=True)

    def all(self) -> Iterable[Shard]:
        for row in self.stages:
            yield from row

    @property
    def ledger_shard(self) -> Shard:
        return self.stages[0][0]

    def next_cid(self) -> int:
        self._cid += 1
        return self._cid

    # --- contributions ------------------------------------------------------------------------

    def contribute(self, now: float, c: Contribution, sender: int | None = None) -> None:
        """Cell ``c.device`` (or ``sender``: the head of its reduction group, forwarding it)
        sends ``c`` to its shard's holder (again, after a failover)."""
        sim = self.sim
        shard = self.stages[c.stage][c.shard]
        shard.in_flight[c.cid] = c
        if c.cell.serial == c.serial:
            c.cell.in_flight.add(c.cid)
        c.sent_at = now
        src = c.device if sender is None else sender
        nbytes = sim.workload.contribution_bytes(c.stage, c.shard, sim.engine.path_rate(src, shard.holder, None))
        via = sim.engine.route(src, shard.holder, nbytes, for_speed=False)
        sim.engine.send(now, src, shard.holder, nbytes, self._arrived, (shard, shard.epoch, c), via)

    def _arrived(self, now: float, shard: Shard, epoch: int, c: Contribution) -> None:
        if epoch != shard.epoch:
            return  # the shard changed hands meanwhile: it was sent again to the new holder
        if shard.in_flight.pop(c.cid, None) is None:
            return  # given up when its cell's holder left (an engine retry after a blip)
        sim = self.sim
        sim.phases.add("contribution", now - c.sent_at)
        if c.parts:
            return self._sum_arrived(now, shard, c)
        if c.cell.serial == c.serial:
            c.cell.in_flight.discard(c.cid)
            sim.pipelines.delivered(now, c.cell)
        self._take(now, shard, c)

    def _sum_arrived(self, now: float, shard: Shard, c: Contribution) -> None:
        """A head's sum: delivered for every part; taken whole, or, when some part's shares are
        in already (a member's own resend), taken part by part, as the daemon's head resends."""
        for part in c.parts:
            if part.cell.serial == part.serial:
                part.cell.in_flight.discard(part.cid)
                self.sim.pipelines.delivered(now, part.cell)
        if any(i in shard.done for i in c.share_ids):
            for part in c.parts:
                self._take(now, shard, part)
            return
        self._take(now, shard, c)

    def _take(self, now: float, shard: Shard, c: Contribution) -> None:
        sim = self.sim
        if all(i in shard.done for i in c.share_ids):
            sim.counts["duplicates"] += 1
            self._settle(now, c)
            return
        staleness = max(0, shard.version - c.base)
        weight = staleness_weight(staleness, sim.exchange)
        if weight == 0.0:
            sim.counts["stale_dropped"] += 1
            self._remember(shard, c.share_ids)
            self._settle(now, c)
            return
        sim.staleness[staleness] += 1
        shard.buffer.append(c)
        shard.buffered += weight * c.micro_batches
        if shard.buffered >= self.step_mb:
            self._step(now, shard)

    def _settle(self, now: float, c: Contribution) -> None:
        """A stage-0 contribution is through at its shard: once every shard of stage 0 has
        its round's, the round's shares complete at the ledger."""
        for part in c.parts:
            self._settle(now, part)
        group = c.group
        if group is None:
            return
        group.left -= 1
        if group.left == 0:
            self.sim.pipelines.round_settled(now, group)

    @staticmethod
    def _remember(shard: Shard, share_ids: tuple[int, ...]) -> None:
        shard.done.update(share_ids)
        shard.done_batches.append(share_ids)
        shard.done_count += len(share_ids)
        while shard.done_count > MAX_DONE_SHARES and len(shard.done_batches) > 1:
            oldest = shard.done_batches.popleft()
            shard.done_count -= len(oldest)
            shard.done.difference_update(oldest)

    # --- steps and commits ----------------------------------------------------------------------

    def _step(self, now: float, shard: Shard) -> None:
        sim = self.sim
        shard.version += 1
        shard.steps.append((shard.version, shard.buffer, now))
        shard.buffer, shard.buffered = [], 0.0
        if shard.standby is None:
            self._commit(now, shard, shard.version)  # nobody to replicate to
            return
        sim.engine.send(
            now,
            shard.holder,
            shard.standby,
            sim.workload.delta_bytes(shard.stage, shard.index),
            self._logged,
            (shard, shard.epoch, shard.standby, shard.version),
        )
        if shard.version % sim.settings.checkpoint_every == 0:
            sim.engine.send(now, shard.holder, shard.standby, sim.workload.checkpoint_bytes(shard.stage, shard.index))

    def _logged(self, now: float, shard: Shard, epoch: int, standby: int, version: int) -> None:
        if epoch != shard.epoch or standby != shard.standby:
            return
        shard.logged.add(version)
        self._advance(now, shard)

    def _advance(self, now: float, shard: Shard) -> None:
        """Commit what the standby can replay: its checkpoint, then the logged steps in order."""
        if not shard.standby_ready:
            return
        upto = max(shard.committed, shard.checkpoint_version)
        while upto + 1 in shard.logged:
            upto += 1
        shard.logged = {v for v in shard.logged if v > upto}
        if upto > shard.committed:
            self._commit(now, shard, upto)

    def _commit(self, now: float, shard: Shard, upto: int) -> None:
        sim = self.sim
        trained = steps = 0
        first = shard is self.ledger_shard
        while shard.steps and shard.steps[0][0] <= upto:
            version, contributions, stepped = shard.steps.popleft()
            steps += 1
            sim.phases.add("commit_lag", now - stepped)
            mb = 0
            for c in contributions:
                if first:  # only shard (0, 0) counts what is trained
                    mb += sum(i not in shard.done for i in c.share_ids) * sim.share_micro_batches
                self._remember(shard, c.share_ids)
                self._settle(now, c)
            if first:
                trained += mb
                self.version_mb[version] = mb
                if len(self.version_mb) > MAX_VERSION_TOKENS:
                    self.version_mb.popitem(last=False)
        shard.committed = upto
        if shard.standby is not None and shard.standby_ready:
            shard.replicas[shard.standby] = upto
        if first:
            sim.trained(now, trained, steps)
        for cell in sim.pipelines.cells_of_stage(shard.stage):
            self.pull(now, shard, cell)

    # --- pulls --------------------------------------------------------------------------------

    def pull(self, now: float, shard: Shard, cell: Cell) -> None:
        """The cell's long poll of this shard answers when it lacks a committed version: from
        its group's head for the shard where it has one that holds a newer version within the
        deltas it keeps (``reduction.HEAD_KEEP_VERSIONS``), else from the server."""
        sim = self.sim
        k = shard.index
        if cell.pulling[k] or not cell.ready:
            return
        source, version = shard.holder, shard.committed
        head = sim.reducers.pull_head(cell, k)
        if head is not None:
            if head.arrived[k] <= cell.arrived[k]:
                return  # the head's own pull brings it first, then this one goes
            if head.arrived[k] - cell.arrived[k] <= HEAD_KEEP_VERSIONS:
                assert head.device is not None
                source, version = head.device, head.arrived[k]
        if not sim.up[source]:
            return
        behind = version - cell.arrived[k]
        if behind <= 0:
            return
        nbytes = sim.workload.pull_bytes(shard.stage, k, behind, sim.settings.keep_versions)
        cell.pulling[k] = True
        via = sim.engine.route(source, cell.device, nbytes, for_speed=False)
        sim.engine.send(
            now, source, cell.device, nbytes, self._pulled, (shard, shard.epoch, cell, cell.serial, version, now), via
        )

    def _pulled(
        self, now: float, shard: Shard, epoch: int, cell: Cell, serial: int, version: int, asked: float
    ) -> None:
        if serial != cell.serial or epoch != shard.epoch:
            return
        cell.pulling[shard.index] = False
        cell.arrived[shard.index] = max(cell.arrived[shard.index], version)
        self.sim.phases.add("pull", now - asked)
        self.pull(now, shard, cell)
        for member in self.sim.reducers.members_of(cell, shard.index):  # a head passes it on
            self.pull(now, shard, member)
        self.sim.pipelines.pulled(now, cell)

    def load(self, now: float, cell: Cell) -> None:
        """A new cell fetches its stage's weights, every slice whole, before it starts."""
        cell.missing = set(range(len(self.stages[cell.stage])))
        cell.loading_since = now
        for shard in self.stages[cell.stage]:
            self._send_slice(now, shard, cell)

    def _send_slice(self, now: float, shard: Shard, cell: Cell) -> None:
        sim = self.sim
        if not sim.up[shard.holder] or cell.device is None:
            return  # its holder left: the failover sends it
        nbytes = sim.workload.slice_bytes(shard.stage, shard.index)
        via = sim.engine.route(shard.holder, cell.device, nbytes, for_speed=False)
        sim.engine.send(
            now,
            shard.holder,
            cell.device,
            nbytes,
            self._slice_in,
            (shard, shard.epoch, cell, cell.serial, shard.committed),
            via,
        )

    def _slice_in(self, now: float, shard: Shard, epoch: int, cell: Cell, serial: int, version: int) -> None:
        if serial != cell.serial or epoch != shard.epoch:
            return
        k = shard.index
        cell.missing.discard(k)
        cell.arrived[k] = version
        if not cell.missing:
            cell.ready = True
            self.sim.phases.add("weights", now - cell.loading_since)
            self.sim.pipelines.cell_ready(now, cell)
            for other in self.stages[cell.stage]:
                self.pull(now, other, cell)

    # --- holders and standbys -------------------------------------------------------------------

    def _elect_standby(self, now: float, shard: Shard, seeded: bool = False) -> None:
        """The holder's standby (``elect_standby``, the daemon's rule), which gets a checkpoint
        copy; at the start every peer has the seeded weights and needs none."""
        sim = self.sim
        holder = shard.holder
        chosen = elect_standby(
            (
                sim.ids[d],
                round(float(sim.availability[d]), 1),
                now - float(sim.member_since[d]),
                float(sim.scenario.bandwidth_Bps[holder, d]),
            )
            for d in sim.members()
            if d != holder
        )
        if chosen is None:
            shard.standby, shard.standby_ready = None, False
            if shard.steps:
                self._commit(now, shard, shard.version)
            return
        standby = sim.index[chosen]
        shard.standby, shard.standby_ready, shard.logged = standby, seeded, set()
        if seeded:
            return
        sim.engine.send(
            now,
            holder,
            standby,
            sim.workload.checkpoint_bytes(shard.stage, shard.index),
            self._standby_ready,
            (shard, shard.epoch, standby, shard.version),
        )

    def _standby_ready(self, now: float, shard: Shard, epoch: int, standby: int, version: int) -> None:
        if epoch != shard.epoch or standby != shard.standby:
            return
        shard.standby_ready, shard.checkpoint_version = True, version
        shard.replicas[standby] = max(shard.committed, version)
        self._advance(now, shard)

    def noticed_departure(self, now: float, device: int) -> None:
        for shard in self.all():
            if shard.holder == device:
                self._fail_over(now, shard)
            elif shard.standby == device:
                self._elect_standby(now, shard)
            if shard.moving_to == device:
                shard.moving_to = None

    def _fail_over(self, now: float, shard: Shard) -> None:
        sim = self.sim
        sim.counts["failovers"] += 1
        shard.replicas.pop(shard.holder, None)
        if shard.standby is not None and sim.member[shard.standby] and shard.standby_ready:
            successor, restored = shard.standby, shard.committed
        else:
            copies = {d: v for d, v in shard.replicas.items() if sim.member[d]}
            if copies:
                successor = max(copies, key=lambda d: (copies[d], sim.availability[d], -d))
                restored = copies[successor]
            else:  # no copy survives: the shard starts again from the seeded weights
                successor, restored = sim.best_member(shard.stage), 0
        lost = max(0, shard.committed - restored)
        sim.counts["updates_lost"] += lost
        if shard is self.ledger_shard and lost:
            sim.untrained(sum(self.version_mb.pop(v, 0) for v in range(restored + 1, shard.committed + 1)))
        self._take_over(now, shard, successor, restored)

    def follow_plan(self, now: float, servers: tuple[tuple[int, ...], ...]) -> None:
        """A shard the plan names another live server for moves there (the server the
        assignment names holds the shard once it has a lease: ``servers.resolve_shards``),
        with a checkpoint from its holder and the log since: nothing is lost. A plan cut
        into other shard counts is not followed (its leases would be void)."""
        sim = self.sim
        if [len(row) for row in servers] != [len(row) for row in self.stages]:
            return
        for row, named in zip(self.stages, servers, strict=True):
            for shard, server in zip(row, named, strict=True):
                if server == shard.holder or server == shard.moving_to or not sim.member[server]:
                    continue
                shard.moving_to = server
                sim.engine.send(
                    now,
                    shard.holder,
                    server,
                    sim.workload.checkpoint_bytes(shard.stage, shard.index),
                    self._moved,
                    (shard, shard.epoch, server),
                )

    def _moved(self, now: float, shard: Shard, epoch: int, server: int) -> None:
        if epoch != shard.epoch or shard.moving_to != server:
            return
        self.sim.counts["shard_moves"] += 1
        self._take_over(now, shard, server, shard.committed)

    def _take_over(self, now: float, shard: Shard, successor: int, restored: int) -> None:
        """``successor`` holds the shard at version ``restored``; what was not committed is
        sent again by the cells that hold it."""
        sim = self.sim
        resend = list(shard.in_flight.values()) + shard.buffer + [c for _, cs, _ in shard.steps for c in cs]
        shard.holder, shard.version, shard.committed, shard.moving_to = successor, restored, restored, None
        shard.buffer, shard.buffered, shard.in_flight = [], 0.0, {}
        shard.steps.clear()
        shard.replicas.pop(successor, None)
        shard.epoch += 1
        self._elect_standby(now, shard)
        for c in [part for sent in resend for part in (sent.parts or [sent])]:  # a head's sum: its members resend
            if sim.up[c.device]:
                self.contribute(now, c)
            elif c.group is None:
                sim.counts["contributions_lost"] += 1
        if shard is self.ledger_shard:
            sim.ledger = ShareLedger.from_metadata(
                sim.ledger.to_metadata(), sim.share_micro_batches, sim.settings.lease_s
            )
            sim.pipelines.ledger_restarted(now)
        for cell in sim.pipelines.cells_of_stage(shard.stage):
            k = shard.index
            cell.pulling[k] = False
            if cell.arrived[k] > restored:  # it holds updates the shard lost: it takes the slice whole
                cell.arrived[k] = restored - sim.settings.keep_versions - 1
            if k in cell.missing:
                self._send_slice(now, shard, cell)
            else:
                self.pull(now, shard, cell)
