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
   path's goodput, the simulation both delays. The daemons train the default run; once every
   stage is hosted by the server the daemons' plan names (``hosted_as_planned``), stage 0's
   finished micro-batches are sampled for ``--seconds``, and at ``--kill-at`` one worker that
   hosts nothing is killed (SIGKILL). The workers' requests, tasks and weight pulls, and the
   hosts' push phases, are counted over the window.
3. **The simulated swarm.** The same devices, links and model as a scenario file, simulated
   by ``swarmd.peers.sim.simulator`` with swarmd's planner, the same number of seconds, and the
   same worker leaving at the same moment. The real window starts in a swarm that has
   trained a while, so the simulation runs ``SIM_WINDOWS`` windows, each after its own
   warm-up, and averages them.
4. **The comparison.** Tokens/s before the kill, after it, and over the whole window; the
   time until throughput was back to 90% of what it was (``recovery_times``, on 2 s buckets
   against the 20 s before the kill); real against simulated, with the ratio. A JSON file, a
   markdown table and a plot of both timelines go to ``--out``.

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
from collections.abc import Iterable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from swarmd.local_swarm import LocalDaemon, create_run, wait_for
from swarmd.models.build import build_model
from swarmd.models.presets import DEFAULT_RUN
from swarmd.models.shape import ModelShape
from swarmd.peers.election import coordination_round_s
from swarmd.peers.planning.plan_cost import Plan, stage_flops_per_sequence
from swarmd.peers.planning.scenario import Scenario, Shape, parse_scenario
from swarmd.peers.sim.churn import ChurnEvent
from swarmd.peers.sim.results import recovery_times
from swarmd.peers.sim.simulator import SimSettings, Simulation, Strategy
from swarmd.peers.sim.strategies import make_strategies

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script: the namespaces' helpers
from tests.integration.netns import EmulatedNetwork  # noqa: E402

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
LEASE_S = 30.0  # the daemon's worker lease (``PipelineWorker``'s ``lease_s``)

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
    server = subprocess.Popen([*net.prefix_for(dst), sys.executable, "-c", DATA_PATH_SERVER, net.ip(dst)],
                              stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert server.stdout is not None
        maddr = server.stdout.readline().strip()
        if "/p2p/" not in maddr:
            raise RuntimeError(f"the data path's server did not start: {maddr!r}")
        client = subprocess.run(
            [*net.prefix_for(src), sys.executable, "-c", DATA_PATH_CLIENT, net.ip(src), maddr, str(nbytes)],
            check=True, timeout=300, capture_output=True, text=True,
        )  # fmt: skip
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
    sink = subprocess.Popen([*net.prefix_for(1), sys.executable, "-c", GOODPUT_SINK, net.ip(1)],
                            stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert sink.stdout is not None and sink.stdout.readline().strip() == "listening"
        source = subprocess.run([*net.prefix_for(0), sys.executable, "-c", GOODPUT_SOURCE, net.ip(1), str(nbytes)],
                                check=True, timeout=120, capture_output=True, text=True)  # fmt: skip
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
    """Micro-batches finished at stage 0 per ``BUCKET_S`` from the start of the window."""


def model_shape() -> ModelShape:
    return ModelShape.from_dict(DEFAULT_RUN["model"])


def stage_param_bytes() -> float:
    """Bytes of the larger stage's weights as the hosts send them (float32)."""
    model = build_model(model_shape(), 0)
    total = sum(p.numel() for p in model.parameters())
    return 4.0 * total / DEFAULT_RUN["stages"]


def measure_tflops(processes: int, seconds: float) -> tuple[float, list[float]]:
    """Seconds per forward+backward micro-batch of the whole model, with ``processes`` copies
    running at once (the contention the daemons will meet), as effective TFLOPS per process."""
    procs = [subprocess.Popen([sys.executable, "-c", COMPUTE_PROBE, str(seconds)], stdout=subprocess.PIPE, text=True)
             for _ in range(processes)]  # fmt: skip
    per_step = [float(p.communicate(timeout=seconds + 120)[0].strip()) for p in procs]
    whole_model = np.array([float(model_shape().layers)])
    flops = float(stage_flops_per_sequence(calibration_scenario(1.0, [1e6, 1e6], [0.0, 0.0], 1.0), whole_model).sum())
    flops *= DEFAULT_RUN["batch"]["micro_batch"]
    return flops / statistics.median(per_step) / 1e12, per_step


def calibration_scenario(tflops: float, rates_Bps: list[float], access_latency_s: list[float],
                         efficiency: float | list[float]) -> Scenario:  # fmt: skip
    """The emulated swarm as a scenario: a link runs at the slower of its ends' shaped rates
    times their ``efficiency`` (the data path's goodput over the shaped rate, measured per
    device or once for all), and takes the sum of its ends' access latencies."""
    e = efficiency if isinstance(efficiency, list) else [efficiency] * len(rates_Bps)
    goodput = [rate * factor for rate, factor in zip(rates_Bps, e, strict=True)]
    shape, run = model_shape(), DEFAULT_RUN
    params = sum(p.numel() for p in build_model(shape, 0).parameters())
    n = len(rates_Bps)
    return parse_scenario({
        "name": "calibration",
        "devices": [{"id": f"d{i}", "tflops": tflops, "memory_gib": 8} for i in range(n)],
        "latency_s": [[0.0 if i == j else access_latency_s[i] + access_latency_s[j] for j in range(n)]
                      for i in range(n)],
        "bandwidth_Bps": [[None if i == j else min(goodput[i], goodput[j]) for j in range(n)] for i in range(n)],
        # Activations travel as float16 (the wire's dtype), weights and gradients as float32.
        "model": {"layers": shape.layers, "hidden": shape.hidden, "seq_len": shape.seq_len, "vocab": shape.vocab,
                  "params": float(params), "dtype_bytes": 2},
        "batch": {"sequences": run["batch"]["sequences"], "micro_batch": run["batch"]["micro_batch"]},
        "parallelism": {"stages": run["stages"], "data_parallel": max(1, n // run["stages"])},
        "cost": {"grad_bytes": 4.0 * params / run["stages"],
                 "activation_bytes": run["batch"]["sequences"] / max(1, n // run["stages"]) * shape.seq_len
                 * shape.hidden * 2},
    })  # fmt: skip


def summarize(timeline: list[int], kill_s: float, tokens_per_micro_batch: int) -> Side:
    rate = tokens_per_micro_batch / BUCKET_S
    k = int(kill_s // BUCKET_S)
    # the first buckets fill the pipeline (the simulator starts cold): the window before the
    # kill is its last WINDOW_BUCKETS buckets, the one after starts once recovery is over
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


def hosts_of(daemons: list[LocalDaemon]) -> dict[int, tuple[int, dict[str, Any]]]:
    found = {}
    for i, daemon in enumerate(daemons):
        if daemon.proc is None or daemon.proc.poll() is not None:
            continue
        status = daemon.status() or {}
        for stage, info in ((status.get("training") or {}).get("hosts") or {}).items():
            found[int(stage)] = (i, info)
    return found


def newest_plan(statuses: Iterable[dict[str, Any]]) -> dict[str, Any] | None:
    """The newest plan any daemon follows, as its status shows it."""
    plans = [p for st in statuses if (p := (st.get("swarm") or {}).get("plan"))]
    return max(plans, key=lambda p: p["version"]) if plans else None


def statuses_of(daemons: list[LocalDaemon]) -> dict[int, dict[str, Any]]:
    """The status of each daemon still running, by daemon index (one request each)."""
    return {i: d.status() or {} for i, d in enumerate(daemons) if d.proc is not None and d.proc.poll() is None}


def hosted_as_planned(daemons: list[LocalDaemon]) -> bool:
    """Whether every stage is hosted by the server the newest plan names for it, as in the
    simulation (the daemons hand a stage there once the plan has settled)."""
    statuses = statuses_of(daemons).values()
    plan = newest_plan(statuses)
    if plan is None:
        return False
    hosting = {int(stage): st.get("peer_id")
               for st in statuses for stage in (st.get("training") or {}).get("hosts") or {}}  # fmt: skip
    servers = plan["parameter_servers"]
    return bool(servers) and all(hosting.get(s) == server for s, server in enumerate(servers))


def plan_of(statuses: dict[int, dict[str, Any]]) -> dict[str, Any] | None:
    """The newest plan any daemon follows, by daemon index: the placement the simulation takes."""
    plan = newest_plan(statuses.values())
    index = {st.get("peer_id"): i for i, st in statuses.items()}
    if plan is None or not all(p in index for row in plan["grid"] for p in row):
        return None
    return {"pipelines": [[index[p] for p in row] for row in plan["grid"]],
            "layers_per_stage": plan["layers_per_stage"],
            "parameter_servers": [index[p] for p in plan["parameter_servers"]]}  # fmt: skip


def roles_of(statuses: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """Who hosts each stage, its standby (where its pushes are logged), and each daemon's
    reliability score as the others measured it (as daemon 0 sees them), by daemon index."""
    index = {st.get("peer_id"): i for i, st in statuses.items()}
    hosts, standbys = {}, {}
    for i, st in statuses.items():
        training = st.get("training") or {}
        for stage in training.get("hosting") or []:
            hosts[stage], standbys[stage] = i, index.get(training.get("standby"))
    scores = (((statuses.get(0) or {}).get("swarm") or {}).get("reliability")) or {}
    plan = newest_plan(statuses.values()) or {}
    return {"hosts": hosts, "standbys": standbys, "scores": {index[p]: v for p, v in scores.items() if p in index},
            "planned_servers": [index.get(p) for p in plan.get("parameter_servers") or []]}  # fmt: skip


def log_phases_of(daemon: LocalDaemon) -> dict[str, Any]:
    """How long the daemon took to log the pushes it received as a standby, by phase."""
    if daemon.proc is None or daemon.proc.poll() is not None:
        return {}
    return ((daemon.status() or {}).get("standby_copies") or {}).get("log_phases") or {}


def cpu_times() -> tuple[int, int]:
    """This machine's CPU time so far, in clock ticks: (busy, all) over every core."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle and iowait
    return sum(fields) - idle, sum(fields)


def busy_fraction(start: tuple[int, int], end: tuple[int, int]) -> float:
    """How busy the cores were between two ``cpu_times``: 1.0 is every core all the time. The
    emulated devices share this machine's cores; a simulated device has its own."""
    return (end[0] - start[0]) / max(1, end[1] - start[1])


def training_of(daemon: LocalDaemon) -> dict[str, Any]:
    """The daemon's training status, empty when it does not answer (not running, or killed)."""
    if daemon.proc is None or daemon.proc.poll() is not None:
        return {}
    return (daemon.status() or {}).get("training") or {}


def worker_ops(training: dict[str, Any]) -> dict[str, Any] | None:
    return (training.get("worker") or {}).get("requests_by_op")


WORK_COUNTS = ("tasks_forward", "tasks_backward", "tasks_last", "weight_pulls")


def worker_counts(training: dict[str, Any]) -> dict[str, int]:
    """The worker's tasks by kind and weight pulls so far (``swarmd status``)."""
    worker = training.get("worker") or {}
    tasks = worker.get("tasks") or {}
    return {**{f"tasks_{kind}": int(tasks.get(kind, 0)) for kind in ("forward", "backward", "last")},
            "weight_pulls": int(worker.get("weight_pulls", 0))}  # fmt: skip


def real_run(net: EmulatedNetwork, workdir: Path, seconds: float, kill_at: float, warmup_updates: int) -> dict:
    spec = workdir / "run.json"
    spec.write_text(json.dumps(DEFAULT_RUN))
    run_id = create_run(workdir / "d0", spec)
    flags = [*HEARTBEAT, "--no-benchmark", "--threads", "1", "--data-via-relay", "never", "--no-mdns",
             "--no-nat-port-map"]  # fmt: skip
    daemons = [
        LocalDaemon(
            workdir / f"d{i}",
            run_id,
            flags,
            network_args=["--host-maddrs", f"/ip4/{net.ip(i)}/tcp/0"],
            command_prefix=net.prefix_for(i),
        )  # fmt: skip
        for i in range(net.n)
    ]
    try:
        addrs = daemons[0].start().wait_running()["addrs"]
        for daemon in daemons[1:]:
            daemon.start(addrs)
        for daemon in daemons:
            daemon.wait_running()
        print("daemons running; waiting for each stage to be hosted by the plan's server, and the first updates",
              flush=True)  # fmt: skip
        # Stages move to the plan's servers once the plan has settled: the window starts
        # after that, in the swarm as it stays.
        try:
            wait_for(lambda: hosted_as_planned(daemons), 240, "each stage hosted by the plan's server")
        except TimeoutError:  # the planned servers cannot host, or hosting did not follow the plan
            print("the stages are not hosted by the plan's servers after 240 s; measuring anyway", flush=True)
        wait_for(lambda: min((info["version"] for _, info in hosts_of(daemons).values()), default=0)
                 >= warmup_updates, 300, f"{warmup_updates} updates")  # fmt: skip
        samples: list[tuple[float, int, int]] = []  # (t, stage-0 host, its micro_batches_finished)
        bytes_at_start = [net.interface_bytes(i) for i in range(net.n)]
        at_start = [training_of(d) for d in daemons]  # the window's requests are the counters' growth
        hosts_at_start = hosts_of(daemons)
        statuses = statuses_of(daemons)
        roles_at_start, plan_at_start = roles_of(statuses), plan_of(statuses)
        logs_at_start = [log_phases_of(d) for d in daemons]
        cpu_at_start = cpu_times()
        started = time.monotonic()
        victim = None
        first = hosts_at_start[0][0] if 0 in hosts_at_start else 0  # sampling asks stage 0's host alone
        while (t := time.monotonic() - started) < seconds:
            info = (training_of(daemons[first]).get("hosts") or {}).get("0")
            if info is None and (found := hosts_of(daemons).get(0)) is not None:
                first, info = found  # stage 0 changed hands
            if info is not None:
                samples.append((t, first, int(info["host"]["micro_batches_finished"])))
            if victim is None and t >= kill_at:
                hosting = {i for i, _ in hosts_of(daemons).values()}
                victim = max(set(range(net.n)) - hosting)
                last_words = training_of(daemons[victim])  # its counters, as close to the kill as can be
                daemons[victim].kill()
                print(f"killed d{victim} at {t:.1f} s (it hosted nothing)", flush=True)
            time.sleep(SAMPLE_S)  # sync-ok: the sampling interval of a measurement
        bytes_at_end = [net.interface_bytes(i) for i in range(net.n)]
        cpu_busy = busy_fraction(cpu_at_start, cpu_times())
        roles = {"start": roles_at_start, "end": roles_of(statuses_of(daemons))}
        standby_log_in_window = op_sums(
            op_delta(log_phases_of(d), start) for d, start in zip(daemons, logs_at_start, strict=True)
        )
        versions = [info["version"] for _, info in hosts_of(daemons).values()]
        # what each daemon did, to explain a difference: tasks, weight pulls, time spent where
        trainers = [training_of(d) for d in daemons]
        if victim is not None:
            trainers[victim] = last_words
        hosts_at_end = hosts_of(daemons)
        host_figures = {s: {"daemon": i, "host": info["host"], "server": info["server"],
                            "push_phases": info["push_phases"]} for s, (i, info) in hosts_at_end.items()}  # fmt: skip
        requests_in_window = op_sums(
            op_delta(worker_ops(end), worker_ops(start)) for start, end in zip(at_start, trainers, strict=True)
        )  # fmt: skip
        work_in_window = {
            key: sum(max(0, worker_counts(end)[key] - worker_counts(start)[key])
                     for start, end in zip(at_start, trainers, strict=True))
            for key in WORK_COUNTS
        }  # fmt: skip
        push_phases_in_window = op_sums(
            op_delta(info["push_phases"], hosts_at_start[s][1]["push_phases"]
                     if s in hosts_at_start and hosts_at_start[s][0] == i else None)
            for s, (i, info) in hosts_at_end.items()
        )  # fmt: skip
        timeline = [0] * int(np.ceil(seconds / BUCKET_S))
        for (_, h0, c0), (t1, h1, c1) in zip(samples, samples[1:], strict=False):
            if h0 == h1 and c1 >= c0:  # a stage that changed hands restarts its counter
                timeline[min(len(timeline) - 1, int(t1 // BUCKET_S))] += c1 - c0
        return {
            "timeline": timeline,
            "victim": victim,
            "versions": versions,
            "samples": len(samples),
            "workers": [t.get("worker") for t in trainers],
            "served": [t.get("served_by_op") for t in trainers],
            "hosts": host_figures,
            "requests_in_window": requests_in_window,
            "push_phases_in_window": push_phases_in_window,
            "work_in_window": work_in_window,
            "cpu_busy": cpu_busy,
            "roles": roles,
            "plan": plan_at_start,
            "standby_log_in_window": standby_log_in_window,
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
    print(f"compute: {args.devices} processes at once, {statistics.median(per_step) * 1e3:.0f} ms per micro-batch "
          f"(forward and backward) each: {tflops * 1e3:.2f} GFLOPS per device", flush=True)  # fmt: skip
    workdir = Path(tempfile.mkdtemp(prefix="swd-cal-", dir="/tmp"))
    net = EmulatedNetwork(f"swc{os.getpid()}", rates_Bps, rates_Bps, latency_s, workdir)
    # SIGTERM (a timeout, a CI runner) must unwind through the finally blocks too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        with net:
            goodput, standing_queue_s = measure_link(net, int(rate_Bps * 4))
            data_path = measure_data_path(net, int(rate_Bps * 4))
            print(f"links: d0 to d1 {rate_Bps / 1e6:.2f} MB/s shaped; one TCP stream gets {goodput / 1e6:.2f} MB/s "
                  "and keeps "
                  f"{standing_queue_s * 1e3:.0f} ms queued in the shaper; the daemons' data path gets "
                  f"{data_path.goodput_Bps / 1e6:.2f} MB/s, a small request takes {data_path.idle_rtt_s * 1e3:.0f} ms "
                  f"there and waits {data_path.connection_queue_s * 1e3:.0f} ms more behind a transfer on its "
                  "connection; the simulation takes the data path's goodput and both queues", flush=True)  # fmt: skip
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


def data_path_efficiency(net: EmulatedNetwork, rates_Bps: list[float], latency_s: list[float],
                         first: DataPath) -> list[float]:  # fmt: skip
    """Each device's data-path goodput over its shaped rate: measured from one device of each
    kind (rate and latency) to device 0 (device 1 for device 0's own kind, ``first``). A slower
    link with a longer round trip need not get the same share of its rate."""
    kinds: dict[tuple[float, float], float] = {(rates_Bps[0], latency_s[0]): first.goodput_Bps
                                                / min(rates_Bps[0], rates_Bps[1])}  # fmt: skip
    for i in range(1, net.n):
        kind = (rates_Bps[i], latency_s[i])
        if kind not in kinds:
            shaped = min(rates_Bps[i], rates_Bps[0])
            measured = measure_data_path(net, int(shaped * 4), src=i, dst=0)
            kinds[kind] = measured.goodput_Bps / shaped
            print(f"links: d{i} to d0 {shaped / 1e6:.2f} MB/s shaped; the data path gets "
                  f"{measured.goodput_Bps / 1e6:.2f} MB/s", flush=True)  # fmt: skip
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


def compare(args: argparse.Namespace, scenario: Scenario, tflops: float, real: dict) -> None:
    """Simulate the scenario for as long, with the worker killed in the real run leaving at the
    kill: ``SIM_WINDOWS`` windows, each after its own warm-up, averaged. The simulation starts
    from the placement the real daemons followed (their coordinator planned on the links it
    measured, which can differ from the emulated ones), and repairs it with swarmd's planner;
    it is also run from its own plan of the emulated links, and both are reported."""
    shape = Shape(DEFAULT_RUN["stages"], max(1, args.devices // DEFAULT_RUN["stages"]))
    (own,) = make_strategies(["swarmd"], shape, 0.5, 0)
    own_plan = own.full_plan(scenario)
    recorded = real.get("plan")
    if recorded:
        real_plan = Plan(pipelines=tuple(tuple(row) for row in recorded["pipelines"]),
                         layers_per_stage=tuple(recorded["layers_per_stage"]),
                         parameter_servers=tuple(recorded["parameter_servers"]))  # fmt: skip
        strategy = Strategy("swarmd on the real plan", lambda view: real_plan, own.mend, own.mend_live)
    else:  # a run recorded before the plan was kept
        real_plan, strategy = own_plan, own
    victim = real.get("victim")
    if victim is None:
        victim = max(set(range(args.devices)) - set(real_plan.parameter_servers))
    data_path = real.get("data_path") or {}
    settings = SimSettings(churn=False, detect_s=HEARTBEAT_TTL_S, join_s=5.0, lease_s=LEASE_S, bucket_s=BUCKET_S,
                           standing_queue_s=real.get("standing_queue_s", 0.0),
                           # beside a transfer on its connection a request also met both ends'
                           # standing queues, which the simulation adds on its own
                           # (a window of bytes: longer on a slower link)
                           connection_queue_bytes=max(0.0, data_path.get("loaded_rtt_s", 0.0)
                                                      - data_path.get("idle_rtt_s", 0.0)
                                                      - 2 * real.get("standing_queue_s", 0.0))
                           * float(scenario.bandwidth_Bps[0, 1]),
                           request_overhead_s=max(0.0, data_path.get("idle_rtt_s", 0.0)
                                                  - 2 * float(scenario.latency_s[0, 1])),
                           # the daemons' coordination rounds at their heartbeat, and no relays
                           coordinate_s=coordination_round_s(HEARTBEAT_INTERVAL_S), data_via_relay="never")  # fmt: skip
    tokens = DEFAULT_RUN["batch"]["micro_batch"] * model_shape().seq_len
    standbys = real_standbys(real) if recorded else {}
    windows = [
        simulate_window(scenario, strategy, settings, WARMUP_S + k * WARMUP_STEP_S, args, victim, standbys)
        for k in range(SIM_WINDOWS)
    ]
    simulated = [summarize(timeline, args.kill_at, tokens) for timeline, _ in windows]
    sides = {"real": summarize(real["timeline"], args.kill_at, tokens), "simulated": mean_side(simulated)}
    if recorded:
        own_windows = [
            summarize(simulate_window(scenario, own, settings, WARMUP_S + k * WARMUP_STEP_S, args, victim)[0],
                      args.kill_at, tokens)
            for k in range(SIM_WINDOWS)
        ]  # fmt: skip
        sides["simulated on its own plan"] = mean_side(own_windows)
    detail = {
        "plans": {
            "real": recorded,
            "own": {"pipelines": own_plan.pipelines, "parameter_servers": own_plan.parameter_servers},
        },  # fmt: skip
        "windows": [asdict(side) for side in simulated],
        "sent_MB": np.mean([d["sent_MB"] for _, d in windows], axis=0).round(1).tolist(),
        "received_MB": np.mean([d["received_MB"] for _, d in windows], axis=0).round(1).tolist(),
        "requests_by_op": op_mean([d["requests_by_op"] for _, d in windows]),
        "push_phases": op_mean([d["push_phases"] for _, d in windows]),
        "work": {key: statistics.mean(d["work"][key] for _, d in windows) for key in WORK_COUNTS},
        "roles": windows[0][1]["roles"],
        "standing_queue_s": settings.standing_queue_s,
        "connection_queue_bytes": settings.connection_queue_bytes,
        "request_overhead_s": settings.request_overhead_s,
    }
    report(args, sides, tflops, real, detail)


def real_standbys(real: dict[str, Any]) -> dict[int, list[int]]:
    """Each stage's standbys in the real run, at the window's start and then at its end: the
    simulation on the real placement takes them (the daemons chose them on the links they
    measured, which can differ from the emulated ones)."""
    roles = real.get("roles") or {}
    out: dict[int, list[int]] = {}
    for moment in ("start", "end"):
        for stage, standby in ((roles.get(moment) or {}).get("standbys") or {}).items():
            if standby is not None and int(standby) not in out.setdefault(int(stage), []):
                out[int(stage)].append(int(standby))
    return out


def simulate_window(scenario: Scenario, strategy: Any, settings: SimSettings, warm_s: float,
                    args: argparse.Namespace, victim: int,
                    standbys: dict[int, list[int]] | None = None) -> tuple[list[int], dict[str, Any]]:  # fmt: skip
    """A window of ``args.seconds`` after ``warm_s`` of simulated training (the real window
    starts in a swarm that has trained a while, too), with ``victim`` leaving ``args.kill_at``
    into it: the window's timeline, and the bytes and requests in it (the counters as they
    stood when the window began are taken off)."""
    churn = [ChurnEvent(warm_s + args.kill_at, victim, False)]
    sim = Simulation(scenario, strategy, replace(settings, hours=(warm_s + args.seconds) / 3600),
                     (np.ones(args.devices, dtype=bool), churn))  # fmt: skip
    sim.standby_preference = standbys or {}
    sim.advance(warm_s)
    sent, received, counts = sim.sent.copy(), sim.received.copy(), dict(sim.counts)
    requests, push_phases = sim.requests.status(), sim.push_phases.status()
    timeline = sim.run().timeline
    first = int(round(warm_s / BUCKET_S))
    return timeline[first : first + int(np.ceil(args.seconds / BUCKET_S))], {
        "sent_MB": ((sim.sent - sent) / 1e6).tolist(),
        "received_MB": ((sim.received - received) / 1e6).tolist(),
        "requests_by_op": op_delta(sim.requests.status(), requests),
        "push_phases": op_delta(sim.push_phases.status(), push_phases),
        "work": {key: sim.counts[key] - counts.get(key, 0) for key in WORK_COUNTS},
        "roles": {"hosts": {s: stage.host for s, stage in enumerate(sim.stages)},
                  "standbys": {s: stage.standby for s, stage in enumerate(sim.stages)}},
    }  # fmt: skip


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


def op_mean(parts: list[dict[str, dict[str, float]]]) -> dict[str, dict[str, float]]:
    """Per operation: the mean count per window, and the mean time over all of them."""
    summed = op_sums(parts)
    return {op: {"n": round(f["n"] / len(parts), 1), "mean_ms": f["mean_ms"]} for op, f in summed.items()}


def simulate_again(args: argparse.Namespace) -> int:
    """The simulated side only, against a real run recorded before (for work on the simulator)."""
    recorded = json.loads(args.real_from.read_text())
    for key in ("devices", "seconds", "kill_at"):
        setattr(args, key, float(recorded["args"][key]) if key != "devices" else int(recorded["args"][key]))
    args.rate_mbps, args.access_latency_ms = recorded["args"]["rate_mbps"], recorded["args"]["access_latency_ms"]
    args.out.mkdir(parents=True, exist_ok=True)
    rates_Bps = [v * 1e6 / 8 for v in per_device(args.rate_mbps, args.devices, "rate_mbps")]
    latency_s = [v / 1000 for v in per_device(args.access_latency_ms, args.devices, "access_latency_ms")]
    # Runs recorded before the data path was measured have only one TCP stream's goodput.
    data_path = recorded["real"].get("data_path") or {}
    shaped = min(rates_Bps[0], rates_Bps[1])
    goodput = data_path.get("goodput_Bps") or recorded["real"].get("goodput_Bps", shaped)
    efficiency = recorded["real"].get("efficiency") or goodput / shaped
    scenario = calibration_scenario(recorded["tflops"], rates_Bps, latency_s, efficiency)
    compare(args, scenario, recorded["tflops"], recorded["real"])
    return 0


def op_delta(end: dict[str, Any] | None, start: dict[str, Any] | None) -> dict[str, dict[str, float]]:
    """What an ``OpTimes`` status gained from ``start`` to ``end``: the operations in between."""
    out = {}
    for op, figures in (end or {}).items():
        before = (start or {}).get(op, {"n": 0, "mean_ms": 0.0})
        n = figures["n"] - before["n"]
        if n > 0:
            total = figures["n"] * figures["mean_ms"] - before["n"] * before["mean_ms"]
            out[op] = {"n": n, "mean_ms": round(max(0.0, total) / n, 1)}
    return out


def op_sums(parts: Iterable[dict[str, Any] | None], key: str | None = None) -> dict[str, dict[str, float]]:
    """Counts and mean times by operation (an ``OpTimes`` status, or each part's ``key`` of one)
    summed over the daemons' parts (those alive at the end)."""
    n: dict[str, int] = {}
    total: dict[str, float] = {}
    for part in parts:
        by_op = (part or {}).get(key) if key else part
        for op, figures in (by_op or {}).items():
            n[op] = n.get(op, 0) + figures["n"]
            total[op] = total.get(op, 0.0) + figures["n"] * figures["mean_ms"]
    return {op: {"n": n[op], "mean_ms": round(total[op] / n[op], 1)} for op in n if n[op]}


def links_lines(real: dict[str, Any], simulated: dict[str, Any]) -> list[str]:
    """What was measured of the links, and what the simulation took."""
    data_path = real.get("data_path")
    if not data_path:
        return []
    dp = DataPath(**data_path)
    return [
        f"Links: one TCP stream gets {real['goodput_Bps'] / 1e6:.2f} MB/s and keeps "
        f"{real['standing_queue_s'] * 1e3:.0f} ms queued in the shaper; the daemons' data path gets "
        f"{dp.goodput_Bps / 1e6:.2f} MB/s (the simulated links' rate), a small request takes "
        f"{dp.idle_rtt_s * 1e3:.0f} ms on an idle connection and {dp.loaded_rtt_s * 1e3:.0f} ms beside a transfer "
        f"on the same one (simulated: {simulated['connection_queue_bytes'] / 1e3:.0f} kB more, "
        f"{simulated['connection_queue_bytes'] / dp.goodput_Bps * 1e3:.0f} ms at that rate).",
        "",
    ]


NOT_SIMULATED: dict[str, dict[str, float]] = {}
"""The phases of a standby's logging: its link is simulated, its disk and checks are not."""


def roles_line(real: dict[str, Any], simulated: dict[str, Any]) -> str:
    """Where the stages were hosted and logged, real (at the window's start and end) and simulated."""

    def where(roles: dict[str, Any]) -> str:
        return ", ".join(f"stage {s} on d{h} (standby d{roles['standbys'].get(s)})"
                         for s, h in sorted(roles["hosts"].items(), key=lambda kv: int(kv[0])))  # fmt: skip

    scores = sorted(real["start"]["scores"].items(), key=lambda kv: int(kv[0]))
    servers = real["start"].get("planned_servers")
    named = f" (the real plan's servers: {', '.join(f'd{i}' for i in servers)})" if servers else ""
    return (f"Hosts: real {where(real['start'])} at the start{named}, {where(real['end'])} at the end; simulated "
            f"{where(simulated)}. Reliability as measured: {', '.join(f'd{i} {v}' for i, v in scores)}.")  # fmt: skip


def describe_plan(plan: dict[str, Any]) -> str:
    """A plan's stage groups and servers, by daemon index."""
    pipelines, servers = plan["pipelines"], plan["parameter_servers"]
    return "; ".join(
        f"stage {s} on {', '.join(f'd{row[s]}' for row in pipelines)} served by d{server}"
        for s, server in enumerate(servers)
    )


def report(args: argparse.Namespace, sides: dict[str, Side], tflops: float, real: dict,
           simulated: dict[str, Any]) -> None:  # fmt: skip
    r, s = sides["real"], sides["simulated"]
    windows = [w["tokens_per_s"] for w in simulated.get("windows") or [asdict(s)]]

    def ratio(a: float | None, b: float | None) -> str:
        return f"{b / a:.2f}" if a and b is not None else "-"

    def fmt(v: float | None) -> str:
        return "not back" if v is None else f"{v:,.1f}"

    rows = [("tokens/s over the window", r.tokens_per_s, s.tokens_per_s),
            ("tokens/s before the kill", r.before_kill, s.before_kill),
            ("tokens/s after recovery", r.after_kill, s.after_kill),
            ("recovery after the kill, s", r.recovery_s, s.recovery_s)]  # fmt: skip
    lines = [
        f"# Calibration: {args.devices} daemons, {args.rate_mbps} Mbit/s up and down each, "
        f"{args.access_latency_ms} ms one way to the switch each, {args.seconds:g} s with a kill at {args.kill_at:g} s",
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
    plans = simulated.get("plans") or {}
    if plans.get("real"):
        lines += ["", "The simulation starts from the plan the real daemons followed: stage groups "
                  + describe_plan(plans["real"]) + "; and takes the standbys they chose (at the start, "
                  "then at the end)."]  # fmt: skip
    own = sides.get("simulated on its own plan")
    if own is not None:
        lines += [
            "",
            "From its own plan of the emulated links instead (" + describe_plan(plans["own"]) + "), the simulation "
            f"makes {own.tokens_per_s:,.1f} tokens/s over the window ({ratio(r.tokens_per_s, own.tokens_per_s)} of "
            f"real), {own.before_kill:,.1f} before the kill and {own.after_kill:,.1f} after: what the real swarm "
            "would gain, or lose, had its coordinator measured the links as they are.",
        ]
    if "sent_MB" in real:  # what crossed each device's link: where the time went
        lines += ["", "| MB over the window | " + " | ".join(f"d{i}" for i in range(args.devices)) + " |",
                  "|---|" + "---:|" * args.devices]  # fmt: skip
        for key in ("sent_MB", "received_MB"):
            lines.append(f"| {key[:-3]}, real | " + " | ".join(f"{v:.1f}" for v in real[key]) + " |")
            lines.append(f"| {key[:-3]}, simulated | " + " | ".join(f"{v:.1f}" for v in simulated[key]) + " |")
    if "roles" in real:
        lines += ["", roles_line(real["roles"], simulated["roles"])]
    if "cpu_busy" in real:
        lines += ["", f"This machine's {os.cpu_count()} cores were {real['cpu_busy']:.0%} busy over the real window."]
    if real.get("work_in_window"):  # what the workers did for the micro-batches: where the bytes went
        finished = {"real": sum(r.timeline), "simulated": sum(s.timeline)}
        lines += ["", "| work in the window (all workers) | real | simulated | per micro-batch, real | "
                  "per micro-batch, simulated |", "|---|---:|---:|---:|---:|"]  # fmt: skip
        for key in WORK_COUNTS:
            a, b = real["work_in_window"][key], simulated["work"][key]
            lines.append(f"| {key.replace('_', ' ')} | {a} | {b:.1f} | {a / max(1, finished['real']):.2f} | "
                         f"{b / max(1, finished['simulated']):.2f} |")  # fmt: skip
    # Runs recorded before the window's own counts were kept have the daemons' whole lives.
    real_requests = real.get("requests_in_window") or op_sums(real.get("workers") or [], "requests_by_op")
    real_phases = real.get("push_phases_in_window") or op_sums(
        host.get("push_phases") for host in (real.get("hosts") or {}).values()
    )
    for title, real_ops, simulated_ops in (
        ("request in the window (all workers)", real_requests, simulated["requests_by_op"]),
        ("push at its host in the window (all hosts)", real_phases, simulated.get("push_phases", {})),
        ("push logged at a standby in the window", real.get("standby_log_in_window") or {}, NOT_SIMULATED),
    ):  # which requests the simulator makes faster than they are, and which part of a push
        if not real_ops:
            continue
        lines += [
            "",
            f"| {title} | real n | real mean ms | simulated n | simulated mean ms |",
            "|---|---:|---:|---:|---:|",
        ]
        for op in sorted(set(real_ops) | set(simulated_ops)):
            a, b = real_ops.get(op, {}), simulated_ops.get(op, {})
            lines.append(f"| {op} | {a.get('n', 0)} | {a.get('mean_ms', '-')} | {b.get('n', 0)} | "
                         f"{b.get('mean_ms', '-')} |")  # fmt: skip
    text = "\n".join(lines) + "\n"
    print(text)
    (args.out / "calibration.md").write_text(text)
    (args.out / "calibration.json").write_text(json.dumps({
        "args": {k: str(v) for k, v in vars(args).items()}, "tflops": tflops,
        "sides": {k: asdict(v) for k, v in sides.items()}, "real": real, "simulated": simulated,
    }, indent=1))  # fmt: skip
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(8, 3.5))
    tokens = DEFAULT_RUN["batch"]["micro_batch"] * model_shape().seq_len / BUCKET_S
    for name, side in sides.items():
        ax.plot([i * BUCKET_S for i in range(len(side.timeline))], [n * tokens for n in side.timeline], label=name)
    ax.axvline(args.kill_at, color="grey", linestyle="--", label="kill")
    ax.set(xlabel="seconds", ylabel="tokens/s", title="Real daemons against the simulator")
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.out / "calibration.png", dpi=120)
    print(f"wrote {args.out}/calibration.md, calibration.json, calibration.png")


if __name__ == "__main__":
    sys.exit(main())
