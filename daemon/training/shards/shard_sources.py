"""Where a shard's state comes from when this peer opens it: its replica, its last holders, its own file, the seed.

A shard opens from, in order: this peer's own replica when it was the shard's standby (the
checkpoint, every logged delta replayed on it: the exact last committed weights); else the
state of the previous rightful holder or of the standby that holder named (``ReplicaFetch``:
they replay their replica and answer one checkpoint); else, when the swarm has never shown a
version of the shard, the run's seed weights. While a holder the assignment moved the shard
from still serves it (it follows an older assignment and answers ``serving``,
``StillServed``), nothing is opened: it would go on committing steps that a state taken
elsewhere lacks; it hands its own over, closing first, once it follows the same assignment.
A peer that holds a live lease of the shard, or stands by for a holder that is gone, and
refuses the ask (``NOT_MEMBER``: it has not seen this peer's heartbeat yet; ``NOT_HOLDER``: it
does not follow the assignment that moved the shard here yet) is waited for alike: its view
lags, and it may still step the shard (a standby takes it over from its own view).
Every state is checked against what the rightful holders' signed leases have shown
(``SeenVersions``): one far past it is a lie and is refused. When no believable state can be
had for ``OPEN_GRACE_S``, the shard opens from the best it has (this peer's last checkpoint,
else the seed) and the versions lost are counted and logged: a swarm must go on.

Every state is also checked whole before it is believed (``swarmd.models.checkpoint_check``)
against the stage's geometry (``StageGeometry``: the slice the assignment in force gives the
shard): it loads, its digest matches, its tensors are finite and of the slice's dtype and
length, and its provenance names this run, this shard and a holder it may come from: this
peer for its own file, the replica's holder for a replica, for a fetched state one of the
shard's rightful holders this peer has seen (``note_holders``: the last ``PAST_HOLDERS``,
since a standby hands over the state of a holder that is gone).
A fetched state that fails is refused and counted (``refused_states``). This peer's own file
that fails (truncated, NaN, another run's or shard's, written by someone else, or of the
first format, which carried no checksum) is renamed ``<name>.bad-<unix time>``, kept for its
operator, counted (``set_aside``) and logged; the shard is then taken from the sources above
like any other, so it is never left unhosted.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import tempfile
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Protocol

import torch

from swarmd.data.store import DataError
from swarmd.errors import SwarmdError
from swarmd.models.cell_compute import flatten_parameters
from swarmd.models.checkpoint_check import Provenance, ShardLayout, TracedShard, check_checkpoint, open_traced
from swarmd.models.shard_config import ShardConfig, ShardError
from swarmd.peers.taskpool.assignment import Assignment
from swarmd.peers.taskpool.exchange import ExchangeConfig, shard_range
from swarmd.peers.taskpool.servers import SeenVersions, Shard, ShardLease
from swarmd.peers.wire.codecs import decode_vector
from swarmd.peers.wire.errors import NotHolder, NotMember, RpcError
from swarmd.peers.wire.messages import ReplicaFetch
from swarmd.training.bookkeeping import Books
from swarmd.training.run_facts import RunFacts, Send, stage_module
from swarmd.training.shards.replicas import Replica, ReplicaStore

logger = logging.getLogger(__name__)

OPEN_GRACE_S = 60.0
FETCH_TIMEOUT_S = 60.0
PAST_HOLDERS = 16
"""Rightful holders remembered per shard: whose states a fetch may bring."""

InitialSlice = Callable[[int, int, int], Awaitable[torch.Tensor | None]]
"""A slice (stage, lo, hi) of the checkpoint the run starts from; None for a run that starts
from its seed; ``DataError`` while it cannot be had (``RunInputs.initial_slice``)."""


def shard_file(checkpoint_dir: Path, key: Shard, shards: int) -> Path:
    return checkpoint_dir / f"shard-{key[0]}-{key[1]}-of-{shards}.safetensors"


class StillServed(Exception):
    """A source may still step the shard: its state is not final yet (the message says why)."""


class GeometryView(Protocol):
    """What the stage geometry reads of the pool: the assignment in force and its exchange."""

    @property
    def assignment(self) -> Assignment | None: ...

    def exchange_settings(self) -> ExchangeConfig: ...


class StageGeometry:
    """What a shard's state must be: its stage's seed weights, its slice, its optimizer's
    settings (``ShardRules`` for the standby's replicas)."""

    def __init__(self, facts: RunFacts, pool: GeometryView, seen: SeenVersions) -> None:
        self._facts = facts
        self._pool = pool
        self._seen = seen
        self._initial: dict[int, torch.Tensor] = {}

    def initial_vector(self, stage: int) -> torch.Tensor:
        """The stage's seed weights, flattened: what every peer builds alike."""
        if stage not in self._initial:
            self._initial[stage] = flatten_parameters(stage_module(self._facts, stage))
        return self._initial[stage]

    def layout(self, key: Shard) -> ShardLayout | None:
        """What a checkpoint of ``key`` must be under the assignment in force (None: no
        assignment yet, or none that has this shard)."""
        assignment = self._pool.assignment
        if assignment is None:
            return None
        counts = assignment.shard_counts()
        stage, index = key
        if not (0 <= stage < len(counts) and 0 <= index < counts[stage]):
            return None
        span = shard_range(self.initial_vector(stage).numel(), counts[stage], index)
        return ShardLayout(self._facts.run_id, stage, index, counts[stage], span, self._facts.mode)

    def admits(self, key: Shard, version: int) -> bool:
        return self._seen.admits(key, version)

    def config(self) -> ShardConfig:
        s = self._facts.spec
        outer_lr, outer_momentum = self._pool.exchange_settings().outer_step
        return ShardConfig(
            mode=self._facts.mode,
            lr=s.lr,
            schedule=s.schedule,
            weight_decay=s.weight_decay,
            outer_lr=outer_lr,
            outer_momentum=outer_momentum,
            aggregation=s.aggregation,
        )

    def stage_size(self, stage: int) -> int:
        """The stage's parameters, counted."""
        return self.initial_vector(stage).numel()


class SourcesView(Protocol):
    """What the sources read of the pool: the leases of the last reading, who is reachable."""

    @property
    def books(self) -> Books: ...

    @property
    def reachable(self) -> frozenset[str]: ...


class ShardSources:
    """The newest state this peer may believe of a shard it opens (module doc).

    ``initial_slice``: the run's starting checkpoint (``InitialSlice``); ``send``: a request to
    a peer (the states are asked of the shard's holders)."""

    def __init__(
        self,
        facts: RunFacts,
        pool: SourcesView,
        geometry: StageGeometry,
        replicas: ReplicaStore,
        seen: SeenVersions,
        initial_slice: InitialSlice,
        send: Send,
    ) -> None:
        self._facts = facts
        self._pool = pool
        self._geometry = geometry
        self._replicas = replicas
        self._seen = seen
        self._initial_slice = initial_slice
        self._send = send
        self._waiting_since: dict[Shard, float] = {}
        self._past_holders: dict[Shard, dict[str, None]] = {}
        self.versions_lost = 0
        self.refused_states = 0
        """States fetched from a peer and refused for what they hold (module doc)."""
        self.set_aside = 0
        """This peer's own checkpoint files found unusable and renamed aside."""

    def opened(self, key: Shard) -> None:
        """The shard is served here now: a later opening of it waits its own grace."""
        self._waiting_since.pop(key, None)

    async def believable_state(self, key: Shard, layout: ShardLayout, path: Path, step: int) -> TracedShard | None:
        """The newest state this peer may believe (module doc); None: wait for a better one."""
        span = layout.span
        found: list[TracedShard] = []
        replica = self._replicas.newest(key)
        if replica is not None and self._seen.admits(key, replica.version):
            try:
                found.append(await asyncio.to_thread(replay, replica, self._geometry.config(), step, span, layout))
            except (SwarmdError, KeyError, ValueError) as e:
                logger.warning("shard %s: our replica is unusable (%s)", key, e)
        still_served = None
        for peer in self._sources(key):
            try:
                fetched = await self._fetch(key, peer, layout, step)
            except StillServed as e:
                still_served = peer
                logger.info("shard %s: %s %s; its state is not final yet", key, peer[:16], e)
                continue
            if fetched is not None:
                found.append(fetched)
        own = await asyncio.to_thread(self._own_checkpoint, path, layout, step)
        if own is not None and self._seen.admits(key, own.version):
            found.append(own)
        seen = self._seen.of(key)
        best = max(found, key=lambda shard: shard.version, default=None)
        # A holder that has not yet followed the assignment that moved the shard here still steps
        # it, and a state taken from anyone else meanwhile (its standby's replica) misses the steps
        # it makes until it closes: committed versions would go back. It hands its state over
        # (closing first) once it follows the same assignment: wait for that, up to the grace.
        if best is not None and best.version >= seen and still_served is None:
            return best
        if best is None and seen == 0 and still_served is None:  # nobody trained it: the run's start
            # (Not while a source may still step it: a holder's lease shows the version it was
            # claimed or last renewed at, and the steps since are in its state alone.)
            return await self._start(key, span, step)
        since = self._waiting_since.setdefault(key, time.monotonic())
        if time.monotonic() - since < OPEN_GRACE_S:
            logger.info(
                "shard %s: the newest state here is version %s, the swarm has seen %d%s; asking again",
                key,
                "none" if best is None else best.version,
                seen,
                "" if still_served is None else f", and {still_served[:16]} still serves it",
            )
            return None
        shard = best or await self._start(key, span, step)
        if shard is None:
            return None
        lost = max(0, seen - shard.version)
        self.versions_lost += lost
        logger.warning(
            "shard %s: no state newer than version %d could be had in %.0f s; the swarm had seen %d: "
            "%d update(s) of this shard are lost",
            key,
            shard.version,
            OPEN_GRACE_S,
            seen,
            lost,
        )
        return shard

    async def _start(self, key: Shard, span: tuple[int, int], step: int) -> TracedShard | None:
        """The shard as the run starts: its slice of the checkpoint the run starts from, else of
        the seed's weights. None while the checkpoint's slice cannot be had (no member that holds
        it is up): the shard is opened again next round."""
        try:
            initial = await self._initial_slice(key[0], *span)
        except DataError as e:
            logger.warning("shard %s starts from the run's checkpoint, which cannot be had yet (%s)", key, e)
            return None
        if initial is None:
            initial = self._geometry.initial_vector(key[0])[span[0] : span[1]]
        return TracedShard(*span, initial, self._geometry.config(), step_micro_batches=step)

    def note_holders(self, leases: Mapping[Shard, ShardLease]) -> None:
        """Remember the shards' holders as the pool resolves them (a round's ``NoteVersions``)."""
        for key, lease in leases.items():
            past = self._past_holders.setdefault(key, {})
            past.pop(lease.peer_id, None)
            past[lease.peer_id] = None  # newest last
            while len(past) > PAST_HOLDERS:
                del past[next(iter(past))]

    def _leases(self, key: Shard) -> list[ShardLease]:
        """The leases of ``key`` this peer last read: its rightful holder's, then those of the live
        members that still hold one (a holder the assignment has just moved it from)."""
        books = self._pool.books
        rightful = [known[0] for known in [books.rightful.get(key)] if known is not None]
        return [*rightful, *books.lease_holders.get(key, ())]

    def _holders(self, key: Shard) -> set[str]:
        """The peers whose leases of ``key`` this peer has read: whose states it may take."""
        return {lease.peer_id for lease in self._leases(key)} | set(self._past_holders.get(key, ()))

    def _leased_by(self, key: Shard) -> set[str]:
        """The live members whose unexpired lease of ``key`` this peer last read: who may still step it."""
        live, now = self._pool.books.live, time.time()
        return {lease.peer_id for lease in self._leases(key) if lease.expires_at > now and lease.peer_id in live}

    def _may_step(self, key: Shard) -> set[str]:
        """Who may step ``key`` while its view lags ours: the live members with an unexpired lease
        of it, and the live standby a gone holder's lease names (it takes the shard over as soon
        as it sees the holder gone, from a view that may not follow the assignment that moved
        the shard here yet)."""
        live = self._pool.books.live
        orphaned = {lease.standby for lease in self._leases(key) if lease.peer_id not in live}
        return self._leased_by(key) | {peer for peer in orphaned if peer in live}

    def _sources(self, key: Shard) -> list[str]:
        """Whom a state is taken from: the last rightful holder and the standby it named, the
        live members that still hold a lease of the shard (a holder the assignment has just moved
        it from) with their named standbys, and the holders it had lately (one that paused hands
        back the steps its standby may not have). Nobody else's state is asked for."""
        peers = [p for lease in self._leases(key) for p in (lease.peer_id, lease.standby)]
        peers += reversed(self._past_holders.get(key, {}))  # a holder that let go, newest first
        reachable = self._pool.books.live | self._pool.reachable  # a paused holder still serves what it handed back
        return [p for p in dict.fromkeys(peers) if p and p != self._facts.own and p in reachable]

    async def _fetch(self, key: Shard, peer: str, layout: ShardLayout, step: int) -> TracedShard | None:
        request = ReplicaFetch(run_id=self._facts.run_id, stage=key[0], shard=key[1], after_version=-1)
        try:
            answer, blobs = await self._send(peer, request, [], FETCH_TIMEOUT_S)
        except RpcError as e:
            if isinstance(e, NotMember | NotHolder) and peer in self._may_step(key):
                # It may step the shard (it holds its lease, or stands by for a holder that is
                # gone), but its view lags ours: it does not know us yet as a member, or as the
                # shard's next holder. Taking a state from anyone else now would lose the steps
                # it makes until it hands over.
                raise StillServed(f"holds its lease but refuses us for now ({e.code.value})") from None
            logger.info("shard %s: %s has no state for us (%s)", key, peer, e)
            return None
        if answer.kind == "serving":
            raise StillServed(f"still serves it, at version {answer.version}")
        if answer.kind != "checkpoint" or not blobs:
            return None
        if not self._seen.admits(key, answer.version):
            self.refused_states += 1
            logger.warning(
                "shard %s: %s offers version %d, far past the %d the swarm has seen; refused",
                key,
                peer,
                answer.version,
                self._seen.of(key),
            )
            return None
        where = f"the state {peer[:16]} sent"
        try:
            shard = await asyncio.to_thread(open_checkpoint_bytes, blobs[0], self._geometry.config(), step, layout.span)
            check_checkpoint(
                shard.metadata, (shard.lo, shard.hi), shard.version, layout, self._holders(key), where, answer.version
            )
        except (SwarmdError, KeyError, ValueError) as e:
            self.refused_states += 1
            logger.warning("shard %s: %s is refused (%s); asking its other holders", key, where, e)
            return None
        return shard

    def _own_checkpoint(self, path: Path, layout: ShardLayout, step: int) -> TracedShard | None:
        """This peer's own last checkpoint of the shard, if it can be traced to this peer's
        server of this run and shard; a file that cannot is set aside (module doc)."""
        if not path.is_file():
            return None
        try:
            shard = open_traced(path, self._geometry.config(), step, layout.span)
            check_checkpoint(shard.metadata, (shard.lo, shard.hi), shard.version, layout, {self._facts.own}, str(path))
        except (SwarmdError, KeyError, ValueError) as e:
            self._set_aside(path, (layout.stage, layout.shard), e)
            return None
        return shard

    def _set_aside(self, path: Path, key: Shard, why: Exception) -> None:
        self.set_aside += 1
        aside = path.with_name(f"{path.name}.bad-{int(time.time())}")
        n = 1
        while aside.exists():  # two in one second: keep both
            aside, n = path.with_name(f"{path.name}.bad-{int(time.time())}-{n}"), n + 1
        try:
            os.replace(path, aside)
        except OSError as e:
            logger.warning("%s is unusable (%s) and could not be moved aside (%s); not resuming from it", path, why, e)
            return
        logger.warning(
            "%s is unusable (%s); moved aside to %s. Shard %s is taken from its standby or its last "
            "holder (the run's seed weights only if the swarm never trained it)",
            path,
            why,
            aside.name,
            key,
        )


def replay(
    replica: Replica, config: ShardConfig, step: int, span: tuple[int, int], layout: ShardLayout | None = None
) -> TracedShard:
    """The shard a replica rebuilds: its checkpoint, then every logged step in order. With
    ``layout``, the checkpoint is traced to it and to the replica's holder again (the store did
    when it took it; a replica is believed as a whole only by whom it was checked for)."""
    assert replica.checkpoint is not None
    shard = open_checkpoint_bytes(replica.checkpoint, config, step, span)
    if layout is not None:
        where = f"the replica of shard {layout.stage, layout.shard} from {replica.holder[:16]}"
        shard.provenance = check_checkpoint(shard.metadata, span, shard.version, layout, {replica.holder}, where)
    else:  # traced when it was stored; a store without rules (outside a trainer) keeps untraced ones
        with contextlib.suppress(ShardError):
            shard.provenance = Provenance.read(shard.metadata, "a replica's checkpoint")
    for entry in replica.log:
        delta = decode_vector(entry.delta, span[1] - span[0], "fp16").to(torch.float16)  # exact: sent as fp16
        shard.apply_logged(entry.version, delta, entry.share_ids)
        if entry.ledger:
            shard.metadata["ledger"] = entry.ledger
    return shard


def open_checkpoint_bytes(data: bytes, config: ShardConfig, step: int, span: tuple[int, int]) -> TracedShard:
    """The shard a checkpoint received holds, its form checked; its provenance is the caller's to check."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "shard.safetensors"
        path.write_bytes(data)
        try:
            return open_traced(path, config, step, span)
        except ShardError:
            raise
        except Exception as e:  # safetensors raises its own types on a corrupt file
            raise ShardError(f"not a readable shard checkpoint ({type(e).__name__}: {e})") from None


def replica_checkpoint(replica: Replica, config: ShardConfig, step: int, span: tuple[int, int]) -> tuple[int, bytes]:
    """A replica replayed into one checkpoint (for a peer taking the shard over)."""
    shard = replay(replica, config, step, span)
    with tempfile.TemporaryDirectory() as folder:
        path = shard.checkpoint(Path(folder) / "shard.safetensors")
        return shard.version, path.read_bytes()
