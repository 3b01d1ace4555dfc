"""What the elected coordinator does each round: plan the live swarm and publish the plan.

The coordinator plans from the live scenario (``swarmd.peers.planning.snapshot``): a full plan
the first time, a repair when members joined or left (``swarmd.peers.planning.planner.repair``),
and publishes it signed with the next version. While the members stay the same it keeps the
plan, only re-electing its relays and renewing its expiry, unless a fresh plan on what was
measured since is predicted ``REPLAN_GAIN`` faster. A full plan keeps the peers of the
assignment in force (the provisional rule's before the first plan) in their cells and shards
where swapping alike devices costs at most ``KEEP_WITHIN`` of its predicted speed. Planning
runs in a worker thread (it is pure numpy work of up to ``PLAN_BUDGET_S``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import replace
from typing import Any

from swarmd.node.swarm_view import SwarmView
from swarmd.peers.membership.election import ElectionConfig, elect_relays, relays_wanted
from swarmd.peers.planning.plan_cost import Plan
from swarmd.peers.planning.planner import PlanError, PlannerConfig, plan, repair
from swarmd.peers.planning.repair import kept_in_place
from swarmd.peers.planning.scenario import ScenarioError
from swarmd.peers.planning.snapshot import Snapshot
from swarmd.peers.planning.throughput import ThroughputModel
from swarmd.peers.records.identity import Identity
from swarmd.peers.records.plan_record import KIND as PLAN_KIND
from swarmd.peers.records.plan_record import PlanRecord
from swarmd.peers.records.run_spec import SignedRunSpec
from swarmd.peers.taskpool.assignment import from_plan, provisional

logger = logging.getLogger(__name__)

PLAN_TTL_S = 300.0
PLAN_BUDGET_S = 0.5
REPLAN_S = 60.0
"""How often the coordinator plans afresh on what is measured by then, to compare."""
REPLAN_GAIN = 1.2
"""A fresh plan replaces the one in force only when predicted this much faster (hysteresis)."""
REPUBLISH_PLAN_S = 60.0
REPAIR_FLOOR = 0.3
"""A repair is published only when predicted at least this fraction of a full plan's speed on
the same measurements. A repair keeps cells in place (no stage's weights move), worth some
speed: dropping one of two pipelines halves it by construction, and the minutely comparison
re-grows it once members hold still. Not most of it: a repair that put stage 0 behind a slow
relayed link once held a swarm at 1,855 tokens/s (0.17 of the full plan's predicted 10,952) for
3.5 min while members came and went. At 0.5, CI's five-daemon test once answered a departure
with a full plan (its predictions were not on record)."""
KEEP_WITHIN = 0.05
"""A full plan is published with alike devices swapped so that the assignment in force keeps
its cells and shards (``swarmd.peers.planning.repair.kept_in_place``) when that is predicted
at most this fraction slower. A moved cell or shard is a hand-over the prediction does not
price: two equal CPU daemons, placed by peer ID provisionally, were swapped by the first plan
(the planner orders them by noise in their links, both orders predicted alike), and the
6 s hand-over fell in a timed window: 1,800 tokens/s against 12,800."""


class PlanPublisher:
    """The coordinator's plans: made, repaired, compared, and published with rising versions."""

    def __init__(self, spec: SignedRunSpec, identity: Identity, dht: Any, thresholds: ElectionConfig) -> None:
        self.spec, self.identity, self.dht, self.thresholds = spec, identity, dht, thresholds
        self.run_id, self.own = spec.run_id, identity.peer_id
        self.published: PlanRecord | None = None
        """The plan this peer last published (it may not be back from the DHT yet)."""
        self.plan_error: str | None = None
        """Why the last attempt to plan failed; None once one succeeds."""
        self._compared_at = time.time()  # when the plan in force was last compared with a fresh one
        self._published_at = 0.0
        self._highest_version = 0

    def note(self, plans: list[PlanRecord]) -> None:
        """Plans the next one published must outnumber: those within reach of the plan in force
        (``swarmd.node.plan_choice.within_reach``). A stranger's plan far ahead is left out, or
        it would carry every later version past what the followers accept."""
        for record in plans:
            self._highest_version = max(self._highest_version, record.version)

    async def round(self, view: SwarmView, in_force: PlanRecord | None, now: float) -> None:
        """One round as the elected coordinator; ``in_force`` is the plan the swarm follows."""
        snap = view.snapshot
        if snap is None or snap.scenario.n < self.spec.spec.stages:
            return  # fewer members than stages: every member hosts and works, nothing to place
        previous = self.published or in_force
        members = set(snap.scenario.ids)
        if previous is not None and set(previous.devices) == members and previous.peer_id == self.own:
            if now - self._compared_at >= REPLAN_S and await self._better_plan(view, snap, previous, now):
                return  # the links measured since (passively, on real traffic) make another plan faster
            relays = self._elect_relays(view, previous.devices, previous.relays, previous.relays)
            if relays != previous.relays:  # a relay fell below its threshold, or one now passes
                record = replace(previous, version=self._highest_version + 1, kind="relays", relays=relays)
                logger.info("Plan v%d: relays now %s", record.version, [record.devices[r] for r in relays])
                await self._publish(record, now)
            elif now - self._published_at >= REPUBLISH_PLAN_S:
                await self._publish(previous, now)  # same plan, fresh expiry
            return
        settings = self._settings()
        try:
            if previous is not None and set(previous.devices) & members:
                fixed = await asyncio.to_thread(
                    repair, snap.scenario, record_plan(previous), previous.devices, settings
                )
                result, kind = await self._repair_or_full(snap, fixed.plan, settings)
            else:
                result, kind = await asyncio.to_thread(plan, snap.scenario, settings), "full"
        except (PlanError, ScenarioError) as e:
            if str(e) != self.plan_error:  # once per distinct reason, not every round
                logger.warning("Cannot plan the swarm: %s", e)
            self.plan_error = str(e)
            return
        self.plan_error = None
        await self._publish_new(view, snap, result, kind, previous, now)

    async def _repair_or_full(self, snap: Snapshot, mended: Plan, settings: PlannerConfig) -> tuple[Plan, str]:
        """The repair, unless a full plan on the same measurements is predicted to train more than
        ``1 / REPAIR_FLOOR`` times the effective tokens per second (then the full plan): what the
        planner chose it by."""
        try:
            fresh = await asyncio.to_thread(plan, snap.scenario, settings)
            model = ThroughputModel(snap.scenario, max_staleness=self.spec.spec.max_staleness)
            mended_tps = (await asyncio.to_thread(model.evaluate, mended)).effective_tokens_per_s
            fresh_tps = (await asyncio.to_thread(model.evaluate, fresh)).effective_tokens_per_s
        except (PlanError, ScenarioError, ValueError) as e:
            logger.debug("No full plan to weigh the repair against: %s", e)
            return mended, "repair"
        if fresh_tps * REPAIR_FLOOR > mended_tps:
            logger.info(
                "A repair predicted %.0f effective tokens/s against %.0f for a full plan: planning afresh",
                mended_tps,
                fresh_tps,
            )
            return fresh, "full"
        logger.info("A repair predicted %.0f effective tokens/s against %.0f for a full plan", mended_tps, fresh_tps)
        return mended, "repair"

    def _settings(self) -> PlannerConfig:
        run = self.spec.spec
        # local_steps 0: the planner proposes H from the links; the daemons cut their stages evenly.
        return PlannerConfig(
            time_budget_s=PLAN_BUDGET_S, stages=run.stages, local_steps=run.local_steps or None, even_layers=True
        )

    async def _publish_new(
        self, view: SwarmView, snap: Snapshot, result: Plan, kind: str, previous: PlanRecord | None, now: float
    ) -> None:
        """Publish a plan of the planner's as the next version, its relays elected."""
        if kind == "full":
            result = await asyncio.to_thread(self._kept, snap, result, previous)
        ids = snap.scenario.ids
        current_relays = [] if previous is None else [previous.devices[r] for r in previous.relays]
        relays = self._elect_relays(view, ids, [ids.index(p) for p in current_relays if p in ids], list(result.relays))
        prediction = result.meta.get("prediction")
        predicted = prediction.to_json() if prediction is not None else {}  # type: ignore[attr-defined]
        record = PlanRecord(
            run_id=self.run_id,
            peer_id=self.own,
            issued_at=now,
            expires_at=now + PLAN_TTL_S,
            version=self._highest_version + 1,
            kind=kind,
            devices=ids,
            pipelines=[list(row) for row in result.pipelines],
            layers_per_stage=list(result.layers_per_stage),
            parameter_servers=list(result.parameter_servers),
            relays=relays,
            predicted={k: float(v) for k, v in list(predicted.items())[:16]},
            shard_servers=[list(row) for row in result.shard_servers],
            local_steps=result.local_steps,
            share_micro_batches=result.share_micro_batches,
            spares=list(result.spares),
            reduce_groups=list(result.reduce_groups),
            checkpointing=list(result.checkpointing),
        )
        shape = f"{len(record.pipelines)} pipelines of {len(record.layers_per_stage)} stages"
        logger.info(
            "Plan v%d (%s): %s, predicted %.0f tokens/s",
            record.version,
            kind,
            shape,
            record.predicted.get("tokens_per_s", 0.0),
        )
        await self._publish(record, now)

    def _kept(self, snap: Snapshot, fresh: Plan, previous: PlanRecord | None) -> Plan:
        """``fresh`` with the peers of the assignment in force kept in their places where that
        is predicted at most ``KEEP_WITHIN`` slower (module doc): ``previous``, else the
        provisional rule over the members planned, which each of them follows until a plan."""
        run = self.spec.spec
        if previous is not None:
            held = from_plan(previous, run.stages, 1)
            if held is None:
                return fresh
        else:
            held = provisional(list(snap.scenario.ids), run.stages, 1)
        kept = kept_in_place(fresh, snap.scenario, held.cells, held.servers, KEEP_WITHIN)
        if kept is fresh:
            return fresh
        model = ThroughputModel(snap.scenario, max_staleness=run.max_staleness)
        try:
            fresh_tps = model.evaluate(fresh).effective_tokens_per_s
            prediction = model.evaluate(kept)
        except (ScenarioError, ValueError) as e:
            logger.debug("Cannot weigh keeping the cells in place: %s", e)
            return fresh
        if prediction.effective_tokens_per_s < (1 - KEEP_WITHIN) * fresh_tps:
            return fresh
        logger.info(
            "Keeping the cells and shards in place: %.0f effective tokens/s predicted against %.0f for the plan's own",
            prediction.effective_tokens_per_s,
            fresh_tps,
        )
        return replace(kept, meta={**fresh.meta, "prediction": prediction})

    async def _better_plan(self, view: SwarmView, snap: Snapshot, previous: PlanRecord, now: float) -> bool:
        """Plan afresh on what is measured now; publish it if it is predicted ``REPLAN_GAIN``
        faster than the plan in force is on the same measurements (a first plan is made on
        probes alone, before any data flows; hysteresis keeps plans from flapping with noise)."""
        ids = snap.scenario.ids
        try:
            fresh = await asyncio.to_thread(plan, snap.scenario, self._settings())
            current = record_plan(previous).remapped([ids.index(p) for p in previous.devices])
            model = ThroughputModel(snap.scenario, max_staleness=self.spec.spec.max_staleness)
            now_tps = (await asyncio.to_thread(model.evaluate, current)).effective_tokens_per_s
            new_tps = (await asyncio.to_thread(model.evaluate, fresh)).effective_tokens_per_s
        except (PlanError, ScenarioError, ValueError) as e:
            logger.debug("No fresh plan to compare with: %s", e)
            return False
        finally:
            self._compared_at = now
        if not new_tps > REPLAN_GAIN * now_tps:  # nor when neither is predicted to train at all
            return False
        logger.info(
            "Re-planning on the links measured since: %.0f effective tokens/s predicted against %.0f for plan v%d",
            new_tps,
            now_tps,
            previous.version,
        )
        await self._publish_new(view, snap, fresh, "full", previous, now)
        return True

    def _elect_relays(self, view: SwarmView, devices: list[str], current: list[int], preferred: list[int]) -> list[int]:
        """The plan's relays (indices into ``devices``), elected on the thresholds among the
        planned devices: incumbents kept, the planner's choices (a link is faster through
        them) next (``swarmd.peers.membership.election.elect_relays``)."""
        candidates = [view.candidate(peer) for peer in devices]
        chosen = elect_relays(
            candidates,
            [devices[r] for r in current],
            self.thresholds,
            relays_wanted(len(devices)),
            preferred=[devices[r] for r in preferred],
        )
        return [devices.index(p) for p in chosen]

    async def _publish(self, record: PlanRecord, now: float) -> None:
        fresh = PlanRecord(**{**record.__dict__, "issued_at": now, "expires_at": now + PLAN_TTL_S})
        await self.dht.publish_peer_record(PLAN_KIND, self.own, fresh.sign(self.identity), fresh.expires_at)
        self.published, self._published_at = fresh, now
        self._highest_version = max(self._highest_version, fresh.version)


def record_plan(record: PlanRecord) -> Plan:
    """The planner's ``Plan`` of a published record (device indices into ``record.devices``)."""
    return Plan(
        pipelines=tuple(tuple(row) for row in record.pipelines),
        layers_per_stage=tuple(record.layers_per_stage),
        parameter_servers=tuple(record.parameter_servers),
        relays=tuple(record.relays),
        shard_servers=tuple(tuple(row) for row in record.shard_servers),
        local_steps=record.local_steps,
        share_micro_batches=record.share_micro_batches,
        spares=tuple(record.spares),
        reduce_groups=tuple(record.reduce_groups),
        checkpointing=tuple(record.checkpointing),
    )
