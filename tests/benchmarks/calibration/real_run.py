"""The real swarm: one daemon per network namespace, trained until they follow one plan, then
sampled for a window with one daemon killed part way through.

Sampling reads shard ``(0, 0)``'s count of trained micro-batches at whichever daemon serves it,
so the timeline follows the shard across a hand-over; the bytes each device carried and the
cores' load are read around the same window.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import numpy as np

from swarmd.models.presets import DEFAULT_RUN
from swarmd.system.local_swarm import LocalDaemon, create_run, start_swarm, wait_for
from tests.benchmarks.calibration.scenario import HEARTBEAT, tokens_per_micro_batch
from tests.benchmarks.calibration.sides import BUCKET_S, LEDGER_COUNTS
from tests.benchmarks.calibration.statuses import (
    alive,
    first_shard,
    following_plan,
    newest_plan,
    pick_victim,
    plan_of,
    roles_of,
    shards_of,
    statuses_of,
)
from tests.integration.netns import EmulatedNetwork
from tests.integration.procfs import cpu_times

SAMPLE_S = 0.5
"""Seconds between samples of shard ``(0, 0)``: a few to each of a timeline's buckets."""
FOLLOW_TIMEOUT_S = 300.0
"""How long the daemons get to follow one plan; past it the window is measured anyway (and the
report says which plan the simulation started from)."""


def busy_fraction(start: tuple[int, int], end: tuple[int, int]) -> float:
    """How busy the cores were between two ``cpu_times``: 1.0 is every core all the time. The
    emulated devices share this machine's cores; a simulated device has its own."""
    return (end[0] - start[0]) / max(1, end[1] - start[1])


