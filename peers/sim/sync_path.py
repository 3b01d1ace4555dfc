"""The baselines' own data paths, synchronous as their papers publish them.

A compute phase, then ring all-reduces (``swarmd.peers.sim.allreduce``), then every replica
steps at once.

- **DT-FM** (Yuan et al., NeurIPS 2022): the plan's pipelines run 1F1B on ``k = ceil(B / N)``
  micro-batches each a step (``exchange.share_seconds``, the boundaries' bytes as flows), then
  each stage's group all-reduces its gradients. A departure aborts the step in flight (its work
  is lost); the swarm waits for a new plan (DT-FM re-plans from scratch on every change, a join
  too, which aborts the step as well), its new members fetch their stage's weights and
  optimizer state from a member that has them, and the step starts again.
- **SWARM** (Ryabinin et al., ICML 2023): stages of peers; each step's batch crosses them by
  stochastic wiring, every micro-batch to a peer of the next stage drawn in proportion to its
  throughput. So a stage computes as fast as its peers together and each peer's share of the
  activations goes to a peer drawn afresh each step; then each stage all-reduces. A departed
  peer's micro-batches go to the others of its stage (the step goes on, longer); an all-reduce
  it was in is redone without it once it is noticed. A new plan is taken at the next step.
- **DiLoCo** (Douillard et al., 2023): every device that holds the model alone is a replica
  (one stage); each runs H inner steps of ``k = ceil(B / N)`` micro-batches, then all replicas
  all-reduce their pseudo-gradients and take the outer step. A replica that leaves loses its
  round; the others wait at the all-reduce until its departure is noticed, and go on without
  it. New replicas fetch the model and join at the next round.

Gradients and pseudo-gradients are all-reduced in fp16; a new member fetches fp32 weights and
the two AdamW moments. Trained tokens count the micro-batches of committed steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from swarmd.peers.planning.plan_cost import Plan, stage_parameters
from swarmd.peers.sim.allreduce import all_reduce
from swarmd.peers.sim.results import PathFigures
from swarmd.peers.sim.timing import pipeline_timing
from swarmd.peers.sim.workload import Workload
from swarmd.peers.taskpool.exchange import share_seconds
from swarmd.peers.wire.sizes import message_bytes

if TYPE_CHECKING:
    from swarmd.peers.sim.world import World

DILOCO_INNER_STEPS = 500
"""H of DiLoCo's experiments (Douillard et al. 2023)."""
STATE_FLOATS_PER_PARAM = 3
"""What a new member fetches: fp32 weights and AdamW's two moments."""


@dataclass(frozen=True)
class Policy:
    name: str
    wiring: bool
    """SWARM's stochastic wiring instead of the plan's fixed pipelines."""
    on_departure: str
    """abort (the step is lost), reroute (the others take its work) or drop (its round is lost)."""
    local_steps: int


POLICIES = {
    "dtfm": Policy("dtfm", wiring=False, on_departure="abort", local_steps=1),
    "swarm": Policy("swarm", wiring=True, on_departure="reroute", local_steps=1),
    "diloco": Policy("diloco", wiring=False, on_departure="drop", local_steps=DILOCO_INNER_STEPS),
}


class StateCopy(NamedTuple):
    """A ``stage``'s weights and optimizer state on their way to new member ``device``,
    asked for at ``asked``."""

    device: int
    stage: int
    asked: float


@dataclass(eq=False)
class RowJoin:
    """A row's compute in flight: the parts (its schedule, its boundaries' flows) still to
    finish, and when the row ends once they have."""

    left: int
    end: float
    row: tuple[int, ...] | None
    """None: SWARM's stages together."""


class RowPart(NamedTuple):
    """One part of a row's compute of step ``epoch`` done; ``tail``: once a boundary's flow
    is in, the last micro-batch's way on."""

    join: RowJoin
    epoch: int
    tail: float


class RowDone(NamedTuple):
    """A row of step ``epoch`` is through (None: one left the step, or SWARM's stages
    together)."""

    epoch: int
    row: tuple[int, ...] | None


