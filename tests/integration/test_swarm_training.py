"""Four daemons train the tiny-llama-bpe preset together, lose a worker to SIGKILL, and learn like
the reference.

The preset is a real run in miniature: a Llama with grouped-query attention, a BPE tokenizer of
1,024 ids, the built-in corpus prepared into token shards. Only the creator (d0) holds the
data: the others fetch the shards their work reads from a member, checked against the
manifest. One run serves every check, because each costs minutes on two cores:

- fault: a daemon that works a cell (and serves no shard, where the plan leaves such a worker;
  else its shard's standby must take it over) is SIGKILLed in the middle of a share. The
  others train on (a spare takes its cell); no shard's version ever goes down (a shard that changes hands resumes
  from its last holder's state); every micro-batch issued before the kill is trained in the
  end (completed, or issued again and recomputed: the ledger's data cursor never leaves a hole
  behind); restarted, the daemon rejoins and gets a cell again.
- data: d1-d3 have no data folder and train on shards fetched from members (none refused),
  and every daemon's status shows the run's held-out loss, which the export prints too.
- correctness: at ``UPDATES`` updates, the swarm's weights (gathered from the running swarm's
  shards and exported with the run's tokenizer) score a held-out loss far below the start and
  no more than ``TOLERANCE_NATS`` above a single-process synchronous reference of the same model,
  tokenizer, data, seed and wire precision after as many updates (equal tokens: an update is one batch in
  either). A daemon alone (a second test) stays within ``ALONE_TOLERANCE_NATS`` of it.

Two daemons send everything through the plan's relay, as peers whose outbound connections
are filtered would: the relay path carries real training.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from swarmd.models.build import build_model
from swarmd.models.data.shard_files import PreparedData, open_prepared
from swarmd.models.lr_schedule import LrSchedule
from swarmd.models.presets import PRESETS, materialize
from swarmd.models.reference import TrainConfig, held_out_loss, reference_steps
from swarmd.models.shape import ModelShape
from swarmd.models.stages import split_layers, stage_parameter_shapes
from swarmd.peers.records.run_spec import run_seed
from swarmd.system.local_swarm import LocalDaemon, create_run, wait_for
from tests.integration.version_watch import VersionWatch, alive, status_of

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

PRESET = PRESETS["tiny-llama-bpe"]
UPDATES = 70
"""Enough updates for a broken stage to show: in the reference
(``tests/benchmarks/bench_frozen_stage.py``, seed 7), a stage whose weights never move ends
+0.85 (stage 0) and +1.18 (stage 1) nats above it at 70 updates, far past ``TOLERANCE_NATS``;
at 50 only +0.34 and +0.74 (the loss sits on a plateau after the warm-up), at 100 +1.29 and
+1.65. 100 updates cost about a minute more of CPU in the suite (30 updates of four
daemons, 30 reference steps)."""
KILL_AT = 30
ALONE_UPDATES = 30
ALONE_TOLERANCE_NATS = 0.01
"""Both ways, for a daemon alone: it runs the swarm's whole data path (ledger, shard servers,
contributions in the run's half with error feedback, their norm bound, fp16 deltas, the hidden
state rounded at the stage cut, the schedule by version) with no membership change to perturb
it, and the reference does that arithmetic too: they score alike to 1e-4 at every version
scored (six runs, three of them in CI). The run's seed comes from its creator's key, so some
runs meet a loss spike whose gradient the shard server clips to its norm bound; before the
reference clipped it too, two CI runs ended 0.065 and 0.133 below it. Two daemons equal the
reference to 1e-4 (each stage at its own version) until the hand-over the second's join causes.
The share dropped there is trained again, on weights one step on, or in another order; on this
miniature model that alone moves the held-out loss as much as reordering two batches of the
reference does: 0.01 to 0.57 nats at 114 to 200 updates over four seeds (docs/results.md). So the
issue's 0.1 is asserted, tighter, where no membership change perturbs the run, and a swarm with
them is held to ``TOLERANCE_NATS``."""
TOLERANCE_NATS = 0.4
"""How much worse than the reference the swarm may end. Gradient mode is synchronous SGD over
the pipelines (docs/data-path.md): each update averages one batch computed on the newest
weights, as the reference's does, and the reference rounds the hidden state to the run's half
precision where the swarm's stages cut the model (alone, that rounding moves this model's loss
by up to 0.17 nats at 100 updates). A daemon alone stays within 0.01 of it (``ALONE_TOLERANCE_NATS``); every
membership change perturbs it (see there). Around a kill the swarm is not synchronous for a while: a round goes on after
``SYNC_WAIT_S``, a contribution up to ``max_staleness`` versions old counts in full, a share is
recomputed into another batch. On this model, steep at 100 updates, 13 runs with the kill
ended -0.23 to +0.33 nats from the reference (-0.231, -0.192, -0.143, -0.055, -0.045, -0.041,
-0.004, +0.011, +0.043, +0.061, +0.133, +0.237, +0.326); at 70 updates (the kill at 30), six
runs ended -0.059 to +0.002 (-0.059, -0.007, -0.001, -0.001, -0.000, +0.002); at 50 (the kill
at 20), seven ended -0.058 to +0.159. One run against another, at one seed, this test cannot
price anything finer than that, so it bounds what a broken data path costs (a stage that stops
learning: ``UPDATES``; one that learns from a held-out sequence ends far below) and the paired
benchmarks price the rest."""
POLL_S = 0.5
"""How often a wait reads the daemons' status. Every poll asks each daemon for its whole
status; at ``wait_for``'s 0.1 s default that was 40 status calls a second on top of the
``VersionWatch``'s 8, CPU the training waited on (an idle daemon's status costs it 1.5 ms)."""
BETTER_BOUND_NATS = 0.4
"""Ending further below the reference than this would mean the swarm learned from what the
reference never saw (a held-out sequence, a micro-batch counted twice)."""


def training(daemon: LocalDaemon) -> dict[str, Any]:
    return status_of(daemon).get("training") or {}


def print_training(daemons: list[LocalDaemon]) -> None:
    """What a loss gap is read against: each cell's shares, drops and sync timeouts, each shard's
    version, staleness histogram and contributions, and the ledger."""
    for i, t in enumerate(map(training, daemons)):
        cells = [
            (c["pipeline"], c["stage"], c["shares"], c["abandoned"], c["dropped_rounds"], c["sync_timeouts"])
            for c in t.get("cells") or []
        ]
        shards = [
            (s["stage"], s["shard"], s["version"], s["staleness"], s["contributions"], s["dropped_stale"])
            + ((s["aggregation"], s["centre_clipped"], s["distrusted"]) if s["aggregation"] != "mean" else ())
            for s in t.get("shards") or []
        ]
        print(f"d{i}: cells (p, s, shares, abandoned, dropped, sync timeouts) {cells}")
        print(f"d{i}: shards (stage, shard, version, staleness, contributions, dropped stale) {shards}")
    print("ledger:", ledger(daemons))


def updates(daemons: list[LocalDaemon]) -> int:
    return max((training(d).get("updates") or 0 for d in daemons if alive(d)), default=0)


def relayed(daemons: list[LocalDaemon]) -> int:
    """Requests the daemons told to relay (d2, d3) sent through the relay so far."""
    return sum(((d.status() or {}).get("routes") or {}).get("relayed", 0) for d in daemons[2:] if alive(d))


def forwarded(daemons: list[LocalDaemon]) -> int:
    """Requests the relays forwarded so far (a relay's count restarts with it)."""
    return sum(((d.status() or {}).get("relaying") or {}).get("forwarded", 0) for d in daemons if alive(d))


def ledger(daemons: list[LocalDaemon]) -> dict[str, Any]:
    found = [t["ledger"] for d in daemons if alive(d) and (t := training(d)).get("ledger")]
    return found[0] if found else {}


@dataclass(frozen=True)
class PresetRun:
    folder: Path
    """The run's prepared files (``files``) and its creator's state directory (``creator``)."""
    run_id: str
    prepared: PreparedData
    """The run's token shards, read in this process (the reference's data, the held-out split)."""

    def creator_in(self, workdir: Path) -> Path:
        """A fresh state directory for d0 with the creator's key and the run's spec."""
        return Path(shutil.copytree(self.folder / "creator", workdir / "d0"))


@pytest.fixture(scope="module")
def preset_run() -> Iterator[PresetRun]:
    """The preset's run, created once (d0 of each test holds the data), with the mean, as the
    reference steps: these tests measure that the swarm computes the synchronous algorithm. An
    open run's default, centred clipping, deliberately steps otherwise; what it costs is
    measured paired, in the swarm's own code (tests/benchmarks/bench_robust_swarm.py). One run
    for both tests: its seed comes from the creator's key, so they share one reference
    training (``REFERENCE``)."""
    folder = Path(tempfile.mkdtemp(prefix="swd-preset-", dir="/tmp"))
    spec_path = materialize(PRESET, folder / "files")
    spec = json.loads(spec_path.read_text())
    spec["exchange"] = {**spec.get("exchange", {}), "aggregation": "mean"}
    spec_path.write_text(json.dumps(spec))
    run_id = create_run(folder / "creator", spec_path)
    seq_len = ModelShape.from_dict(PRESET.spec["model"]).seq_len
    prepared = open_prepared(folder / "files" / "data", seq_len, run_seed(run_id))
    yield PresetRun(folder, run_id, prepared)
    prepared.close()
    shutil.rmtree(folder, ignore_errors=True)


class SharedReference:
    """The reference's weights after given step counts, trained once in this process for the
    run and settings asked for, and taken further when a later test needs more steps (the alone
    test's 30, then the four daemons' 70: 30 steps, about 15 s of a core, not trained twice)."""

    def __init__(self) -> None:
        self._key: tuple[Any, ...] | None = None
        self._steps: Iterator[tuple[int, torch.nn.Module, Any]] | None = None
        self._taken = -1
        self._kept: dict[int, dict[str, torch.Tensor]] = {}

    def weights(
        self, shape: ModelShape, train: Any, settings: TrainConfig, wanted: list[int]
    ) -> dict[int, dict[str, torch.Tensor]]:
        key = (shape, settings)
        if key != self._key or any(v <= self._taken and v not in self._kept for v in wanted):
            self._key, self._taken, self._kept = key, -1, {}
            self._steps = reference_steps(shape, train, settings)
        assert self._steps is not None
        while self._taken < max(wanted):
            self._taken, model, _ = next(self._steps)
            if self._taken in wanted:
                self._kept[self._taken] = {name: t.detach().clone() for name, t in model.state_dict().items()}
        return {v: self._kept[v] for v in wanted}


REFERENCE = SharedReference()
REFERENCE_STEPS = 10**6
"""As many steps as the reference may be taken to: ``SharedReference`` stops where it is asked."""


def test_a_daemon_alone_trains_exactly_as_the_reference(
    workdir: Path, daemon_factory: Callable[..., LocalDaemon], preset_run: PresetRun
) -> None:
    """The data path's arithmetic is the reference's: see ``ALONE_TOLERANCE_NATS``."""
    run_id = preset_run.run_id
    daemon = daemon_factory(preset_run.creator_in(workdir), run_id, train=True, full_speed=True)
    daemon.start().wait_running()
    wait_for(lambda: updates([daemon]) >= ALONE_UPDATES, 300, f"{ALONE_UPDATES} updates", POLL_S)
    print_training([daemon])
    exported = workdir / "exported"
    versions, printed_loss = _export(daemon, exported)
    assert daemon.stop(timeout=60) == 0, daemon.log_tail()
    gap = _gap_to_reference(preset_run, exported, versions, printed_loss, learned_nats=0.5)
    assert -ALONE_TOLERANCE_NATS < gap < ALONE_TOLERANCE_NATS, gap


def test_four_daemons_train_like_the_reference_through_a_killed_worker(
    workdir: Path, daemon_factory: Callable[..., LocalDaemon], preset_run: PresetRun
) -> None:
    run_id = preset_run.run_id
    via_relay = ["--data-via-relay", "always"]
    folders = [preset_run.creator_in(workdir), *(workdir / f"d{i}" for i in range(1, 4))]
    daemons = [
        daemon_factory(folder, run_id, via_relay if i >= 2 else None, train=True, full_speed=True)
        for i, folder in enumerate(folders)
    ]
    addrs = daemons[0].start().wait_running()["addrs"]
    for daemon in daemons[1:]:
        daemon.start(addrs)
    for daemon in daemons:
        daemon.wait_running()
    wait_for(lambda: all(len(d.seen_peers()) == 3 for d in daemons), 60, "every daemon to see the other three", POLL_S)

    def cells_and_shards() -> list[tuple[int, int]]:
        return [(len(t.get("cells") or []), len(t.get("shards") or [])) for t in map(training, daemons)]

    started = time.monotonic()
    with VersionWatch(daemons, via_relay={2, 3}) as watch:
        wait_for(lambda: updates(daemons) >= KILL_AT, 300, f"{KILL_AT} updates", POLL_S)

        # The victim works a cell, and serves no shard if the plan left such a worker; else it
        # serves one too, and its standby must take the shard over with every committed step.
        # Not d0: it alone holds the data the others fetch (a real run has mirrors besides).
        def victim_of() -> LocalDaemon | None:
            found = [(s, d) for d, (c, s) in zip(daemons[1:], cells_and_shards()[1:], strict=True) if c]
            return min(found, key=lambda pair: pair[0])[1] if found else None

        victim = wait_for(victim_of, 120, "a daemon that works a cell", POLL_S)
        relayed_before = relayed(daemons)  # the victim's own counts go with it (it may be the relay)
        forwarded_before = forwarded(daemons)
        cursor = ledger(daemons)["cursor"]
        watch.note(f"SIGKILL d{daemons.index(victim)}")
        victim.kill()  # SIGKILL: no goodbye; its share in flight and its round's gradient are lost with it
        killed_at = updates(daemons)
        wait_for(lambda: updates(daemons) >= killed_at + 10, 180, "training to go on after the kill", POLL_S)
        # Every micro-batch issued before the kill is trained: none is skipped.
        wait_for(
            lambda: ledger(daemons).get("done_below", 0) >= cursor,
            180,
            f"every micro-batch below the kill's cursor {cursor} to be trained",
            POLL_S,
        )
        # Restarted, it rejoins and gets a cell (or stands by as a spare, if the plan says so).
        others = next(d for d in daemons if d is not victim and alive(d)).status() or {}
        watch.note(f"restart d{daemons.index(victim)}")
        victim.start(others["addrs"])  # (it may have been the first: join through another)
        victim.wait_running()
        wait_for(lambda: updates(daemons) >= UPDATES, 600, f"{UPDATES} updates", POLL_S)
        print(f"\n{UPDATES} updates in {time.monotonic() - started:.0f} s, a kill and a restart included")
        print_training(daemons)
        routes = [(d.status() or {}).get("routes") or {} for d in daemons]
        relaying = [(d.status() or {}).get("relaying") or {} for d in daemons]
        print("routes:", routes, "\nrelaying:", relaying, "\nforwarded before the kill:", forwarded_before)
        # The daemons told to use the plan's relay did (one of them may be the relay itself,
        # which goes direct), and it forwarded their requests, whenever the placement gave them
        # a peer other than the relay to send to.
        print("the placement needed the relay:", watch.relay_needed)
        print("a shard served twice at once (committed versions):", watch.served_twice[:10])
        if watch.relay_needed:
            assert relayed_before + relayed(daemons) > 0 and forwarded_before + forwarded(daemons) > 0
        # Every daemon but d0 trained on shards fetched from members; every status shows the
        # run's held-out loss, scored at shard (0, 0)'s holder and carried in its heartbeats.
        data = [(d.status() or {}).get("data") or {} for d in daemons]
        print("data:", [(x.get("holds"), x.get("fetch"), x.get("serve")) for x in data])
        assert data[0]["holds"][:1] == ["dataset"] and all(x["fetch"]["refused"] == 0 for x in data)
        assert sum(x["fetch"]["fetched_files"].get("member", 0) for x in data[1:]) >= 3
        wait_for(
            lambda: all(training(d).get("held_out") for d in daemons),
            60,
            "every status to show a held-out loss",
            POLL_S,
        )
        # The swarm's weights as they stand: every stage gathered from its shards by a running
        # daemon and exported (what a user does at the end of a run).
        exported = workdir / "exported"
        versions, printed_loss = _export(daemons[0], exported)
    assert not watch.decreases, f"a shard's version went down: {watch.decreases}; the logs:\n{watch.story()}"
    for daemon in daemons:
        assert daemon.stop(timeout=60) == 0, daemon.log_tail()

    gap = _gap_to_reference(preset_run, exported, versions, printed_loss)
    assert -BETTER_BOUND_NATS < gap < TOLERANCE_NATS, gap
    tokenizer = AutoTokenizer.from_pretrained(exported)  # the run's BPE, exported beside the weights
    assert tokenizer.eos_token == "<|endoftext|>" and len(tokenizer) == 1024


def _gap_to_reference(
    run: PresetRun, exported: Path, versions: list[int], printed_loss: float, learned_nats: float = 1.2
) -> float:
    """The exported swarm's held-out loss less the reference's: the same model, tokenizer, data
    and seed, trained synchronously in this process, each stage's weights taken after as many
    updates as that stage of the swarm had made (an export reads the stages one after another,
    a step apart at times: a stage one update on is worth about 0.01 nats here). Checks that
    the swarm learned."""
    shape = ModelShape.from_dict(PRESET.spec["model"])
    seed = run_seed(run.run_id)
    train, held_out = run.prepared.train, run.prepared.validation
    assert held_out is not None
    mb, batch = PRESET.spec["batch"]["micro_batch"], PRESET.spec["batch"]["sequences"]
    opt = PRESET.spec["optimizer"]
    settings = TrainConfig(
        seed=seed,
        steps=REFERENCE_STEPS,
        batch_sequences=batch,
        micro_batch=mb,
        lr=opt["lr"],
        weight_decay=opt["weight_decay"],
        schedule=LrSchedule(opt["lr"], opt.get("warmup_steps", 0), opt.get("decay_steps", 0)),
        stages=PRESET.spec["stages"],
        wire=shape.wire_half,
        contribution=shape.wire_half,
        fp16_deltas=True,
        norm_bound=True,
    )
    kept = REFERENCE.weights(shape, train, settings, versions)
    ranges = tuple(split_layers(shape.layers, len(versions)))
    reference_weights = dict(kept[min(versions)])
    for stage, version in enumerate(versions):
        for name, _ in stage_parameter_shapes(shape, ranges, stage):
            reference_weights[name] = kept[version][name]
    start_model = build_model(shape, seed)
    start = held_out_loss(start_model, held_out)
    start_model.load_state_dict(reference_weights)
    ref_end = held_out_loss(start_model, held_out)
    swarm_end = held_out_loss(AutoModelForCausalLM.from_pretrained(exported), held_out)
    print(
        f"held-out loss: start {start:.3f}; after {versions} updates (by stage) swarm {swarm_end:.3f} "
        f"(export printed {printed_loss:.3f}), reference {ref_end:.3f}, gap {swarm_end - ref_end:+.3f}"
    )
    assert swarm_end < start - learned_nats, (start, swarm_end)
    return swarm_end - ref_end


def _export(daemon: LocalDaemon, out: Path) -> tuple[list[int], float]:
    """``swarmd export`` against a running daemon; returns the exported stages' weight versions
    and the held-out loss it printed."""
    printed = daemon.export(out)
    versions = [int(v) for v in printed.split("versions [")[1].split("]")[0].split(",")]
    return versions, float(printed.split("held-out loss ")[1].split()[0])
