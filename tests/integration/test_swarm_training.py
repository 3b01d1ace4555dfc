"""Four daemons train the default run together, lose a worker to SIGKILL, and learn like the reference.

One run serves both checks of issue 3, because each costs minutes on two cores:

- fault: at 60 updates a daemon that hosts no stage is SIGKILLed while it holds leases. The
  others train on; every parameter-server version only grows; every task handed out is
  completed, re-queued or still leased (the queue counters balance); the killed worker's
  leases come back to the queue; every micro-batch below stage 0's data cursor has its loss
  recorded at the last stage (none vanished); restarted, the daemon rejoins and gets work.
- correctness: at 200+ updates, the swarm's weights (exported from the running swarm) score
  a held-out loss far below the start and within ``TOLERANCE_NATS`` of a single-process
  synchronous reference of the same model, data and seed after as many updates (equal tokens).
"""

from __future__ import annotations

import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoModelForCausalLM

from swarmd.local_swarm import LocalDaemon, wait_for
from swarmd.models.build import build_model
from swarmd.models.corpus import load_corpus, train_eval_split
from swarmd.models.presets import DEFAULT_RUN
from swarmd.models.reference import TrainSettings, held_out_loss, train_reference
from swarmd.models.shape import ModelShape
from swarmd.peers.run_spec import run_seed

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

UPDATES = 200
KILL_AT = 60
# Asynchronous updates (gradients 1-2 versions stale: stage 0 may start one batch ahead of the
# one its server is summing) learn slower per token than the synchronous reference, and more
# so the busier the machine (more staleness). Judged on held-out data with each side's own
# weights after the same number of updates, this much (nats) is what we accept: measured 0.09,
# 0.11, 0.37, 0.40 and 0.46 in five runs on two cores shared with other work (start 5.53-5.58,
# reference 2.0-2.15), then with two daemons' requests relayed 0.34, 0.20, 0.15 (one core kept
# busy beside it) and once 0.89 in CI; on 2026-12-01, alone on the machine, 1.10, 0.89 and
# 0.35 with that day's daemon and 0.84 with the previous day's, whose runs had measured
# 0.14-0.23 (the spread is the machine's and the asynchrony's, not a change's: the printed
# staleness shows it); a swarm that learned nothing would sit near the start, 3.4 above the
# reference. The training
# losses the last stage records are a worse yardstick: each comes from a forward through
# stage 0 weights a version or two older than the stage 1 weights it meets, and their gap
# ranged 0.10-0.58 over nine runs. A synchronous pipeline (batches_ahead 0) tracks the
# reference within 0.02 (tests/unit/test_stage_hosts.py) but ran 4x slower here.
TOLERANCE_NATS = 1.5


def training(daemon: LocalDaemon) -> dict[str, Any]:
    status = daemon.status()
    return (status or {}).get("training") or {}


class VersionWatch:
    """Samples every stage's parameter-server version from its host, and records any decrease;
    and gathers the losses every host of the last stage recorded (the stage can change hands
    and come back: no single host's list need hold every micro-batch)."""

    def __init__(self, daemons: list[LocalDaemon]) -> None:
        self.daemons = daemons
        self.highest: dict[int, int] = {}
        self.decreases: list[str] = []
        self.losses: dict[int, float] = {}
        self._lock = threading.Lock()  # the test's thread samples too: one sample at a time
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> VersionWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        self.sample()

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            self.sample()

    def sample(self) -> None:
        with self._lock:
            self._sample_each()

    def _sample_each(self) -> None:
        for daemon in self.daemons:
            if daemon.proc is None or daemon.proc.poll() is not None:
                continue
            try:
                status = training(daemon)
            except Exception:  # a daemon frozen, killed or restarting: not a version
                continue
            for m, loss in status.get("losses") or []:
                self.losses.setdefault(m, loss)
            hosts = status.get("hosts") or {}
            for stage, host in hosts.items():
                s, v = int(stage), host["version"]
                if v < self.highest.get(s, 0):
                    self.decreases.append(f"stage {s}: {self.highest[s]} -> {v}")
                self.highest[s] = max(v, self.highest.get(s, 0))


def hosts_of(daemons: list[LocalDaemon]) -> dict[int, tuple[LocalDaemon, dict[str, Any]]]:
    found = {}
    for daemon in daemons:
        if daemon.proc is not None and daemon.proc.poll() is None:
            for stage, info in (training(daemon).get("hosts") or {}).items():
                found[int(stage)] = (daemon, info)
    return found


def updates(daemons: list[LocalDaemon]) -> int:
    hosts = hosts_of(daemons)
    return min(info["version"] for _, info in hosts.values()) if len(hosts) == 2 else 0