def timeline_of(samples: list[tuple[float, int, int, int]], seconds: float, step_mb: int) -> list[int]:
    """Micro-batches trained per ``BUCKET_S`` from samples of ``(t, holder of shard (0, 0), its
    version, its trained_micro_batches)``: the server's own count while the holder stays, its
    version's growth times a step's micro-batches across a hand-over (the count restarts there,
    the version goes on)."""
    timeline = [0] * int(np.ceil(seconds / BUCKET_S))
    for (_, h0, v0, m0), (t1, h1, v1, m1) in zip(samples, samples[1:], strict=False):
        gained = m1 - m0 if h0 == h1 and m1 >= m0 else max(0, v1 - v0) * step_mb
        timeline[min(len(timeline) - 1, int(t1 // BUCKET_S))] += gained
    return timeline


def real_run(net: EmulatedNetwork, workdir: Path, seconds: float, kill_at: float, warmup_updates: int) -> dict:
    spec = workdir / "run.json"
    spec.write_text(json.dumps(DEFAULT_RUN))
    run_id = create_run(workdir / "d0", spec)
    flags = [
        *HEARTBEAT,
        "--no-benchmark",
        "--threads",
        "1",
        "--data-via-relay",
        "never",
        "--no-mdns",
        "--no-nat-port-map",
    ]
    daemons = [
        LocalDaemon(
            workdir / f"d{i}",
            run_id,
            flags,
            network_args=["--host-maddrs", f"/ip4/{net.ip(i)}/tcp/0"],
            command_prefix=net.prefix_for(i),
        )
        for i in range(net.n)
    ]
    try:
        start_swarm(daemons)
        print("daemons running; waiting for every daemon to follow the coordinator's plan", flush=True)
        started = time.monotonic()
        try:
            wait_for(
                lambda: following_plan(statuses_of(daemons)),
                FOLLOW_TIMEOUT_S,
                "the daemons to follow a plan",
                poll_s=1.0,
            )
        except TimeoutError:
            print(f"the daemons do not follow one plan after {FOLLOW_TIMEOUT_S:.0f} s; measuring anyway", flush=True)
        found = wait_for(lambda: first_shard(statuses_of(daemons)), 120, "a server of shard (0, 0)", poll_s=1.0)
        base = shards_of({"training": found[1]})[(0, 0)]["version"]
        print(
            f"following after {time.monotonic() - started:.0f} s at update {base}; waiting for {warmup_updates} more",
            flush=True,
        )

        def warmed() -> bool:
            now = first_shard(statuses_of(daemons))
            return now is not None and shards_of({"training": now[1]})[(0, 0)]["version"] >= base + warmup_updates

        wait_for(warmed, 300, f"{warmup_updates} updates", poll_s=1.0)
        statuses = statuses_of(daemons)
        plan_at_start = following_plan(statuses) or newest_plan(statuses)
        placement = plan_of(statuses, plan_at_start)
        roles_at_start = roles_of(statuses)
        first = first_shard(statuses)
        assert first is not None
        holder, training = first
        ledger_at_start = (holder, training.get("ledger") or {})
        version_at_start = shards_of({"training": training})[(0, 0)]["version"]
        bytes_at_start = [net.interface_bytes(i) for i in range(net.n)]
        cpu_at_start = cpu_times()
        samples: list[tuple[float, int, int, int]] = []  # (t, holder of shard (0, 0), version, trained mb)
        per_update: list[float] = []  # trained tokens per update, as the holder counts them
        victim: int | None = None
        killed_at: float | None = None
        t0 = time.monotonic()
        while (t := time.monotonic() - t0) < seconds:
            status = daemons[holder].status() if alive(daemons[holder]) else None
            info = shards_of(status or {}).get((0, 0))
            if info is None and (moved := first_shard(statuses_of(daemons))) is not None:
                holder, training = moved  # shard (0, 0) changed hands
                info = shards_of({"training": training})[(0, 0)]
                status = {"training": training}
            if info is not None and status is not None:
                samples.append((t, holder, int(info["version"]), int(info["trained_micro_batches"])))
                tokens = status["training"].get("trained_tokens")
                if tokens and info["version"]:
                    per_update.append(tokens / info["version"])
            if victim is None and t >= kill_at:
                at_kill = statuses_of(daemons)
                victim = pick_victim(at_kill)
                if victim is not None:
                    daemons[victim].kill()
                    killed_at = t
                    print(f"killed d{victim} at {t:.1f} s ({', '.join(roles_of(at_kill)[victim])})", flush=True)
            time.sleep(SAMPLE_S)  # sync-ok: the sampling interval of a measurement
        bytes_at_end = [net.interface_bytes(i) for i in range(net.n)]
        cpu_busy = busy_fraction(cpu_at_start, cpu_times())
        statuses = statuses_of(daemons)
        end = first_shard(statuses)
        ledger_in_window = None
        if end is not None and end[0] == ledger_at_start[0] and ledger_at_start[1] and end[1].get("ledger"):
            ledger_in_window = {key: end[1]["ledger"][key] - ledger_at_start[1][key] for key in LEDGER_COUNTS}
        step_mb = round(statistics.median(per_update) / tokens_per_micro_batch()) if per_update else 0
        timeline = timeline_of(samples, seconds, step_mb)
        return {
            "timeline": timeline,
            "victim": victim,
            "killed_at": killed_at,
            "samples": len(samples),
            "step_micro_batches": step_mb,
            "updates_in_window": samples[-1][2] - version_at_start if samples else 0,
            "ledger_in_window": ledger_in_window,
            "cpu_busy": cpu_busy,
            "plan": placement,
            "roles": {"start": roles_at_start, "end": roles_of(statuses)},
            "plan_at_end": (newest_plan(statuses) or {}).get("version"),
            "training_at_end": {
                i: {k: v for k, v in (st.get("training") or {}).items() if k != "losses"} for i, st in statuses.items()
            },
            "sent_MB": [(b[0] - a[0]) / 1e6 for a, b in zip(bytes_at_start, bytes_at_end, strict=True)],
            "received_MB": [(b[1] - a[1]) / 1e6 for a, b in zip(bytes_at_start, bytes_at_end, strict=True)],
        }
    finally:
        for daemon in daemons:
            daemon.stop(timeout=20)
