"""Is the simulator honest? Real daemons on emulated links against the simulator on the same swarm.

    sudo .venv/bin/python tests/benchmarks/calibrate_simulator.py --out calibration

1. **The devices.** This machine's compute, measured the way the daemons will meet it: as
   many processes as daemons, one torch thread each, timing forward and backward of the run's
   model at once; their rate becomes each device's ``tflops`` (the scenario's unit).
2. **The real swarm.** One network namespace per daemon on a bridge; ``tc tbf`` shapes each
   device's upload and download, and the data path's latency shim
   (``swarmd.peers.wire.emulated_delay``; no ``netem`` here) adds the one-way latency. Measured
   first: one TCP stream's goodput and the standing queue it keeps in the shaper's buffer (the
   delay it adds to other connections' packets); and on the daemons' own data path (hivemind
   P2P streams, swarmd's framing, the shim) a bulk request's goodput and how much longer a
   small request takes beside it on the same connection. The scenario's links get the data
   path's goodput, the simulation both delays. The daemons train the default run
   (``docs/data-path.md``: cells, shards, shares); once every daemon follows the coordinator's
   plan (its status shows the plan's version, works the cells the plan's grid gives it and
   serves shard ``(s, 0)`` of the stages the plan names it server of) and ``--warmup-updates``
   more updates are in, the trained micro-batches are sampled for ``--seconds`` at whichever
   daemon serves shard ``(0, 0)`` (its ``trained_micro_batches``, or its version times a step's
   micro-batches across a hand-over), and at ``--kill-at`` one daemon that works a cell and
   serves no shard (else any cell's worker) is killed (SIGKILL). The bytes each device sent
   and received, the share ledger's counters and shard ``(0, 0)``'s updates are counted over
   the window.
3. **The simulated swarm.** The same devices, links and model as a scenario file, simulated
   by ``swarmd.peers.sim.simulator`` with swarmd's planner (as the daemons' coordinator runs
   it: the run's stages and H fixed, the layers cut evenly), from the plan the daemons
   followed (and, apart, from its own plan), the same number of seconds, and the same daemon
   leaving at the same moment. The real window starts in a swarm that has trained a while, so
   the simulation runs ``SIM_WINDOWS`` windows, each after its own warm-up, and averages them.
4. **The comparison.** Trained tokens/s before the kill, after it, and over the whole window;
   the time until throughput was back to 90% of what it was (``recovery_times``, on 2 s
   buckets against the 20 s before the kill); real against simulated, with the ratio. A JSON
   file, a markdown table and a plot of both timelines go to ``--out``.

Figures, not assertions: the note of the change says how far apart they are. Every
namespace and process made here is removed on the way out, also when a step fails or the
harness is interrupted.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from swarmd.models.build import build_model
from swarmd.models.presets import DEFAULT_RUN
from swarmd.models.shape import ModelShape
from swarmd.peers.membership.election import coordination_round_s
from swarmd.peers.planning.plan_cost import Plan, stage_flops_per_sequence
from swarmd.peers.planning.planner import PlannerConfig, plan, repair
from swarmd.peers.planning.scenario import Scenario, parse_scenario
from swarmd.peers.sim.churn import ChurnEvent
from swarmd.peers.sim.results import recovery_times
from swarmd.peers.sim.simulator import SimConfig, Simulation, Strategy
from swarmd.system.local_swarm import LocalDaemon, create_run, start_swarm, wait_for

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script: the namespaces' helpers
from tests.integration.netns import EmulatedNetwork  # noqa: E402
from tests.integration.procfs import cpu_times  # noqa: E402

BUCKET_S = 2.0
WINDOW_BUCKETS = 10
SAMPLE_S = 0.5
SIM_WINDOWS = 24
"""Simulated windows per comparison, each after its own warm-up (``WARMUP_S`` and then
``WARMUP_STEP_S`` apart): the real window starts at some moment of a running swarm, and one
simulated window alone would carry the phase of its start. Their figures are averaged."""
WARMUP_S = 20.0
WARMUP_STEP_S = 2.0
HEARTBEAT_INTERVAL_S = 1.0
HEARTBEAT_TTL_S = 6.0
HEARTBEAT = ["--heartbeat-interval", f"{HEARTBEAT_INTERVAL_S:g}", "--heartbeat-ttl", f"{HEARTBEAT_TTL_S:g}"]
SHARE_LEASE_S = 600.0  # a share's lease at the daemon's ledger (``swarmd.training.ledger_host.LEASE_S``)
PLAN_BUDGET_S = 0.5  # the daemons' coordinator's planning budget (``swarmd.node.coordination.PLAN_BUDGET_S``)
FOLLOW_TIMEOUT_S = 300.0
LEDGER_COUNTS = ("issued", "reissued", "completed", "abandoned", "expired")

COMPUTE_PROBE = r"""
import sys, time, torch
torch.set_num_threads(1)
from swarmd.models.build import build_model
from swarmd.models.presets import DEFAULT_RUN
from swarmd.models.shape import ModelShape
shape = ModelShape.from_dict(DEFAULT_RUN["model"])
model = build_model(shape, 0)
x = torch.randint(0, shape.vocab, (DEFAULT_RUN["batch"]["micro_batch"], shape.seq_len))
def step():
    model(input_ids=x, labels=x).loss.backward()
for _ in range(3):
    step()
n, started = 0, time.perf_counter()
while time.perf_counter() - started < float(sys.argv[1]):
    step()
    n += 1
