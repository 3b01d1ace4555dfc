"""The daemon's training service: host a fair share of the run's stages, and work on all of them.

Every round (``tick``) it reads the stage leases, settles who hosts what by the rule in
``swarmd.peers.stage_assignment``, claims or hands over stages accordingly, opens a
``StageHost`` for each stage it holds (after fetching the newest checkpoint of that stage from
the previous holder or the standby, so versions only grow), and tells its hosts the run's
epoch. One ``PipelineWorker`` per daemon claims tasks from every stage's host, here or on
other peers: a daemon alone hosts and works every stage; as daemons join, hosting spreads and
everyone works; as they leave, the rest take the stages back.

Hosted stages checkpoint every ``checkpoint_every`` updates and on stop, and the checkpoints
are copied to a standby (``swarmd.peers.election.elect_standby``). Stopping hands everything back:
the worker pushes what it holds, each host checkpoints, the copies go out, and the leases are
released at once so that the next host resumes without waiting for them to expire.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from swarmd.errors import SwarmdError
from swarmd.models.corpus import Dataset, load_corpus, train_eval_split
from swarmd.models.param_server import checkpoint_log_seq, stage_checkpoint_name
from swarmd.peers.identity import Identity
from swarmd.peers.op_times import OpTimes
from swarmd.peers.run_spec import SignedRunSpec, run_seed
from swarmd.peers.stage_assignment import HAND_OVER_AGAIN_S, decide, epoch_of, follows_plan
from swarmd.peers.stage_assignment import Trainer as TrainingPeer
from swarmd.peers.stage_leases import StageLease, resolve_holder
from swarmd.peers.swarm_dht import SwarmDHT
from swarmd.peers.wire.rpc import Answer, call
from swarmd.pipeline_worker import PipelineWorker, WorkerSettings
from swarmd.relay import Router, speaker_of
from swarmd.replication import LOG_METHOD, StageReplicator, standby_of
from swarmd.stage_host import MAX_LOSSES_KEPT, HostSettings, StageHost

logger = logging.getLogger(__name__)

LEASE_TTL_S = 30.0
CLAIM_GRACE_S = 10.0
"""How long a free stage waits for its designated claimant before anyone may claim it."""
STAGE_METHOD = "stage"
REQUEST_TIMEOUT_S = 30.0
LOG_TIMEOUT_S = 3.0
LOG_PAUSE_S = 15.0
"""After a standby fails to log a push, pushes go unreplicated (counted) for this long rather than
each waiting out the timeout; by then a dead standby has been dropped and another chosen."""
MAX_CHECKPOINT_SOURCES = 6
WORKER_STOP_TIMEOUT_S = 15.0
CHECKPOINT_EVERY = 10
"""Updates between a host's checkpoints, each copied to the standby: what a killed host can lose."""
BATCHES_AHEAD = 1
"""Batches stage 0 starts beyond the one being summed: overlap at the price of staleness
(0 measured 4x slower on one machine's 4 daemons; 1 costs ~0.1 nats at equal tokens early on)."""
PUSH_EVERY = 2
"""Finished micro-batches a worker sums before it pushes (the servers sum pushes into batches)."""