class Reduced(NamedTuple):
    """A stage's all-reduce of step ``epoch`` is done."""

    epoch: int


class SyncPath:
    def __init__(self, world: World, policy: Policy, plan: Plan) -> None:
        """Start on the first plan, at time 0, every peer with the seeded weights."""
        self.world, self.policy = world, policy
        sc = world.scenario
        self.rng = np.random.default_rng([world.settings.seed, 2])
        self.grid: list[tuple[int, ...]] = []
        self.holds: dict[int, int] = {}  # device -> the stage whose weights it holds
        self.loading: dict[int, int] = {}
        self.phase = "idle"  # idle, compute or reduce
        self.epoch = 0
        self.step_rows: list[tuple[int, ...]] = []
        self.left = 0
        self.started = 0.0
        self.reduce_started = 0.0
        self.expected = 0.0
        self.k = 1
        self.step_mb = 0
        self.since_checkpoint = 0
        self.aborted = 0
        self.lost_mb = 0
        self.layers = plan.layers_per_stage
        self.workload = Workload.of(sc, self.layers, (1,) * len(self.layers))
        params = stage_parameters(sc, self.layers)
        self.stage_bytes = [message_bytes(p, "fp16") for p in params]
        self.state_bytes = [message_bytes(STATE_FLOATS_PER_PARAM * p, "fp32") for p in params]
        self.batch = max(1, sc.batch_sequences // sc.micro_batch)
        self._set_grid(0.0, plan.pipelines, seeded=True)
        self.start_step(0.0)

    # --- the hooks ----------------------------------------------------------------------------

    def follow(self, now: float, plan: Plan) -> None:
        if len(plan.layers_per_stage) != len(self.layers):
            return
        if tuple(plan.pipelines) == tuple(self.grid):
            return
        if self.policy.on_departure == "abort" and self.phase != "idle":
            self._abort()  # a synchronous pipeline cannot change shape in the middle of a step
        self._set_grid(now, plan.pipelines)
        self.start_step(now)

    def assignment(self) -> Plan:
        return Plan(
            pipelines=tuple(self.grid),
            layers_per_stage=self.layers,
            parameter_servers=tuple(self.grid[0]) if self.grid else (0,) * len(self.layers),
        )

    def departed(self, now: float, device: int) -> None:
        self.holds.pop(device, None)
        self.loading.pop(device, None)
        if self.phase == "idle" or not any(device in row for row in self.step_rows):
            return
        how = self.policy.on_departure
        if how == "abort":
            self._abort()
        elif self.phase == "compute" and how == "drop":
            row = next(r for r in self.step_rows if device in r)
            self.step_rows.remove(row)
            lost = self.k * self.policy.local_steps
            self.step_mb -= lost
            self._lose(lost)
            self._row_done(now, RowDone(self.epoch, None))  # the round goes on without it
        elif self.phase == "compute":  # reroute: the rest of the step on the live peers
            done = min(1.0, (now - self.started) / self.expected) if self.expected > 0 else 0.0
            self.world.counts["rerouted"] += 1
            self._compute(now, self._without(device), 1.0 - done)
        # In an all-reduce the ring waits; it is redone without the member once it is noticed.

    def noticed_departure(self, now: float, device: int) -> None:
        if self.phase == "reduce" and any(device in row for row in self.step_rows):
            self.step_rows = self._without(device)
            if not self.step_rows:
                self._abort()
                return
            self._reduce(now)

    def _without(self, device: int) -> list[tuple[int, ...]]:
        """The step's rows without ``device``: SWARM keeps the rest of its row (its stage's
        peers serve each other); a pipeline or a replica without it is out of the step."""
        if self.policy.wiring:
            return [tuple(-1 if d == device else d for d in row) for row in self.step_rows]
        return [row for row in self.step_rows if device not in row]

    def planned(self, device: int) -> bool:
        return any(device in row for row in self.grid)

    def roles(self) -> dict[int, list[str]]:
        return {d: [f"stage {s}"] for row in self.grid for s, d in enumerate(row)}

    def figures(self) -> PathFigures:
        return PathFigures(
            shards=(),
            local_steps=self.policy.local_steps,
            share_micro_batches=self.k,
            shares_recomputed=self.aborted,
            micro_batches_recomputed=self.lost_mb,
            pipelines=len(self.grid),
            tokens_per_micro_batch=self.workload.tokens_per_micro_batch,
        )

    # --- membership ---------------------------------------------------------------------------

    def _set_grid(self, now: float, rows: tuple[tuple[int, ...], ...], seeded: bool = False) -> None:
        self.grid = [tuple(r) for r in rows]
        self.k = max(1, math.ceil(self.batch / max(1, len(self.grid))))
        for row in self.grid:
            for s, d in enumerate(row):
                if self.holds.get(d) == s or self.loading.get(d) == s:
                    continue
                if seeded:
                    self.holds[d] = s
                else:
                    self._load(now, d, s)

    def _load(self, now: float, device: int, stage: int) -> None:
        """A new member fetches its stage's weights and optimizer state from one that has them."""
        world = self.world
        self.holds.pop(device, None)
        sources = [d for d, s in self.holds.items() if s == stage and world.up[d]]
        if not sources:  # nobody holds the stage: back to the last checkpoint
            world.counts["updates_lost"] += self.since_checkpoint
            self.since_checkpoint = 0
            self.holds[device] = stage
            return
        source = min(sources, key=lambda d: float(world.scenario.latency_s[d, device]))
        self.loading[device] = stage
        world.engine.send(now, source, device, self.state_bytes[stage], self._loaded, StateCopy(device, stage, now))

    def _loaded(self, now: float, copy: StateCopy) -> None:
        device, stage = copy.device, copy.stage
        if self.loading.get(device) != stage:
            return
        del self.loading[device]
        self.holds[device] = stage
        self.world.phases.add("weights", now - copy.asked)
        self.start_step(now)

    def _ready(self, row: tuple[int, ...]) -> bool:
        return all(self.world.up[d] and self.holds.get(d) == s for s, d in enumerate(row))

    # --- the step -----------------------------------------------------------------------------

    def start_step(self, now: float) -> None:
        if self.phase != "idle":
            return
        rows = [row for row in self.grid if self._ready(row)]
        if self.policy.on_departure == "abort" and len(rows) < len(self.grid):
            return  # every pipeline of a synchronous step must be there
        if not rows:
            return
        self.step_rows = rows
        self.step_mb = self.batch if self.policy.wiring else len(rows) * self.k * self.policy.local_steps
        self.started = now
        self._compute(now, rows, 1.0)

    def _compute(self, now: float, rows: list[tuple[int, ...]], fraction: float) -> None:
        """The step's compute (``fraction`` of it) on ``rows``: each row a pipeline, or with
        SWARM's wiring the stages' peers together."""
        self.epoch += 1
        self.phase = "compute"
        self.step_rows = rows
        world, epoch = self.world, self.epoch
        if self.policy.wiring:
            self.left = 1
            self.expected = self._wired(now, rows, fraction)
            return
        self.left = len(rows)
        micro = max(1, round(self.k * self.policy.local_steps * fraction))
        longest = 0.0
        for row in rows:
            t = pipeline_timing(world, self.workload, row)
            compute = max(share_seconds(t.forward_s, t.backward_s, t.send_s, micro), micro * t.floor_s)
            longest = max(longest, compute)
            join = RowJoin(1 + 2 * len(t.send_s), now + compute, row)
            world.engine.at(now + compute, self._part, RowPart(join, epoch, 0.0))
            for b, (nbytes, via) in enumerate(zip(t.nbytes, t.via, strict=True)):
                a, c = row[b], row[b + 1]
                world.engine.stream(now, a, c, micro * nbytes, self._part, RowPart(join, epoch, t.tail_forward[b]), via)
                world.engine.stream(
                    now, c, a, micro * nbytes, self._part, RowPart(join, epoch, t.tail_backward[b]), via
                )
        self.expected = longest

    def _wired(self, now: float, rows: list[tuple[int, ...]], fraction: float) -> float:
        """SWARM: each stage's live peers as one at their summed speed; every peer sends its
        share of the activations to a peer of the next stage drawn by throughput."""
        world, w = self.world, self.workload
        stages = len(self.layers)
        groups = self._groups(rows)
        if not all(groups):
            self._abort()  # a stage with nobody left: wait for the next plan
            return 0.0
        speed = [float(world.tflops[g].sum()) for g in groups]
        micro = max(1, round(self.batch * fraction))
        fwd = [w.forward_flops[s] / speed[s] for s in range(stages)]
        bwd = [w.backward_flops[s] / speed[s] for s in range(stages)]
        send, flows = [], []
        for s in range(stages - 1):
            senders, receivers = np.asarray(groups[s]), np.asarray(groups[s + 1])
            weights = world.tflops[receivers] / world.tflops[receivers].sum()
            drawn = receivers[self.rng.choice(len(receivers), size=len(senders), p=weights)]
            rates = np.array([float(world.scenario.bandwidth_Bps[a, b]) for a, b in zip(senders, drawn, strict=True)])
            act = w.activation_bytes(float(np.median(rates)))
            send.append(float(np.median(world.scenario.latency_s[senders, drawn])) + act / rates.sum())
            share = world.tflops[senders] / world.tflops[senders].sum()
            flows += [(int(a), int(b), micro * act * float(f)) for a, b, f in zip(senders, drawn, share, strict=True)]
        compute = share_seconds(fwd, bwd, send, micro)
        join = RowJoin(1 + 2 * len(flows), now + compute, None)
        world.engine.at(now + compute, self._part, RowPart(join, self.epoch, 0.0))
        for a, b, nbytes in flows:
            world.engine.stream(now, a, b, nbytes, self._part, RowPart(join, self.epoch, bwd[-1]), None)
            world.engine.stream(now, b, a, nbytes, self._part, RowPart(join, self.epoch, bwd[0]), None)
        return compute

    def _part(self, now: float, part: RowPart) -> None:
        """One part of a row's compute (its schedule, or a boundary's flow) is done."""
        if part.epoch != self.epoch:
            return
        join = part.join
        join.left -= 1
        join.end = max(join.end, now + part.tail)
        if join.left == 0:
            self.world.engine.at(max(now, join.end), self._row_done, RowDone(part.epoch, join.row))

    def _row_done(self, now: float, done: RowDone) -> None:
        row = done.row
        if done.epoch != self.epoch or self.phase != "compute":
            return
        if row is not None and row not in self.step_rows:
            return  # it left the step (DiLoCo: a replica that departed)
        self.left -= 1
        if self.left > 0:
            return
        if not self.step_rows:
            self._abort()
            return
        self.world.phases.add("step_compute", now - self.started)
        self._reduce(now)

    def _groups(self, rows: list[tuple[int, ...]]) -> list[list[int]]:
        return [sorted({row[s] for row in rows if row[s] >= 0}) for s in range(len(self.layers))]

    def _reduce(self, now: float) -> None:
        """Each stage's members all-reduce their gradients (DiLoCo: their pseudo-gradients)."""
        self.epoch += 1
        self.phase = "reduce"
        self.reduce_started = now
        groups = self._groups(self.step_rows)
        self.left = len(groups)
        for s, group in enumerate(groups):
            all_reduce(self.world, now, group, self.stage_bytes[s], self._reduced, Reduced(self.epoch))

    def _reduced(self, now: float, done: Reduced) -> None:
        if done.epoch != self.epoch or self.phase != "reduce":
            return
        self.left -= 1
        if self.left > 0:
            return
        world = self.world
        world.phases.add("all_reduce", now - self.reduce_started)
        world.phases.add("step", now - self.started)
        world.staleness[0] += 1
        world.trained(now, self.step_mb, 1)
        self.since_checkpoint = (self.since_checkpoint + 1) % world.settings.checkpoint_every
        self.phase = "idle"
        self.start_step(now)

    def _abort(self) -> None:
        self.aborted += 1
        self._lose(self.step_mb)
        self.epoch += 1
        self.phase = "idle"

    def _lose(self, micro_batches: int) -> None:
        self.lost_mb += micro_batches