def test_four_daemons_train_like_the_reference_through_a_killed_worker(
    workdir: Path, make_run: Callable[..., str], daemon_factory: Callable[..., LocalDaemon]
) -> None:
    run_id = make_run(workdir / "d0")
    # Two of them send their requests through the plan's relay whenever it names one (as peers
    # whose outbound connections are filtered would): the relay path carries real training.
    via_relay = ["--data-via-relay", "always"]
    daemons = [daemon_factory(workdir / f"d{i}", run_id, via_relay if i >= 2 else None, train=True) for i in range(4)]
    addrs = daemons[0].start().wait_running()["addrs"]
    for daemon in daemons[1:]:
        daemon.start(addrs)
    ids = [d.wait_running()["peer_id"] for d in daemons]
    wait_for(lambda: all(len(d.seen_peers()) == 3 for d in daemons), 60, "every daemon to see the other three")
    # Two stages, four trainers: two daemons host one stage each, and all four work.
    wait_for(lambda: len({d.status()["peer_id"] for d, _ in hosts_of(daemons).values()}) == 2, 60,
             "the two stages to be hosted by two different daemons")  # fmt: skip

    started = time.monotonic()
    with VersionWatch(daemons) as watch:
        wait_for(lambda: updates(daemons) >= KILL_AT, 300, f"{KILL_AT} updates")
        hosting = {ids.index(d.status()["peer_id"]) for d, _ in hosts_of(daemons).values()}
        victim_index = max(set(range(4)) - hosting)
        victim, victim_id = daemons[victim_index], ids[victim_index]
        assert sum(training(victim)["worker"]["tasks"].values()) > 0, "every daemon works, hosts or not"

        def victim_leases() -> int:
            return sum(info["leases_by_worker"].get(victim_id, 0) for _, info in hosts_of(daemons).values())

        def frozen_holding_leases() -> int:
            """Freeze the victim (SIGSTOP); keep it frozen if it holds leases, else let it go on."""
            os.kill(victim.pid, signal.SIGSTOP)
            # Requests it sent before freezing may still be in the hosts' hands (a push waits
            # for the standby's log): read until two readings half a second apart agree.
            readings = [victim_leases()]
            while len(readings) < 2 or readings[-1] != readings[-2]:
                time.sleep(0.5)  # sync-ok: the interval between two readings that must agree
                readings.append(victim_leases())
            if not readings[-1]:
                os.kill(victim.pid, signal.SIGCONT)
            return readings[-1]

        held = wait_for(frozen_holding_leases, 60, "the victim to hold a lease", poll_s=0.05)
        victim.kill()  # SIGKILL: no goodbye, its leases and its unpushed gradients are stranded
        requeued_before = {s: _requeued(info) for s, (_, info) in hosts_of(daemons).items()}
        killed_at = updates(daemons)

        # Its leases come back to the queues (dropped with its membership, or expired) ...
        wait_for(lambda: victim_leases() == 0, 60, "the killed worker's leases to be re-queued")
        requeued = sum(_requeued(info) - requeued_before[s] for s, (_, info) in hosts_of(daemons).items())
        # Each was re-queued, or completed by a push the victim sent before it froze (a host
        # may still have been logging it at the standby); the counters below balance either way.
        print(f"the killed worker held {held} lease(s); {requeued} task(s) re-queued since")
        assert held > 0
        # ... and training goes on without it.
        wait_for(lambda: updates(daemons) >= killed_at + 10, 120, "training to go on after the kill")

        # Restarted, it rejoins and gets work again.
        victim.start(addrs)
        victim.wait_running()
        wait_for(lambda: sum(((training(victim).get("worker") or {}).get("tasks") or {}).values()) >= 3, 120,
                 "the restarted daemon to get work")  # fmt: skip

        wait_for(lambda: updates(daemons) >= UPDATES, 600, f"{UPDATES} updates")
        print(f"\n{UPDATES} updates in {time.monotonic() - started:.0f} s, a kill and a restart included")
        hosts = hosts_of(daemons)
        first_host, last_host = hosts[0][0], hosts[1][0]
        cursor = hosts[0][1]["data_cursor"]

        # Nothing lost: every micro-batch below stage 0's cursor has finished at stage 0, and
        # (once stage 1's re-queued work is done) has its loss recorded at the last stage, by
        # whichever daemon hosted it then, from the first one seen there.
        def seen_at_last_stage() -> set[int]:
            watch.sample()
            return set(watch.losses) | {m for m, _ in training(last_host)["losses"]}

        def all_finished() -> bool:
            seen = seen_at_last_stage()
            return all(m in seen for m in range(min(seen), cursor))

        try:
            wait_for(all_finished, 60, f"every micro-batch below {cursor} to have its loss at the last stage")
        except TimeoutError:
            seen = seen_at_last_stage()
            missing = [m for m in range(min(seen), cursor) if m not in seen]
            print("missing at the last stage:", missing[:20], "of", len(missing))
            for stage, (_, info) in sorted(hosts_of(daemons).items()):
                print(f"stage {stage}: queue {info['queue']}, host {info['host']}, leases {info['leases_by_worker']}")
            for i, daemon in enumerate(daemons):  # why tasks were handed back, from each worker
                failures = [line for line in daemon.log_tail(2000).splitlines() if "failed" in line or "WARN" in line]
                print(f"d{i}:", *failures[-12:], sep="\n  ")
                # ... and every change of hands, with what was carried across it and what was not
                words = ("osting stage", "anding stage", "carr", "epoch change", "refused")
                moves = [line for line in daemon.log_tail(20000).splitlines() if any(w in line for w in words)]
                print(f"d{i} hand-overs:", *moves[-30:], sep="\n  ")
                print(f"d{i} worker:", {k: v for k, v in (training(daemon).get("worker") or {}).items()
                                        if k not in ("requests_by_op", "seconds", "host_versions")})  # fmt: skip
            raise
        for stage, (_, info) in hosts_of(daemons).items():
            q = info["queue"]
            assert q["claimed"] == (q["completed"] + q["requeued_expired"] + q["requeued_failed"]
                                    + q["requeued_worker_gone"] + q["leased"]), (stage, q)  # fmt: skip
            assert q["put"] == q["completed"] + q["outstanding"], (stage, q)
        losses = dict(training(last_host)["losses"])
        servers = {stage: info["server"] for stage, (_, info) in sorted(hosts_of(daemons).items())}
        for stage, (_, info) in sorted(hosts_of(daemons).items()):
            print(f"stage {stage}: server {info['server']}, host {info['host']}")
        routes = [training(d)["routes"] for d in daemons]
        relaying = [d.status()["relaying"] for d in daemons]
        print("routes:", routes, "\nrelaying:", relaying)
        # The plan names one relay; the daemons told to use it did (at most one of them is the
        # relay itself, which goes direct), and it forwarded their requests.
        assert sum(r["relayed"] for r in routes[2:]) > 0 and sum(r["forwarded"] for r in relaying) > 0
        assert first_host is not last_host
        # The swarm's weights as they stand: every stage's newest checkpoint, gathered by a
        # running daemon and exported (what a user does at the end of a run).
        exported = workdir / "exported"
        versions = _export(first_host, run_id, exported)
    assert not watch.decreases, f"a parameter-server version went down: {watch.decreases}"
    assert all(v >= UPDATES for v in watch.highest.values())
    for daemon in daemons:
        assert daemon.stop(timeout=60) == 0, daemon.log_tail()

    # The reference: the same model, data and seed, trained synchronously in this process for
    # as many updates as the swarm's stages made (their mean: they differ by a batch or two).
    shape = ModelShape.from_dict(DEFAULT_RUN["model"])
    seed = run_seed(run_id)
    train, held_out = train_eval_split(load_corpus("builtin"), shape.seq_len, seed=seed)
    mb, batch = DEFAULT_RUN["batch"]["micro_batch"], DEFAULT_RUN["batch"]["sequences"]
    per_step = batch // mb
    opt = DEFAULT_RUN["optimizer"]
    steps = round(statistics.mean(versions))
    settings = TrainSettings(seed=seed, steps=steps, batch_sequences=batch, micro_batch=mb, lr=opt["lr"],
                             weight_decay=opt["weight_decay"])  # fmt: skip
    reference, reference_weights = train_reference(shape, train, settings)
    start_model = build_model(shape, seed)
    start = held_out_loss(start_model, held_out)
    start_model.load_state_dict(reference_weights)
    ref_end = held_out_loss(start_model, held_out)
    swarm_end = held_out_loss(AutoModelForCausalLM.from_pretrained(exported), held_out)

    # For the record: the training losses the last stage saw, against the reference's.
    ms = [m for m in sorted(losses) if m // per_step < steps]
    quarter = [m for m in ms if m >= ms[-1] * 3 // 4]
    print(f"training loss over micro-batches {quarter[0]}..{quarter[-1]}: swarm "
          f"{statistics.mean(losses[m] for m in quarter):.3f}, reference "
          f"{statistics.mean(reference[m // per_step].loss for m in quarter):.3f}")  # fmt: skip
    print(f"held-out loss: start {start:.3f}; after {steps} updates ({versions}) swarm {swarm_end:.3f}, "
          f"reference {ref_end:.3f}")  # fmt: skip
    # The loss ends far below where it started ...
    assert swarm_end < start - 1.5, (start, swarm_end)
    # ... and close to the reference's at equal tokens.
    # (the servers' staleness in the message: CI shows a failure's last lines only)
    assert abs(swarm_end - ref_end) < TOLERANCE_NATS, (swarm_end, ref_end, servers)


def _export(daemon: LocalDaemon, run_id: str, out: Path) -> list[int]:
    """``swarmd export`` against a running daemon; returns the exported stages' weight versions."""
    command = [sys.executable, "-m", "swarmd", "export", "--run-id", run_id, str(out), "--state-dir",
               str(daemon.state_dir)]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr
    found = re.search(r"stage weight versions \[([0-9, ]+)\]", result.stdout)
    assert found, result.stdout
    return [int(v) for v in found.group(1).split(",")]


def _requeued(info: dict[str, Any]) -> int:
    q = info["queue"]
    return int(q["requeued_expired"] + q["requeued_worker_gone"] + q["requeued_failed"])