print((time.perf_counter() - started) / n)
"""


GOODPUT_SINK = r"""
import socket, sys, threading, time
def echo(server):
    while True:
        conn, _ = server.accept()
        with conn:
            while chunk := conn.recv(1 << 10):
                conn.sendall(chunk)
threading.Thread(target=echo, args=(socket.create_server((sys.argv[1], 9101)),), daemon=True).start()
server = socket.create_server((sys.argv[1], 9100))
print("listening", flush=True)
conn, _ = server.accept()
got, first = 0, None
while chunk := conn.recv(1 << 16):
    first = first or time.perf_counter()
    got += len(chunk)
print(got / (time.perf_counter() - first))
"""
GOODPUT_SOURCE = r"""
import json, socket, statistics, sys, threading, time
host, nbytes = sys.argv[1], int(sys.argv[2])
def round_trips(n):
    out = []
    with socket.create_connection((host, 9101), timeout=30) as c:
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for _ in range(n):
            started, got = time.perf_counter(), 0
            c.sendall(bytes(64))
            while got < 64:
                got += len(c.recv(64 - got))
            out.append(time.perf_counter() - started)
            time.sleep(0.02)  # sync-ok: spacing between pings
    return statistics.median(out)
def bulk():
    with socket.create_connection((host, 9100), timeout=30) as conn:
        conn.sendall(bytes(nbytes))
idle = round_trips(20)
sender = threading.Thread(target=bulk)
sender.start()
time.sleep(1.0)  # sync-ok: TCP has filled the bottleneck's buffer
loaded = round_trips(30)
sender.join()
print(json.dumps({"idle_s": idle, "loaded_s": loaded}))
"""

# The daemons' own data path (hivemind P2P streams through p2pd, swarmd's framing and its
# latency shim), between two devices: a small request's round trip on the idle connection, a
# bulk request's goodput, and small requests' round trip beside that bulk request on the same
# connection (libp2p multiplexes a pair's streams over one connection).
# A typed request of the harness's own (never served by a daemon): one blob of any size up to
# the bulk transfer's, answered with its byte count.
SINK = r"""
from dataclasses import dataclass
from swarmd.peers.wire.protocol import Answer, Request, bound
@dataclass(frozen=True, kw_only=True)
class Sunk(Answer):
    bytes: int = bound(min_value=0, max_value=1 << 30)
@dataclass(frozen=True, kw_only=True)
class Sink(Request[Sunk]):
    METHOD = "calibration.sink"
    BLOBS = 1
    MAX_BYTES = (1 << 30) + 4096
"""
DATA_PATH_SERVER = (
    SINK
    + r"""
import asyncio, sys
from hivemind.p2p import P2P
from swarmd.peers.wire.rpc import RpcServer
async def sink(peer, request, blobs):
    return Sunk(bytes=sum(len(b) for b in blobs)), []
async def main():
    p2p = await P2P.create(host_maddrs=[f"/ip4/{sys.argv[1]}/tcp/0"], nat_port_map=False, auto_nat=False,
                           use_relay=False)
    server = RpcServer(max_message_bytes=(1 << 30) + 4096, timeout_s=300)
    server.register(Sink, sink)
    await server.attach(p2p)
    print([str(m) for m in await p2p.get_visible_maddrs()][0], flush=True)
    await asyncio.Event().wait()
asyncio.run(main())
"""
)
DATA_PATH_CLIENT = (
    SINK
    + r"""
import asyncio, json, statistics, sys, time
from hivemind.p2p import P2P
from swarmd.peers.wire.rpc import call
async def main():
    ip, maddr, nbytes = sys.argv[1], sys.argv[2], int(sys.argv[3])
    p2p = await P2P.create(host_maddrs=[f"/ip4/{ip}/tcp/0"], initial_peers=[maddr], nat_port_map=False,
                           auto_nat=False, use_relay=False)
    server = maddr.split("/p2p/")[1]
    async def small(n, beside=None):
        out = []
        for _ in range(n):
            if beside is not None and beside.done():
                break  # only pings beside the transfer count
            started = time.perf_counter()
            await call(p2p, server, Sink(run_id="calibration.aaaaaaaaaaaaaaaaaaaaaaaa"), [bytes(64)])
            out.append(time.perf_counter() - started)
            await asyncio.sleep(0.02)  # sync-ok: spacing between pings
        return statistics.median(out) if out else None
    async def bulk():
        await call(p2p, server, Sink(run_id="calibration.aaaaaaaaaaaaaaaaaaaaaaaa"), [bytes(nbytes)], timeout_s=300,
                   max_message_bytes=(1 << 30) + 4096)
        return time.perf_counter()
    await small(3)  # the connection is open and warm
    idle = await small(15)
    started = time.perf_counter()
    transfer = asyncio.create_task(bulk())
    await asyncio.sleep(0.5)  # sync-ok: the bulk request fills the connection's buffers
    loaded = await small(15, beside=transfer)
    elapsed = await transfer - started
    print(json.dumps({"idle_rtt_s": idle, "loaded_rtt_s": loaded if loaded is not None else idle,
                      "goodput_Bps": nbytes / max(1e-6, elapsed - idle)}))
    await p2p.shutdown()