def accumulate_of(spec: SignedRunSpec) -> int:
    """Micro-batches per parameter-server update: the run's batch over its micro-batch."""
    return max(1, spec.spec.batch_sequences // spec.spec.micro_batch)


class RoleView(Protocol):
    """What the trainer asks of the swarm's measurements and elections (``swarmd.coordination``)."""

    def score_of(self, peer: str) -> float:
        """The peer's reliability as others observed it, 0..1."""

    def may_host(self, peer: str, incumbent: bool) -> bool:
        """Whether the peer passes the election's thresholds (an incumbent with hysteresis)."""

    def home_stage(self) -> int | None:
        """The stage the published plan gives this peer (None: no plan, or it leaves us out)."""

    def planned_server(self, stage: int) -> str | None:
        """The peer the plan in force names the stage's parameter server (None: no plan)."""

    def is_relay(self, peer: str) -> bool:
        """Whether the plan in force names the peer a relay (it may speak for others)."""

    def link_Bps(self, a: str, b: str) -> float:
        """The measured bandwidth from ``a`` to ``b`` (0.0: not known)."""


class Unmeasured:
    """Before anything is measured: nobody is preferred, everyone may host, no plan."""

    def score_of(self, peer: str) -> float:
        return 0.0

    def may_host(self, peer: str, incumbent: bool) -> bool:
        return True

    def home_stage(self) -> int | None:
        return None

    def planned_server(self, stage: int) -> str | None:
        return None

    def is_relay(self, peer: str) -> bool:
        return False

    def link_Bps(self, a: str, b: str) -> float:
        return 0.0


class Trainer:
    def __init__(
        self,
        spec: SignedRunSpec,
        identity: Identity,
        dht: SwarmDHT,
        checkpoint_dir: Path,
        replicator: StageReplicator,
        members: Callable[[], list[dict[str, Any]]],
        standby: Callable[[], str | None] = lambda: None,
        max_in_flight: int = 16,
        roles: RoleView | None = None,
        router: Router | None = None,
        own_uptime: Callable[[], float] = lambda: 0.0,
    ) -> None:
        """``router``: how our worker's requests reach the stage hosts (direct, or through a
        relay; ``swarmd.relay``); without one, always direct. ``own_uptime``: this daemon's
        uptime as its heartbeats tell others (peers are ordered by it for roles)."""
        self.spec = spec
        self.identity = identity
        self.own = identity.peer_id
        self.dht = dht
        self.checkpoint_dir = checkpoint_dir
        self.replicator = replicator
        self.members = members
        self.standby = standby
        self.max_in_flight = max_in_flight
        self.roles: RoleView = roles or Unmeasured()
        self.router = router or Router(self.own, lambda: (), lambda: None, mode="never")
        self.served_by_op = OpTimes()  # the stage requests our hosts answered: how many, how long
        self.stages = spec.spec.stages
        self.state = "starting"
        self.error: str | None = None
        self.hosts: dict[int, StageHost] = {}
        self.holders: list[StageLease | None] = [None] * self.stages
        self.holders_at = 0.0  # when the leases were last scanned
        self.own_uptime = own_uptime
        self.epoch: str | None = None
        self.worker: PipelineWorker | None = None
        self._dataset: Dataset | None = None
        self._claimed: dict[int, float] = {}  # stage -> our claim time
        self._free_since: list[float | None] = [None] * self.stages
        self._last_holder: list[str | None] = [None] * self.stages
        self._last_other_holder: list[str | None] = [None] * self.stages  # whose checkpoint a new host of ours wants
        self._provisional: set[int] = set()  # stages we claimed before a plan placed their server
        self._planned: list[str | None] = [None] * self.stages  # each stage's server in the plan in force
        self._planned_since = [0.0] * self.stages  # since when the plan has named it
        self._handed: dict[tuple[int, str], float] = {}  # (stage, peer) -> when we last handed it there
        self._seen_members: set[str] = set()
        self._departed: dict[str, float] = {}  # peer -> when its heartbeat went: its leases are void
        self._pushed: dict[int, int] = {}
        self._last_standby: str | None = None
        self._log_paused_until: dict[str, float] = {}
        self._replicating: asyncio.Task[None] | None = None
        self._worker_task: asyncio.Task[None] | None = None
        self._worker_stop = asyncio.Event()
        self._losses_before: deque[tuple[int, float]] = deque(maxlen=MAX_LOSSES_KEPT)
        self._rate: deque[tuple[float, int]] = deque(maxlen=30)  # (time, micro-batches finished at the last stage)

    # --- the round ----------------------------------------------------------------------------

    async def tick(self) -> None:
        if self.error is not None:
            if self._claimed or self.hosts:
                await self.release()
            self.state = "failed"
            return
        if self._dataset is None:
            try:
                self._dataset = await asyncio.to_thread(self._load_dataset)
            except SwarmdError as e:
                self.error = str(e)
                logger.error("Cannot train run %s: %s", self.spec.run_id, e)
                self.state = "failed"
                return
        now = time.time()
        scans = await asyncio.gather(*(self.dht.scan_leases(s, now) for s in range(self.stages)))
        members = self.members()
        # A holder we saw whose heartbeat is gone (killed, cut off) frees its stages now, not when
        # its lease runs out: membership notices within a heartbeat TTL. (One we never saw may
        # just not be in our first scans yet.)
        live = {m["peer_id"] for m in members}
        for peer in self._seen_members - live:
            self._departed[peer] = now
            for host in self.hosts.values():
                host.drop_worker(peer)  # its leases go back to the queues now
        self._seen_members = live
        self._departed = {p: t for p, t in self._departed.items() if p not in live and now - t < LEASE_TTL_S}
        holders = [resolve_holder([x for x in leases if x.peer_id not in self._departed], now) for leases in scans]
        for s, lease in enumerate(holders):
            if lease is not None:
                self._last_holder[s] = lease.peer_id
                if lease.peer_id != self.own:
                    self._last_other_holder[s] = lease.peer_id
                self._free_since[s] = None
            elif self._free_since[s] is None:
                self._free_since[s] = now
            if s in self._claimed and lease is not None and lease.peer_id != self.own:
                logger.info("Stage %d went to %s (an earlier claim); withdrawing ours", s, lease.peer_id)
                del self._claimed[s]
        holding = {lease.peer_id for lease in holders if lease is not None}
        trainers = [
            TrainingPeer(p, m["uptime_s"], self.roles.score_of(p), self.roles.may_host(p, p in holding))
            for m in members if "worker" in m["roles"] and (p := m["peer_id"])
        ]  # fmt: skip
        trainers.append(TrainingPeer(self.own, self.own_uptime(), self.roles.score_of(self.own),
                                     self.roles.may_host(self.own, self.own in holding)))  # fmt: skip
        free_for = [0.0 if since is None else now - since for since in self._free_since]
        planned = [self.roles.planned_server(s) for s in range(self.stages)]
        for s, server in enumerate(planned):
            if server != self._planned[s]:
                self._planned[s], self._planned_since[s] = server, now
        preferred = [self._preferred(s, planned[s], members, live) for s in range(self.stages)]
        # A provisional stage the plan gives us is ours; one it gives another goes there, and so,
        # once the plan has settled, does any stage we hold that it gives another.
        self._provisional = {s for s in self._provisional if s in self._claimed and planned[s] != self.own}
        to_hand_over = {s for s in self._provisional if planned[s] is not None} | {
            s for s, since in self._claimed.items()
            if follows_plan(self.own, planned[s], now - self._planned_since[s], now - since,
                            now - self._handed.get((s, planned[s] or ""), -math.inf))
        }  # fmt: skip
        decision = decide(self.own, holders, trainers, free_for, CLAIM_GRACE_S, preferred, to_hand_over)
        for s in decision.release:
            if s in to_hand_over and preferred[s] not in (None, self.own):
                logger.info("Handing stage %d over to %s, its parameter server in the plan", s, preferred[s])
                self._handed[(s, str(preferred[s]))] = now
                self._handed = {k: t for k, t in self._handed.items() if now - t < HAND_OVER_AGAIN_S}
            else:
                logger.info("Handing stage %d over: %d training peers now share %d stages", s, len(trainers),
                            self.stages)  # fmt: skip
            await self._close_host(s)
            await self._publish_lease(s, now, released=True)
            del self._claimed[s]
            holders[s] = None
        for s in decision.claim:
            self._claimed.setdefault(s, now)
            if planned[s] is None:
                self._provisional.add(s)
        for s in self._claimed:
            await self._publish_lease(s, now, released=False)
        for s in list(self.hosts):
            if holders[s] is None or holders[s].peer_id != self.own:  # type: ignore[union-attr]
                await self._close_host(s)
        for s, lease in enumerate(holders):
            if lease is not None and lease.peer_id == self.own and s not in self.hosts:
                await self._open_host(s)
        self.holders, self.holders_at = holders, now
        self.epoch = epoch_of(holders) if all(
            lease is not None and (lease.peer_id != self.own or lease.stage in self.hosts) for lease in holders
        ) else None  # fmt: skip
        for host in self.hosts.values():
            host.set_epoch(self.epoch)
        self._start_worker()
        if self.hosts and (self._replicating is None or self._replicating.done()):
            self._replicating = asyncio.create_task(self._replicate())
        self._sample_rate()
        self.state = "training" if self.epoch is not None else "claiming"

    def _preferred(self, stage: int, planned: str | None, members: list[dict[str, Any]], live: set[str]) -> str | None:
        """Who should hold ``stage``: the standby of a holder that left (it holds the replica;
        or of one that handed it over with no plan in force), else the plan's parameter server."""
        last = self._last_holder[stage]
        if last is not None and (planned is None or (last != self.own and last not in live)):
            return standby_of(members, self.own, last, self.roles.score_of, self.own_uptime(), self.roles.link_Bps)
        return planned

    def _load_dataset(self) -> Dataset:
        spec = self.spec.spec
        train, _ = train_eval_split(load_corpus(spec.corpus), spec.model.seq_len, seed=run_seed(self.spec.run_id))
        return train

    async def _publish_lease(self, stage: int, now: float, released: bool) -> None:
        lease = StageLease(run_id=self.spec.run_id, stage=stage, peer_id=self.own, claimed_at=self._claimed[stage],
                           issued_at=now, expires_at=now + LEASE_TTL_S, released=released)  # fmt: skip
        await self.dht.publish_lease(lease, lease.sign(self.identity))

    # --- hosting ----------------------------------------------------------------------------

    async def _open_host(self, stage: int) -> None:
        """Host ``stage``: resume from the newest checkpoint anyone offers, then serve it."""
        likeliest = sorted(self.members(), key=lambda m: (-self.roles.score_of(m["peer_id"]), -m["uptime_s"]))
        previous = self._last_other_holder[stage]  # by the time we open, the last holder is us
        sources = [p for p in [previous, *(m["peer_id"] for m in likeliest)] if p and p != self.own]
        candidates = list(dict.fromkeys(sources))[:MAX_CHECKPOINT_SOURCES]
        await self.replicator.fetch_newest(stage, candidates, previous=previous)
        s = self.spec.spec
        settings = HostSettings(
            run_id=self.spec.run_id, stage=stage, stages=self.stages, shape=s.model, seed=run_seed(self.spec.run_id),
            micro_batch=s.micro_batch, lr=s.lr, weight_decay=s.weight_decay, max_staleness=s.max_staleness,
            accumulate=accumulate_of(self.spec), max_in_flight=self.max_in_flight, checkpoint_every=CHECKPOINT_EVERY,
            batches_ahead=BATCHES_AHEAD,
        )  # fmt: skip
        path = self.checkpoint_dir / stage_checkpoint_name(stage)
        entries = await self.replicator.fetch_log(stage, checkpoint_log_seq(path), candidates)
        log_push = functools.partial(self._log_push, stage)
        try:
            host = await asyncio.to_thread(StageHost, settings, self.checkpoint_dir, self._dataset, entries, log_push)
            if host.replayed:  # the replayed state goes to the standby with the next copy
                await asyncio.to_thread(host.server.checkpoint)
        except Exception as e:  # a corrupt checkpoint: report it, and let another peer host
            self.error = f"cannot host stage {stage}: {type(e).__name__}: {e}"
            logger.error("%s", self.error)
            return
        self.hosts[stage] = host
        logger.info("Hosting stage %d of run %s from version %d", stage, self.spec.run_id, host.server.version)

    async def _close_host(self, stage: int) -> None:
        host = self.hosts.pop(stage, None)
        if host is None:
            return
        await host.stop()
        if host.is_last:  # its losses stay in our status: the stage's record is split over its hosts
            self._losses_before.extend(host.losses)
        logger.info("Stopped hosting stage %d at version %d", stage, host.server.version)
        await self._replicate([stage])

    async def _log_push(self, stage: int, seq: int, meta: dict[str, Any], blob: bytes) -> bool:
        """Log a push at the standby before our host applies it (``StageHost.log_push``)."""
        standby, p2p = self.standby(), self.replicator.p2p
        if standby is None or p2p is None:
            return False  # alone: nobody to replicate to
        if time.monotonic() < self._log_paused_until.get(standby, 0.0):
            return False  # it failed just now: do not stall every push on it until it is dropped
        args = {"run_id": self.spec.run_id, "stage": stage, "seq": seq, "meta": meta,
                "lineage": repr(self._claimed.get(stage))}  # fmt: skip
        started = time.monotonic()
        try:
            await call(p2p, standby, LOG_METHOD, args, [blob], timeout_s=LOG_TIMEOUT_S)
        except SwarmdError as e:
            # A quick failure is a stream that broke (a reset connection): one more try, at once.
            # A slow one is a standby that is slow or gone: retrying would hold the push longer.
            if time.monotonic() - started < LOG_TIMEOUT_S / 2:
                logger.debug("Logging a push of stage %d at %s failed (%s); trying again", stage, standby, e)
                try:
                    await call(p2p, standby, LOG_METHOD, args, [blob], timeout_s=LOG_TIMEOUT_S)
                    return True
                except SwarmdError:
                    pass
            self._log_paused_until[standby] = time.monotonic() + LOG_PAUSE_S
            raise
        return True

    async def _replicate(self, stages: list[int] | None = None) -> None:
        """Copy new checkpoints of our stages to the standby; a failure is retried next round."""
        standby = self.standby()
        if standby is None:
            return
        if standby != self._last_standby:  # a new standby starts from a fresh copy, not a log
            self._last_standby = standby
            self._pushed.clear()
            for host in list(self.hosts.values()):
                await host.rebase()
        try:
            await self.replicator.push(standby, self._pushed, sorted(self.hosts) if stages is None else stages)
        except SwarmdError as e:
            logger.warning("Could not copy stage checkpoints to standby %s (%s); retrying next round", standby, e)

    # --- requests: to our hosts, from our worker and from peers ---------------------------

    async def serve(self, sender: str, header: dict[str, Any], blobs: list[bytes]) -> Answer:
        """The ``stage`` RPC method: a peer's worker asks one of our hosts, itself or through a
        relay (which says for whom: believed only from a relay of the plan in force)."""
        sender = speaker_of(sender, header, self.roles.is_relay)
        stage, op = header.get("stage"), header.get("op")
        if header.get("run_id") != self.spec.run_id or type(stage) is not int or not isinstance(op, str):
            raise SwarmdError(f"not a stage request of run {self.spec.run_id}")
        host = self.hosts.get(stage)
        if host is None:
            raise SwarmdError(f"this peer does not host stage {stage} (any more); refresh the stage holders")
        started = time.perf_counter()
        try:
            return await host.handle(op, sender, header, blobs)
        finally:
            self.served_by_op.add(op, time.perf_counter() - started)

    async def _request(self, stage: int, op: str, header: dict[str, Any], blobs: list[bytes]) -> Answer:
        lease = self.holders[stage]
        if lease is None:
            raise SwarmdError(f"stage {stage} has no host right now")
        header = {**header, "run_id": self.spec.run_id, "stage": stage, "op": op}
        if lease.peer_id == self.own:
            return await self.serve(self.own, header, blobs)
        p2p = self.replicator.p2p
        if p2p is None:
            raise SwarmdError("the data path is not up yet")
        return await self.router.call(p2p, lease.peer_id, STAGE_METHOD, header, blobs, REQUEST_TIMEOUT_S)

    # --- the worker ---------------------------------------------------------------------------

    def _start_worker(self) -> None:
        if self._worker_task is not None or self._dataset is None:
            return
        s = self.spec.spec
        settings = WorkerSettings(
            shape=s.model, stages=self.stages, seed=run_seed(self.spec.run_id), micro_batch=s.micro_batch,
            push_every=min(PUSH_EVERY, accumulate_of(self.spec)),
        )  # fmt: skip
        self.worker = PipelineWorker(settings, self._dataset, self.own, self._request, lambda: self.epoch, self._home)
        self._worker_stop.clear()
        self._worker_task = asyncio.create_task(self._run_worker(), name="pipeline worker")

    def _home(self) -> int | None:
        """The stage our worker prefers: one we host, else the one the published plan gives
        us, else one by our rank among the workers that host nothing (so they spread evenly
        over the stages)."""
        if self.hosts:
            return min(self.hosts)
        planned = self.roles.home_stage()
        if planned is not None and 0 <= planned < self.stages:
            return planned
        hosts = {lease.peer_id for lease in self.holders if lease is not None}
        others = sorted({m["peer_id"] for m in self.members() if "worker" in m["roles"]} - hosts | {self.own})
        return others.index(self.own) % self.stages

    async def _run_worker(self) -> None:
        assert self.worker is not None
        try:
            await self.worker.run(self._worker_stop)
        except Exception as e:
            logger.exception("The pipeline worker failed")
            self.error = f"worker: {type(e).__name__}: {e}"

    async def release(self) -> None:
        """Stop working, checkpoint and copy every hosted stage, release the leases at once."""
        self._worker_stop.set()
        if self._worker_task is not None:
            try:
                await asyncio.wait_for(self._worker_task, WORKER_STOP_TIMEOUT_S)
            except TimeoutError:
                logger.warning("The pipeline worker did not stop in %.0f s", WORKER_STOP_TIMEOUT_S)
            self._worker_task = None
        if self._replicating is not None:
            await asyncio.gather(self._replicating, return_exceptions=True)
        for s in list(self.hosts):
            await self._close_host(s)
        now = time.time()
        for s in list(self._claimed):
            await self._publish_lease(s, now, released=True)
        self._claimed.clear()
        self.epoch = None
        self.state = "stopped"

    async def gather_checkpoints(self) -> list[int | None]:
        """Bring every stage's newest checkpoint here (for export): ours written now, the
        others fetched from their hosts or whoever holds a newer copy."""
        versions: list[int | None] = []
        for stage in range(self.stages):
            host = self.hosts.get(stage)
            if host is not None:
                versions.append(await host.checkpoint_now())
                continue
            holder = self.holders[stage]
            try:  # have the host write its current state first
                await self._request(stage, "checkpoint", {}, [])
            except SwarmdError as e:
                logger.warning("The host of stage %d did not checkpoint (%s); taking the newest copy", stage, e)
            sources = [p for p in [holder.peer_id if holder else None, *(m["peer_id"] for m in self.members())] if p]
            versions.append(await self.replicator.fetch_newest(stage, list(dict.fromkeys(sources))))
        return versions

    # --- status -----------------------------------------------------------------------------

    def _sample_rate(self) -> None:
        last = self.hosts.get(self.stages - 1)
        if last is not None:
            self._rate.append((time.monotonic(), last.stats.micro_batches_finished))

    def status(self) -> dict[str, Any]:
        s = self.spec.spec
        tokens_per_mb = s.micro_batch * s.model.seq_len
        versions = list(self.worker.host_versions) if self.worker is not None else [0] * self.stages
        for stage, host in self.hosts.items():
            versions[stage] = host.server.version
        answer: dict[str, Any] = {
            "state": self.state, "error": self.error, "stages": self.stages, "epoch": self.epoch,
            "holders": [None if h is None else h.peer_id for h in self.holders],
            "hosting": sorted(self.hosts), "standby": self.standby() if self.hosts else None,
            "stage_versions": versions, "updates": min(versions),
            "hosts": {str(k): h.info() for k, h in sorted(self.hosts.items())},
            "worker": self.worker.status() if self.worker is not None else None,
            "routes": self.router.status(), "served_by_op": self.served_by_op.status(),
            "loss": None, "tokens": None, "tokens_per_s": None, "losses": None,
        }  # fmt: skip
        last = self.hosts.get(self.stages - 1)
        if self._losses_before or last is not None:  # while this daemon hosted the last stage
            losses = [*self._losses_before, *(last.losses if last is not None else [])][-MAX_LOSSES_KEPT:]
            answer["losses"] = [[m, round(loss, 4)] for m, loss in losses]
        if last is not None:  # the last stage's host sees every micro-batch finish, with its loss
            recent = [loss for _, loss in list(last.losses)[-16:]]
            answer["loss"] = round(sum(recent) / len(recent), 4) if recent else None
            answer["tokens"] = last.stats.micro_batches_finished * tokens_per_mb
            if len(self._rate) >= 2 and self._rate[-1][0] > self._rate[0][0]:
                (t0, n0), (t1, n1) = self._rate[0], self._rate[-1]
                answer["tokens_per_s"] = round((n1 - n0) * tokens_per_mb / (t1 - t0), 1)
        return answer
