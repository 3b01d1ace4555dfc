"""A shard server: one slice of a stage's parameters, served to the stage's cells.

The state and the optimizer are ``swarmd.models.parameter_shard.ParameterShard``; this class is
what the network sees of it (``docs/data-path.md``):

- ``admit``: a contribution is heard only from a peer that holds a cell of the shard's stage
  (named by the assignment in force, or the holder the pool resolved), a sum of several cells'
  only from the reduction head of a group of them, and for no more micro-batches than its
  shares can hold (``NotHolder`` / ``BadRequest`` otherwise); and only for shares
  the ledger ticketed to a pipeline whose cell of the stage the sender holds (or whose group it
  heads), for no more micro-batches than the tickets' shares hold
  (``swarmd.peers.taskpool.tickets``): a made-up share, or another pipeline's, is refused
  ``BadRequest``, which counts against the sender toward a ban.
- ``contribute``: a cell's gradient or pseudo-gradient slice, decoded and checked (codec,
  length, finite, norm; ``swarmd.models.shard_contribution``), weighed by its staleness
  (``swarmd.peers.taskpool.exchange``), buffered (or clipped around the last aggregate first,
  with centred clipping); one whose shares are in already (a replay, or a resend after a lost
  answer) is refused ``AlreadyApplied``, and the cell counts it delivered. The contribution
  that completes a step logs the step at the standby before anything else happens (then it
  is **committed**; where no standby can log it, it is applied unreplicated, and counted),
  and only then do pulls see it.
- ``pull``: a long poll for a version newer than the cell's; the answer carries the deltas
  since then (or the whole slice in fp32), which of the cell's pending share IDs are done, and
  which this server does not hold (``unknown``: never seen here, or given back by a step that
  came out non-finite and was undone): the cell sends those again. A dropped step ends the
  long polls, and a poll that names a share it gave back is answered at once, once per sender
  and drop, so that the resend is prompt (a share still on its way is unknown too, and ends
  no wait).
- every ``checkpoint_every`` steps a checkpoint goes to this peer's disk and to the standby
  (``StandbyLink``: the log after it is all a take-over needs; a new standby gets one first; a
  standby whose view lags is waited for, a while, before a step goes unreplicated).

Steps, logs and the checkpoints' writing happen one at a time under one lock, off the event
loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from swarmd.models.parameter_shard import Outcome, ParameterShard, ShardStep
from swarmd.models.shard_config import ContributionError
from swarmd.peers.taskpool.exchange import ExchangeConfig, staleness_weight
from swarmd.peers.taskpool.servers import Shard
from swarmd.peers.taskpool.tickets import TicketVerifier
from swarmd.peers.wire.codecs import decode_vector, encode_vector
from swarmd.peers.wire.errors import AlreadyApplied, BadRequest, FrameError, Stale, Unavailable
from swarmd.peers.wire.messages import Contribute, Contributed, Pull, Pulled
from swarmd.training.shards.contributors import ContributorPool, contributor_refusal, ticket_error, ticket_pipelines
from swarmd.training.shards.give_backs import GiveBackNotices
from swarmd.training.shards.standby_link import LogStep, SendCheckpoint, StandbyLink

logger = logging.getLogger(__name__)

MAX_WAIT_S = 30.0


@dataclass
class ServerStats:
    contributions: int = 0
    duplicates: int = 0
    """Contributions naming shares in already, refused ``AlreadyApplied`` (a resend after a lost
    answer, or a replay)."""
    dropped_stale: int = 0
    refused: int = 0
    """Every refusal, those counted below included."""
    refused_by: dict[str, int] = field(default_factory=dict)
    """Refusals by reason: ``not_holder`` (the sender holds no cell of the stage, or sends a
    sum without heading a group), ``micro_batches``, ``codec``, the tickets' (``ticket``: a
    share without one; ``ticket_pipeline``: another pipeline's share; ``ticket_signature``:
    signed by no ledger keeper; ``ticket_age``), and the shard's own (``finite``, ``norm``,
    ``length``, ``overlap``, ...)."""
    steps: int = 0
    unreplicated: int = 0
    """Steps applied without reaching a standby: lost if this server dies before the next copy."""
    trained_micro_batches: int = 0
    """Micro-batches of the contributions applied in committed steps (trained tokens' count)."""
    pulls: int = 0
    staleness: dict[int, int] = field(default_factory=dict)


class ShardServer:
    def __init__(
        self,
        key: Shard,
        shards: int,
        shard: ParameterShard,
        settings: ExchangeConfig,
        lineage: str,
        checkpoint_path: Path,
        log_step: LogStep,
        send_checkpoint: SendCheckpoint,
        checkpoint_every: int,
        ledger_state: Callable[[], str] = lambda: "",
    ) -> None:
        self.key, self.shards, self.shard, self.settings = key, shards, shard, settings
        self.lineage, self.checkpoint_path = lineage, checkpoint_path
        self.ledger_state = ledger_state
        self.stats = ServerStats()
        self.lock = asyncio.Lock()
        self._new_version = asyncio.Condition()
        self.standby = StandbyLink(key, log_step, send_checkpoint, self._checkpoint, checkpoint_every, ledger_state)
        self._give_backs = GiveBackNotices()
        self.closed = False
        self.tickets = TicketVerifier()

    @property
    def version(self) -> int:
        return self.shard.committed_version

    # --- requests ---------------------------------------------------------------------------

    async def admit(self, sender: str, request: Contribute, tickets: bytes, pool: ContributorPool) -> None:
        """Refuse, counted and before decoding, a live member's contribution unless it holds a cell
        of this stage (``contributor_refusal``) and its ``tickets`` vouch for it (module doc)."""
        self._check_shape(request.stage, request.shard, request.shards)
        a = pool.assignment
        if a is None:
            raise Unavailable(f"shard {self.key}: no assignment is in force here yet; send again shortly")
        refusal = contributor_refusal(self.key, self.settings, a, sender, request, pool.cell_holder)
        if refusal is None:
            pipelines = ticket_pipelines(self.key, a, sender, pool.cell_holder)
            error = await ticket_error(self.tickets, request, tickets, pipelines, list(pool.ledger_keepers()))
            if error is not None:
                refusal = error.reason, BadRequest(f"shard {self.key}: {error} ({error.reason})")
        if refusal is not None:
            self._refuse(refusal[0])
            raise refusal[1]

    def _refuse(self, reason: str) -> None:
        self.stats.refused += 1
        self.stats.refused_by[reason] = self.stats.refused_by.get(reason, 0) + 1

    async def contribute(self, request: Contribute, blob: bytes, *, sender: str = "") -> Contributed:
        """Take a contribution ``admit`` let through; ``sender`` gives it its vote in the shard's
        adaptive bounds (``swarmd.models.robust_aggregation.VoteMedian``)."""
        self._check_shape(request.stage, request.shard, request.shards)
        if request.kind != ("gradient" if self.settings.mode == "gradient" else "pseudo"):
            raise BadRequest(f"shard {self.key} takes {self.settings.mode}-mode contributions, not {request.kind}")
        try:
            vector = await asyncio.to_thread(decode_vector, blob, self.shard.size, request.codec)
        except FrameError as e:
            self._refuse("codec")
            raise BadRequest(f"shard {self.key}: {e}") from None
        async with self.lock:
            if self.closed:
                raise Stale(f"shard {self.key} is closing here; send it to the shard's next holder")
            staleness = self.shard.version - request.base_version
            if staleness < 0:
                self._refuse("version")
                raise BadRequest(
                    f"shard {self.key}: base version {request.base_version} is ahead of this "
                    f"server's {self.shard.version}; pull the whole slice"
                )
            weight = staleness_weight(staleness, self.settings)
            drops = self.shard.counters.dropped_steps
            try:
                result = await asyncio.to_thread(
                    self.shard.contribute,
                    vector,
                    request.base_version,
                    request.micro_batches,
                    request.share_ids,
                    weight,
                    parts=request.parts,
                    sender=sender,
                )
            except ContributionError as e:
                self._refuse(e.reason)
                if e.reason == "overlap":
                    # A head's sum: it sends the parts one by one. A cell's own round with some
                    # shares in already (one issued again that another pipeline trained first):
                    # dropped like a stale one, never resent for ever.
                    if request.parts > 1:
                        raise AlreadyApplied(f"shard {self.key}: {e}") from None
                    raise Stale(f"shard {self.key}: {e}; drop this slice") from None
                raise BadRequest(f"shard {self.key}: {e} ({e.reason})") from None
            self.stats.contributions += 1
            if result.outcome is Outcome.DUPLICATE:
                self.stats.duplicates += 1
                raise AlreadyApplied(
                    f"shard {self.key} has the shares of this contribution in already ({request.share_ids[:3]}): "
                    "not applied again"
                )
            self.stats.staleness[staleness] = self.stats.staleness.get(staleness, 0) + 1
            if result.outcome is Outcome.DROPPED:
                self.stats.dropped_stale += 1
            if result.step is not None:
                await self._commit(result.step)
            elif self.shard.counters.dropped_steps != drops:
                await self._dropped()
            committed = set(request.share_ids) <= self.shard.committed(request.share_ids)
        return Contributed(
            version=self.version,
            accepted=result.outcome is Outcome.BUFFERED,
            staleness=staleness,
            weight=weight,
            duplicate=False,
            committed=committed,
        )

    async def pull(self, request: Pull, sender: str) -> tuple[Pulled, list[bytes]]:
        self._check_shape(request.stage, request.shard, request.shards)
        self.stats.pulls += 1
        pending, have, drops = request.pending_share_ids, request.have_version, self.shard.counters.dropped_steps

        # A long poll waits for news: a newer version, some of the cell's pending shares committed
        # (its next round may start), or given back by a dropped step and not told to it yet
        # (``give_backs``); a drop ends every wait once (a poll sent before the shares it gave
        # back does not name them, the next one does).
        def given_back() -> dict[int, int]:
            return self._give_backs.untold(sender, self.shard.given_back(pending))

        def news() -> bool:
            dropped = self.shard.counters.dropped_steps != drops
            return self.version != have or self.closed or dropped or bool(given_back())

        if request.wait_s > 0 and not (news() or self.shard.committed(pending)):
            async with self._new_version:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._new_version.wait_for(news), min(request.wait_s, MAX_WAIT_S))
        async with self.lock:  # a consistent version, deltas and committed IDs
            ids = dict(committed=sorted(self.shard.committed(pending)), unknown=sorted(self.shard.unknown(pending)))
            self._give_backs.tell(sender, given_back())
            deltas = None if request.have_version < 0 else self.shard.deltas_since(request.have_version)
            if deltas == []:
                return Pulled(version=self.version, kind="none", versions=[], **ids), []
            if deltas is not None:
                blobs: list[bytes] = await asyncio.to_thread(lambda: [encode_vector(d, "fp16") for _, d in deltas])
                return Pulled(version=self.version, kind="deltas", versions=[v for v, _ in deltas], **ids), blobs
            found = self.shard.weights()
            assert found is not None, "no step is pending confirmation outside the lock"
            version, weights = found
            blob = await asyncio.to_thread(encode_vector, weights, "fp32")
            return Pulled(version=version, kind="full", versions=[version], **ids), [blob]

    def _check_shape(self, stage: int, shard: int, shards: int) -> None:
        if (stage, shard) != self.key or shards != self.shards:
            raise BadRequest(
                f"this server holds shard {self.key} of {self.shards}; the request is for "
                f"({stage}, {shard}) of {shards}"
            )

    # --- commits and copies -----------------------------------------------------------------

    async def _commit(self, step: ShardStep) -> None:
        """Log the step at the standby, then let pulls see it (called under the lock)."""
        if not await self.standby.replicate(step):
            self.stats.unreplicated += 1
        self.shard.confirm(step.version)
        self.stats.steps += 1
        self.stats.trained_micro_batches += step.micro_batches
        await self.standby.stepped()
        async with self._new_version:
            self._new_version.notify_all()

    async def _dropped(self) -> None:
        """A step came out non-finite and was undone (``ParameterShard`` warned): nothing to log,
        serve or copy; the long polls wake to tell the cells to send its shares again."""
        async with self._new_version:
            self._new_version.notify_all()

    async def _checkpoint(self) -> tuple[int, bytes]:
        """Checkpoint here (under the lock): the version and the bytes a standby takes."""
        path = await asyncio.to_thread(self.shard.checkpoint, self.checkpoint_path, {"ledger": self.ledger_state()})
        return self.shard.version, await asyncio.to_thread(path.read_bytes)

    def standby_changed(self) -> None:
        """A new standby (called by the trainer): the next step copies a checkpoint to it first."""
        self.standby.changed()

    async def close(self) -> int:
        """Stop serving: step on what is buffered (no accepted contribution is lost), then copy
        the state here and to the standby. Returns the final version."""
        self.standby.hurry()
        await self.standby.settle()
        async with self.lock:
            self.closed = True
            # A flush that comes out non-finite is undone: its shares go again to the next holder.
            step = await asyncio.to_thread(self.shard.flush)
            if step is not None:
                await self._commit(step)
            # The file here is what the next holder gets: at the final version, checkpoint due or not.
            await self.standby.copy_now()
        async with self._new_version:
            self._new_version.notify_all()
        return self.version

    def weights(self) -> tuple[int, torch.Tensor] | None:
        """The committed version and a copy; None while a step holds the lock (a copy could mix two versions)."""
        return None if self.lock.locked() else self.shard.weights()

    def info(self) -> dict[str, object]:
        s = self.stats
        return {
            "stage": self.key[0],
            "shard": self.key[1],
            "shards": self.shards,
            "version": self.version,
            "committed": self.shard.committed_version,  # logged at the standby (or unreplicated): what pulls see
            "buffered_micro_batches": self.shard.buffered_micro_batches,
            "steps": s.steps,
            "dropped_steps": self.shard.counters.dropped_steps,
            "contributions": s.contributions,
            "duplicates": s.duplicates,
            "dropped_stale": s.dropped_stale,
            "refused": s.refused,
            "refused_by": dict(sorted(s.refused_by.items())),
            "clipped": self.shard.counters.clipped,
            "centre_clipped": self.shard.counters.centre_clipped,
            "norm_bound": self.shard.norm_bound(),
            "clip_radius": self.shard.clip_radius(),
            "distrusted": self.shard.distrusted(),  # sender -> weight (0: excluded)
            "aggregation": self.shard.config.aggregation,
            "unreplicated": s.unreplicated,
            "lagging_standby_waits": self.standby.lagging_waits,
            "pulls": s.pulls,
            "trained_micro_batches": s.trained_micro_batches,
            "staleness": {str(k): v for k, v in sorted(s.staleness.items())},
        }