asyncio.run(main())
"""
)


@dataclass
class DataPath:
    """What the daemons' data path gets between two devices of the emulated network."""

    goodput_Bps: float
    """A bulk request's bytes over its time less one idle round trip: what a swarmd link
    probe measures, and what a scenario's bandwidth means."""
    idle_rtt_s: float
    """A small request's round trip on an idle connection (the latency both ways, and the
    stack's own cost per request)."""
    loaded_rtt_s: float
    """The same beside a bulk request on the same connection."""

    @property
    def connection_queue_s(self) -> float:
        """How long a message waits behind a transfer on the same connection (the
        simulator takes it as bytes, at the link's rate: ``connection_queue_bytes``)."""
        return max(0.0, self.loaded_rtt_s - self.idle_rtt_s)


def measure_data_path(net: EmulatedNetwork, nbytes: int, src: int = 0, dst: int = 1) -> DataPath:
    """The data path from device ``src`` to device ``dst`` (``DATA_PATH_CLIENT``)."""
    server = subprocess.Popen(
        [*net.prefix_for(dst), sys.executable, "-c", DATA_PATH_SERVER, net.ip(dst)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert server.stdout is not None
        maddr = server.stdout.readline().strip()
        if "/p2p/" not in maddr:
            raise RuntimeError(f"the data path's server did not start: {maddr!r}")
        client = subprocess.run(
            [*net.prefix_for(src), sys.executable, "-c", DATA_PATH_CLIENT, net.ip(src), maddr, str(nbytes)],
            check=True,
            timeout=300,
            capture_output=True,
            text=True,
        )
        return DataPath(**json.loads(client.stdout.strip().splitlines()[-1]))
    finally:
        server.kill()
        server.wait(10)


def measure_link(net: EmulatedNetwork, nbytes: int) -> tuple[float, float]:
    """What one TCP stream from device 0 to device 1 gets, and what it costs others: the
    goodput in bytes per second (what a scenario's bandwidth means, a link probe's figure,
    below the shaper's rate by TCP's overheads), and the standing queue it keeps in the
    bottleneck's buffer, as the round trip of small messages beside it less their round trip
    on the idle link (the simulator's ``standing_queue_s``)."""
    sink = subprocess.Popen(
        [*net.prefix_for(1), sys.executable, "-c", GOODPUT_SINK, net.ip(1)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert sink.stdout is not None and sink.stdout.readline().strip() == "listening"
        source = subprocess.run(
            [*net.prefix_for(0), sys.executable, "-c", GOODPUT_SOURCE, net.ip(1), str(nbytes)],
            check=True,
            timeout=120,
            capture_output=True,
            text=True,
        )
        round_trips = json.loads(source.stdout)
        goodput = float(sink.communicate(timeout=60)[0].strip())
        return goodput, max(0.0, round_trips["loaded_s"] - round_trips["idle_s"])
    finally:
        if sink.poll() is None:
            sink.kill()
            sink.wait(10)


@dataclass
class Side:
    """One side of the comparison (real or simulated)."""

    tokens_per_s: float
    before_kill: float
    after_kill: float
    recovery_s: float | None
    timeline: list[int]
    """Micro-batches trained (applied in committed updates of shard ``(0, 0)``) per ``BUCKET_S``
    from the start of the window."""


def model_shape() -> ModelShape:
    return ModelShape.from_dict(DEFAULT_RUN["model"])


def tokens_per_micro_batch() -> int:
    return DEFAULT_RUN["batch"]["micro_batch"] * model_shape().seq_len


def measure_tflops(processes: int, seconds: float) -> tuple[float, list[float]]:
    """Seconds per forward+backward micro-batch of the whole model, with ``processes`` copies
    running at once (the contention the daemons will meet), as effective TFLOPS per process."""
    procs = [
        subprocess.Popen([sys.executable, "-c", COMPUTE_PROBE, str(seconds)], stdout=subprocess.PIPE, text=True)
        for _ in range(processes)
    ]
    per_step = [float(p.communicate(timeout=seconds + 120)[0].strip()) for p in procs]
    whole_model = np.array([float(model_shape().layers)])
    flops = float(stage_flops_per_sequence(calibration_scenario(1.0, [1e6, 1e6], [0.0, 0.0], 1.0), whole_model).sum())
    flops *= DEFAULT_RUN["batch"]["micro_batch"]
    return flops / statistics.median(per_step) / 1e12, per_step


def calibration_scenario(
    tflops: float, rates_Bps: list[float], access_latency_s: list[float], efficiency: float | list[float]
) -> Scenario:
    """The emulated swarm as a scenario: a link runs at the slower of its ends' shaped rates
    times their ``efficiency`` (the data path's goodput over the shaped rate, measured per
    device or once for all), and takes the sum of its ends' access latencies. Messages are
    priced by the data path's own sizes (``swarmd.peers.wire.sizes``), from the model."""
    e = efficiency if isinstance(efficiency, list) else [efficiency] * len(rates_Bps)
    goodput = [rate * factor for rate, factor in zip(rates_Bps, e, strict=True)]
    shape, run = model_shape(), DEFAULT_RUN
    params = sum(p.numel() for p in build_model(shape, 0).parameters())
    n = len(rates_Bps)
    return parse_scenario(
        {
            "name": "calibration",
            "devices": [{"id": f"d{i}", "tflops": tflops, "memory_gib": 8} for i in range(n)],
            "latency_s": [
                [0.0 if i == j else access_latency_s[i] + access_latency_s[j] for j in range(n)] for i in range(n)
            ],
            "bandwidth_Bps": [[None if i == j else min(goodput[i], goodput[j]) for j in range(n)] for i in range(n)],
            # activations travel in fp16 (gpt2: the wire's half dtype)
            "model": {
                "layers": shape.layers,
                "hidden": shape.hidden,
                "seq_len": shape.seq_len,
                "vocab": shape.vocab,
                "params": float(params),
                "dtype_bytes": 2,
            },
            "batch": {"sequences": run["batch"]["sequences"], "micro_batch": run["batch"]["micro_batch"]},
            "parallelism": {"stages": run["stages"], "data_parallel": max(1, n // run["stages"])},
        }
    )


def summarize(timeline: list[int], kill_s: float, tokens_per_mb: int) -> Side:
    rate = tokens_per_mb / BUCKET_S
    k = int(kill_s // BUCKET_S)
    # the window before the kill is its last WINDOW_BUCKETS buckets, the one after starts once
    # recovery is over
    before = timeline[max(0, k - WINDOW_BUCKETS) : k]
    recovered = recovery_times(timeline, BUCKET_S, [kill_s], window=WINDOW_BUCKETS, back=0.9)
    settle = int((kill_s + (recovered[0] if recovered else 0.0)) // BUCKET_S) + 1
    after = timeline[settle:] or timeline[k + 1 :]
    return Side(
        tokens_per_s=statistics.mean(timeline) * rate,
        before_kill=statistics.mean(before) * rate if before else 0.0,
        after_kill=statistics.mean(after) * rate if after else 0.0,
        recovery_s=recovered[0] if recovered else None,
        timeline=list(timeline),
    )


# --- the real swarm --------------------------------------------------------------------------


def alive(daemon: LocalDaemon) -> bool:
    return daemon.proc is not None and daemon.proc.poll() is None


def statuses_of(daemons: list[LocalDaemon]) -> dict[int, dict[str, Any]]:
    """The status of each daemon still running that answers, by daemon index (one request each)."""
    out = {}
    for i, d in enumerate(daemons):
        if alive(d) and (status := d.status()):
            out[i] = status
    return out


def newest_plan(statuses: dict[int, dict[str, Any]]) -> dict[str, Any] | None:
    """The newest plan any daemon knows, as its status shows it (``swarm.plan``)."""
    plans = [p for st in statuses.values() if (p := (st.get("swarm") or {}).get("plan"))]
    return max(plans, key=lambda p: p["version"]) if plans else None


def cells_of(status: dict[str, Any]) -> set[tuple[int, int]]:
    return {(c["pipeline"], c["stage"]) for c in (status.get("training") or {}).get("cells") or []}


def shards_of(status: dict[str, Any]) -> dict[tuple[int, int], dict[str, Any]]:
    return {(s["stage"], s["shard"]): s for s in (status.get("training") or {}).get("shards") or []}


def following_plan(statuses: dict[int, dict[str, Any]]) -> dict[str, Any] | None:
    """The newest plan, if every daemon that answers follows it: its trainer's assignment is
    that plan's version, it works exactly the cells the plan's grid gives it, and it serves
    shard ``(s, 0)`` of each stage the plan names it server of."""
    plan_ = newest_plan(statuses)
    if plan_ is None or not statuses:
        return None
    for st in statuses.values():
        assignment = (st.get("training") or {}).get("assignment") or {}
        if assignment.get("provisional", True) or assignment.get("version") != plan_["version"]:
            return None
        me = st.get("peer_id")
        planned = {(p, s) for p, row in enumerate(plan_["grid"]) for s, peer in enumerate(row) if peer == me}
        if cells_of(st) != planned:
            return None
        served = shards_of(st)
        if any(server == me and (s, 0) not in served for s, server in enumerate(plan_["parameter_servers"])):
            return None
    return plan_


def first_shard(statuses: dict[int, dict[str, Any]]) -> tuple[int, dict[str, Any]] | None:
    """Which daemon serves shard ``(0, 0)`` (and keeps the ledger), and its training status."""
    for i, st in statuses.items():
        if (0, 0) in shards_of(st):
            return i, st["training"]
    return None


def plan_of(statuses: dict[int, dict[str, Any]], plan_: dict[str, Any] | None) -> dict[str, Any] | None:
    """The plan the daemons follow, by daemon index: the placement the simulation starts from.
    The plan's status names no shard servers beyond each stage's first, nor spares: the shards'
    servers are who serves them now (all of them found, and distinct), else one shard a stage."""
    if plan_ is None:
        return None
    index = {st.get("peer_id"): i for i, st in statuses.items()}
    if not all(p in index for row in plan_["grid"] for p in row) or not all(
        p in index for p in plan_["parameter_servers"]
    ):
        return None
    servers = [index[p] for p in plan_["parameter_servers"]]
    held = {key: i for i, st in statuses.items() for key in shards_of(st)}
    assignment = next(iter(statuses.values()))["training"]["assignment"]
    counts = assignment.get("shards") or [1] * len(servers)
    rows = [[held.get((s, k)) for k in range(counts[s])] for s in range(len(servers))]
    whole = all(None not in row and row[0] == servers[s] and len(set(row)) == len(row) for s, row in enumerate(rows))
    return {
        "version": plan_["version"],
        "pipelines": [[index[p] for p in row] for row in plan_["grid"]],
        "layers_per_stage": plan_["layers_per_stage"],
        "parameter_servers": servers,
        "shard_servers": rows if whole else [[s] for s in servers],
        "local_steps": assignment.get("local_steps") or 1,
        "share_micro_batches": assignment.get("share_micro_batches") or 0,
    }


def roles_of(statuses: dict[int, dict[str, Any]]) -> dict[int, list[str]]:
    """Each daemon's cells, the shards it serves and the daemon it names its standby, by daemon
    index (as the simulation's ``SimResult.roles`` names cells and shards)."""
    index = {st.get("peer_id"): i for i, st in statuses.items()}
    out: dict[int, list[str]] = {}
    for i, st in statuses.items():
        roles = [f"cell {p}/{s}" for p, s in sorted(cells_of(st))]
        roles += [f"shard {s}/{k}" for s, k in sorted(shards_of(st))]
        standby = (st.get("training") or {}).get("standby")
        if standby:
            roles.append(f"its standby d{index[standby]}" if standby in index else f"its standby {standby[:12]}")
        out[i] = roles or ["nothing"]
    return out


def busy_fraction(start: tuple[int, int], end: tuple[int, int]) -> float:
    """How busy the cores were between two ``cpu_times``: 1.0 is every core all the time. The
    emulated devices share this machine's cores; a simulated device has its own."""
    return (end[0] - start[0]) / max(1, end[1] - start[1])


def pick_victim(statuses: dict[int, dict[str, Any]]) -> int | None:
    """A daemon that works a cell and serves no shard (the highest index), else one that works a
    cell and does not keep the ledger, else any cell's worker."""
    workers = [i for i, st in statuses.items() if cells_of(st)]
    for choice in (
        [i for i in workers if not shards_of(statuses[i])],
        [i for i in workers if (0, 0) not in shards_of(statuses[i])],
        workers,
    ):
        if choice:
            return max(choice)
    return None


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


# --- the whole comparison --------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--devices", type=int, default=4)
    parser.add_argument(
        "--rate-mbps",
        default="40",
        help="each device's upload and download: one figure for all, or one per device (40,40,20,10)",
    )
    parser.add_argument(
        "--access-latency-ms",
        default="10",
        help="one way; a link is the sum of its ends': one figure for all, or one per device",
    )
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--kill-at", type=float, default=60.0)
    parser.add_argument("--warmup-updates", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path("calibration"))
    parser.add_argument("--real-from", type=Path, help="a calibration.json: simulate again against its real run")
    args = parser.parse_args()
    if args.real_from is not None:
        return simulate_again(args)
    if os.geteuid() != 0:
        print("calibrate_simulator: needs root, to make network namespaces and shape their links", file=sys.stderr)
        return 2
    try:
        rates_Bps = [v * 1e6 / 8 for v in per_device(args.rate_mbps, args.devices, "--rate-mbps")]
        latency_s = [v / 1000 for v in per_device(args.access_latency_ms, args.devices, "--access-latency-ms")]
    except ValueError as e:
        print(f"calibrate_simulator: {e}", file=sys.stderr)
        return 2
    rate_Bps = min(rates_Bps[0], rates_Bps[1])  # the link the data path is measured on
    args.out.mkdir(parents=True, exist_ok=True)

    tflops, per_step = measure_tflops(args.devices, 10.0)
    print(
        f"compute: {args.devices} processes at once, {statistics.median(per_step) * 1e3:.0f} ms per micro-batch "
        f"(forward and backward) each: {tflops * 1e3:.2f} GFLOPS per device",
        flush=True,
    )
    workdir = Path(tempfile.mkdtemp(prefix="swd-cal-", dir="/tmp"))
    net = EmulatedNetwork(f"swc{os.getpid()}", rates_Bps, rates_Bps, latency_s, workdir)
    # SIGTERM (a timeout, a CI runner) must unwind through the finally blocks too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        with net:
            goodput, standing_queue_s = measure_link(net, int(rate_Bps * 4))
            data_path = measure_data_path(net, int(rate_Bps * 4))
            print(
                f"links: d0 to d1 {rate_Bps / 1e6:.2f} MB/s shaped; one TCP stream gets {goodput / 1e6:.2f} MB/s "
                "and keeps "
                f"{standing_queue_s * 1e3:.0f} ms queued in the shaper; the daemons' data path gets "
                f"{data_path.goodput_Bps / 1e6:.2f} MB/s, a small request takes {data_path.idle_rtt_s * 1e3:.0f} ms "
                f"there and waits {data_path.connection_queue_s * 1e3:.0f} ms more behind a transfer on its "
                "connection; the simulation takes the data path's goodput and both queues",
                flush=True,
            )
            efficiency = data_path_efficiency(net, rates_Bps, latency_s, data_path)
            real = real_run(net, workdir, args.seconds, args.kill_at, args.warmup_updates)
            real["goodput_Bps"], real["standing_queue_s"] = goodput, standing_queue_s
            real["data_path"] = asdict(data_path)
            real["efficiency"] = efficiency
    finally:
        left = net.leftovers()
        subprocess.run(["rm", "-rf", str(workdir)], check=False)
    if left:
        print(f"calibrate_simulator: namespaces left behind: {left}", file=sys.stderr)
        return 1

    scenario = calibration_scenario(tflops, rates_Bps, latency_s, efficiency)
    compare(args, scenario, tflops, real)
    return 0


def data_path_efficiency(
    net: EmulatedNetwork, rates_Bps: list[float], latency_s: list[float], first: DataPath
) -> list[float]:
    """Each device's data-path goodput over its shaped rate: measured from one device of each
    kind (rate and latency) to device 0 (device 1 for device 0's own kind, ``first``). A slower
    link with a longer round trip need not get the same share of its rate."""
    kinds: dict[tuple[float, float], float] = {
        (rates_Bps[0], latency_s[0]): first.goodput_Bps / min(rates_Bps[0], rates_Bps[1])
    }
    for i in range(1, net.n):
        kind = (rates_Bps[i], latency_s[i])
        if kind not in kinds:
            shaped = min(rates_Bps[i], rates_Bps[0])
            measured = measure_data_path(net, int(shaped * 4), src=i, dst=0)
            kinds[kind] = measured.goodput_Bps / shaped
            print(
                f"links: d{i} to d0 {shaped / 1e6:.2f} MB/s shaped; the data path gets "
                f"{measured.goodput_Bps / 1e6:.2f} MB/s",
                flush=True,
            )
    return [kinds[(rate, latency)] for rate, latency in zip(rates_Bps, latency_s, strict=True)]


def per_device(value: str, devices: int, name: str) -> list[float]:
    """A figure for every device: one for all (``40``), or one each (``40,40,20,10``)."""
    try:
        figures = [float(v) for v in str(value).split(",")]
    except ValueError:
        raise ValueError(f"{name} {value!r} is not a number or a comma-separated list of numbers") from None
    if len(figures) == 1:
        figures *= devices
    if len(figures) != devices or min(figures) <= 0:
        raise ValueError(f"{name} {value!r}: give one positive figure, or one for each of the {devices} devices")
    return figures


def swarmd_strategy(name: str, fixed: Plan | None = None) -> Strategy:
    """swarmd's planner as the daemons' coordinator runs it (the run's stages and H fixed, the
    layers cut evenly): its own full plan, or ``fixed`` to start from; its repair on changes."""
    fixed_h = DEFAULT_RUN["exchange"]["local_steps"] or None
    settings = PlannerConfig(
        time_budget_s=PLAN_BUDGET_S, seed=0, stages=DEFAULT_RUN["stages"], local_steps=fixed_h, even_layers=True
    )

    def full(view: Scenario) -> Plan:
        return fixed if fixed is not None else plan(view, settings)

    def mend(view: Scenario, previous: Plan, previous_ids: list[str]) -> Plan:
        return repair(view, previous, previous_ids, settings).plan

    def mend_live(scenario: Scenario, live: np.ndarray, previous: Plan) -> Plan:
        return repair(scenario, previous, scenario.ids, settings, live=live).plan

    return Strategy(name, full, mend, mend_live)


def recorded_plan(recorded: dict[str, Any]) -> Plan:
    return Plan(
        pipelines=tuple(tuple(row) for row in recorded["pipelines"]),
        layers_per_stage=tuple(recorded["layers_per_stage"]),
        parameter_servers=tuple(recorded["parameter_servers"]),
        shard_servers=tuple(tuple(row) for row in recorded["shard_servers"]),
        local_steps=recorded["local_steps"],
        share_micro_batches=recorded["share_micro_batches"],
    )


def describe(p: Plan) -> str:
    """A plan's cells and shard servers, by daemon index."""
    stages = "; ".join(
        f"stage {s} on {', '.join(f'd{row[s]}' for row in p.pipelines)}, shards at "
        f"{', '.join(f'd{d}' for d in p.shard_servers[s])}"
        for s in range(len(p.layers_per_stage))
    )
    return f"{stages} (H = {p.local_steps}, k = {p.share_micro_batches or 'from the batch'})"


def compare(args: argparse.Namespace, scenario: Scenario, tflops: float, real: dict) -> None:
    """Simulate the scenario for as long, with the daemon killed in the real run leaving at the
    kill: ``SIM_WINDOWS`` windows, each after its own warm-up, averaged. The simulation starts
    from the placement the real daemons followed (their coordinator planned on the links it
    measured, which can differ from the emulated ones) and repairs it with swarmd's planner; it
    is also run from its own plan of the emulated links, and both are reported."""
    own = swarmd_strategy("swarmd")
    own_plan = own.full_plan(scenario)
    recorded = real.get("plan")
    if recorded:
        real_plan = recorded_plan(recorded)
        strategy = swarmd_strategy("swarmd on the real plan", real_plan)
    else:  # the daemons followed no plan the harness could read
        real_plan, strategy = own_plan, own
    victim = real.get("victim")
    if victim is None:
        workers = {d for row in real_plan.pipelines for d in row}
        victim = max(workers - {d for row in real_plan.shard_servers for d in row} or workers)
    data_path = real.get("data_path") or {}
    settings = SimConfig(
        churn=False,
        detect_s=HEARTBEAT_TTL_S,
        join_s=5.0,
        lease_s=SHARE_LEASE_S,
        bucket_s=BUCKET_S,
        max_staleness=DEFAULT_RUN["optimizer"]["max_staleness"],
        standing_queue_s=real.get("standing_queue_s", 0.0),
        # beside a transfer on its connection a request also met both ends'
        # standing queues, which the simulation adds on its own
        # (a window of bytes: longer on a slower link)
        connection_queue_bytes=max(
            0.0,
            data_path.get("loaded_rtt_s", 0.0)
            - data_path.get("idle_rtt_s", 0.0)
            - 2 * real.get("standing_queue_s", 0.0),
        )
        * float(scenario.bandwidth_Bps[0, 1]),
        request_overhead_s=max(0.0, data_path.get("idle_rtt_s", 0.0) - 2 * float(scenario.latency_s[0, 1])),
        # the daemons' coordination rounds at their heartbeat, and no relays
        coordinate_s=coordination_round_s(HEARTBEAT_INTERVAL_S),
        data_via_relay="never",
    )
    tokens = tokens_per_micro_batch()
    windows = [
        simulate_window(scenario, strategy, settings, WARMUP_S + k * WARMUP_STEP_S, args, victim)
        for k in range(SIM_WINDOWS)
    ]
    simulated = [summarize(timeline, args.kill_at, tokens) for timeline, _ in windows]
    sides = {"real": summarize(real["timeline"], args.kill_at, tokens), "simulated": mean_side(simulated)}
    if recorded:
        own_windows = [
            summarize(
                simulate_window(scenario, own, settings, WARMUP_S + k * WARMUP_STEP_S, args, victim)[0],
                args.kill_at,
                tokens,
            )
            for k in range(SIM_WINDOWS)
        ]
        sides["simulated on its own plan"] = mean_side(own_windows)
    detail = {
        "plans": {"real": describe(real_plan) if recorded else None, "own": describe(own_plan)},
        "victim": victim,
        "windows": [asdict(side) for side in simulated],
        "sent_MB": np.mean([d["sent_MB"] for _, d in windows], axis=0).round(1).tolist(),
        "received_MB": np.mean([d["received_MB"] for _, d in windows], axis=0).round(1).tolist(),
        "updates": statistics.mean(d["updates"] for _, d in windows),
        "ledger": {key: statistics.mean(d["ledger"][key] for _, d in windows) for key in LEDGER_COUNTS},
        "roles": windows[0][1]["roles"],
        "standing_queue_s": settings.standing_queue_s,
        "connection_queue_bytes": settings.connection_queue_bytes,
        "request_overhead_s": settings.request_overhead_s,
    }
    report(args, sides, tflops, real, detail)


def simulate_window(
    scenario: Scenario, strategy: Strategy, settings: SimConfig, warm_s: float, args: argparse.Namespace, victim: int
) -> tuple[list[int], dict[str, Any]]:
    """A window of ``args.seconds`` after ``warm_s`` of simulated training (the real window
    starts in a swarm that has trained a while, too), with ``victim`` leaving ``args.kill_at``
    into it: the window's timeline, and the bytes, updates of shard (0, 0) and ledger counts in
    it (the counters as they stood when the window began are taken off)."""
    churn = [ChurnEvent(warm_s + args.kill_at, victim, False)]
    sim = Simulation(
        scenario,
        strategy,
        replace(settings, hours=(warm_s + args.seconds) / 3600),
        (np.ones(args.devices, dtype=bool), churn),
    )
    sim.advance(warm_s)
    sent, received = sim.engine.carried(warm_s)
    updates, ledger = sim.updates, asdict(sim.ledger.counters)
    result = sim.run()
    first = int(round(warm_s / BUCKET_S))
    return result.timeline[first : first + int(np.ceil(args.seconds / BUCKET_S))], {
        "sent_MB": ((np.array(result.sent_bytes) - sent) / 1e6).tolist(),
        "received_MB": ((np.array(result.received_bytes) - received) / 1e6).tolist(),
        "updates": result.updates - updates,
        "ledger": {key: getattr(sim.ledger.counters, key) - ledger[key] for key in LEDGER_COUNTS},
        "roles": {int(d): r for d, r in sorted(result.roles.items())},
    }


def mean_side(sides: list[Side]) -> Side:
    """The simulated windows' figures averaged (a recovery that never came counts as none)."""
    recovered = [s.recovery_s for s in sides if s.recovery_s is not None]
    return Side(
        tokens_per_s=statistics.mean(s.tokens_per_s for s in sides),
        before_kill=statistics.mean(s.before_kill for s in sides),
        after_kill=statistics.mean(s.after_kill for s in sides),
        recovery_s=statistics.median(recovered) if len(recovered) * 2 > len(sides) else None,
        timeline=[round(statistics.mean(column), 2) for column in zip(*(s.timeline for s in sides), strict=True)],
    )


def simulate_again(args: argparse.Namespace) -> int:
    """The simulated side only, against a real run recorded before (for work on the simulator)."""
    recorded = json.loads(args.real_from.read_text())
    for key in ("devices", "seconds", "kill_at"):
        setattr(args, key, float(recorded["args"][key]) if key != "devices" else int(recorded["args"][key]))
    args.rate_mbps, args.access_latency_ms = recorded["args"]["rate_mbps"], recorded["args"]["access_latency_ms"]
    args.out.mkdir(parents=True, exist_ok=True)
    rates_Bps = [v * 1e6 / 8 for v in per_device(args.rate_mbps, args.devices, "rate_mbps")]
    latency_s = [v / 1000 for v in per_device(args.access_latency_ms, args.devices, "access_latency_ms")]
    scenario = calibration_scenario(recorded["tflops"], rates_Bps, latency_s, recorded["real"]["efficiency"])
    compare(args, scenario, recorded["tflops"], recorded["real"])
    return 0


def links_lines(real: dict[str, Any], simulated: dict[str, Any]) -> list[str]:
    """What was measured of the links, and what the simulation took."""
    dp = DataPath(**real["data_path"])
    return [
        f"Links: one TCP stream gets {real['goodput_Bps'] / 1e6:.2f} MB/s and keeps "
        f"{real['standing_queue_s'] * 1e3:.0f} ms queued in the shaper; the daemons' data path gets "
        f"{dp.goodput_Bps / 1e6:.2f} MB/s (the simulated links' rate), a small request takes "
        f"{dp.idle_rtt_s * 1e3:.0f} ms on an idle connection and {dp.loaded_rtt_s * 1e3:.0f} ms beside a transfer "
        f"on the same one (simulated: {simulated['connection_queue_bytes'] / 1e3:.0f} kB more, "
        f"{simulated['connection_queue_bytes'] / dp.goodput_Bps * 1e3:.0f} ms at that rate).",
        "",
    ]


def roles_line(real: dict[str, Any], simulated: dict[Any, list[str]]) -> str:
    """What each daemon held, real (at the window's start and end) and simulated (at the end)."""

    def where(roles: dict[Any, list[str]]) -> str:
        return "; ".join(f"d{i} {', '.join(r)}" for i, r in sorted(roles.items(), key=lambda kv: int(kv[0])))

    return (
        f"Roles: real at the start {where(real['start'])}; real at the end {where(real['end'])}; "
        f"simulated at the end {where(simulated)}."
    )


def report(
    args: argparse.Namespace, sides: dict[str, Side], tflops: float, real: dict, simulated: dict[str, Any]
) -> None:
    r, s = sides["real"], sides["simulated"]
    windows = [w["tokens_per_s"] for w in simulated["windows"]]

    def ratio(a: float | None, b: float | None) -> str:
        return f"{b / a:.2f}" if a and b is not None else "-"

    def fmt(v: float | None) -> str:
        return "not back" if v is None else f"{v:,.1f}"

    rows = [
        ("trained tokens/s over the window", r.tokens_per_s, s.tokens_per_s),
        ("trained tokens/s before the kill", r.before_kill, s.before_kill),
        ("trained tokens/s after recovery", r.after_kill, s.after_kill),
        ("recovery after the kill, s", r.recovery_s, s.recovery_s),
    ]
    victim = real.get("victim")
    killed = f"d{victim} killed" if victim is not None else "nobody killed"
    lines = [
        f"# Calibration: {args.devices} daemons, {args.rate_mbps} Mbit/s up and down each, "
        f"{args.access_latency_ms} ms one way to the switch each, {args.seconds:g} s with {killed} at "
        f"{args.kill_at:g} s",
        "",
        f"Devices measured at {tflops * 1e3:.2f} GFLOPS each ({args.devices} processes at once, one thread each).",
        "",
        *links_lines(real, simulated),
        f"Simulated: the mean of {len(windows)} windows after {WARMUP_S:g} to "
        f"{WARMUP_S + (len(windows) - 1) * WARMUP_STEP_S:g} s of warm-up; tokens/s over a window "
        f"{min(windows):,.1f} to {max(windows):,.1f}.",
        "",
        "| figure | real | simulated | simulated / real |",
        "|---|---:|---:|---:|",
        *(f"| {name} | {fmt(a)} | {fmt(b)} | {ratio(a, b)} |" for name, a, b in rows),
    ]
    plans = simulated["plans"]
    if plans.get("real"):
        lines += [
            "",
            f"The simulation starts from the plan the real daemons followed (v{real['plan']['version']}): "
            f"{plans['real']}.",
        ]
    own = sides.get("simulated on its own plan")
    if own is not None:
        lines += [
            "",
            f"From its own plan of the emulated links instead ({plans['own']}), the simulation makes "
            f"{own.tokens_per_s:,.1f} tokens/s over the window ({ratio(r.tokens_per_s, own.tokens_per_s)} of real), "
            f"{own.before_kill:,.1f} before the kill and {own.after_kill:,.1f} after: what the real swarm would gain, "
            "or lose, had its coordinator measured the links as they are.",
        ]
    lines += [
        "",
        "| MB over the window | " + " | ".join(f"d{i}" for i in range(args.devices)) + " |",
        "|---|" + "---:|" * args.devices,
    ]
    for key in ("sent_MB", "received_MB"):
        lines.append(f"| {key[:-3]}, real | " + " | ".join(f"{v:.1f}" for v in real[key]) + " |")
        lines.append(f"| {key[:-3]}, simulated | " + " | ".join(f"{v:.1f}" for v in simulated[key]) + " |")
    counts = [("updates of shard (0, 0)", real["updates_in_window"], simulated["updates"])]
    if real.get("ledger_in_window"):  # the ledger stayed with one daemon over the window
        counts += [(f"shares {key}", real["ledger_in_window"][key], simulated["ledger"][key]) for key in LEDGER_COUNTS]
    lines += ["", "| in the window | real | simulated |", "|---|---:|---:|"]
    lines += [f"| {name} | {a} | {b:.1f} |" for name, a, b in counts]
    lines += ["", roles_line(real["roles"], simulated["roles"])]
    lines += ["", f"This machine's {os.cpu_count()} cores were {real['cpu_busy']:.0%} busy over the real window."]
    text = "\n".join(lines) + "\n"
    print(text)
    (args.out / "calibration.md").write_text(text)
    (args.out / "calibration.json").write_text(
        json.dumps(
            {
                "args": {k: str(v) for k, v in vars(args).items()},
                "tflops": tflops,
                "sides": {k: asdict(v) for k, v in sides.items()},
                "real": real,
                "simulated": simulated,
            },
            indent=1,
            default=str,
        )
    )
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(8, 3.5))
    tokens = tokens_per_micro_batch() / BUCKET_S
    for name, side in sides.items():
        ax.plot([i * BUCKET_S for i in range(len(side.timeline))], [n * tokens for n in side.timeline], label=name)
    ax.axvline(args.kill_at, color="grey", linestyle="--", label="kill")
    ax.set(xlabel="seconds", ylabel="trained tokens/s", title="Real daemons against the simulator")
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.out / "calibration.png", dpi=120)
    print(f"wrote {args.out}/calibration.md, calibration.json, calibration.png")


if __name__ == "__main__":
    sys.exit(main())
