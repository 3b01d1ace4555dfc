"""Is the simulator honest? Real daemons on emulated links against the simulator on the same swarm.

    sudo .venv/bin/python tests/benchmarks/calibrate_simulator.py --out calibration

1. **The devices.** This machine's compute, measured the way the daemons will meet it: as
   many processes as daemons, one torch thread each, timing forward and backward of the run's
   model at once; their rate becomes each device's ``tflops`` (the scenario's unit).
2. **The real swarm.** One network namespace per daemon on a bridge; ``tc tbf`` shapes each
   device's upload and download, and the data path's latency shim
   (``swarmd.peers.emulated_delay``; no ``netem`` here) adds the one-way latency. One TCP
   stream's goodput is measured, and the standing queue it keeps in the shaper's buffer (the
   delay it adds to other packets): the scenario and the simulation take both. The daemons
   train the default run; once both stages have their hosts, stage 0's finished micro-batches
   are sampled for ``--seconds``, and at ``--kill-at`` one worker that hosts nothing is killed
   (SIGKILL).
3. **The simulated swarm.** The same devices, links and model as a scenario file, simulated
   by ``swarmd.peers.simulator`` with swarmd's planner, the same number of seconds, and the
   same worker leaving at the same moment.
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
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from swarmd.local_swarm import LocalDaemon, create_run, wait_for
from swarmd.models.build import build_model
from swarmd.models.presets import DEFAULT_RUN
from swarmd.models.shape import ModelShape
from swarmd.peers.churn import ChurnEvent
from swarmd.peers.plan_cost import stage_flops_per_sequence
from swarmd.peers.scenario import Scenario, Shape, parse_scenario
from swarmd.peers.sim_strategies import make_strategies
from swarmd.peers.simulator import SimSettings, Simulation, recovery_times

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script: the namespaces' helpers
from tests.integration.netns import EmulatedNetwork  # noqa: E402

BUCKET_S = 2.0
WINDOW_BUCKETS = 10
HEARTBEAT = ["--heartbeat-interval", "1", "--heartbeat-ttl", "6"]
HEARTBEAT_TTL_S = 6.0
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
    flops = float(stage_flops_per_sequence(calibration_scenario(1.0, 2, 1e6, 0.0), whole_model).sum())
    flops *= DEFAULT_RUN["batch"]["micro_batch"]
    return flops / statistics.median(per_step) / 1e12, per_step


def calibration_scenario(tflops: float, devices: int, rate_Bps: float, access_latency_s: float) -> Scenario:
    shape, run = model_shape(), DEFAULT_RUN
    params = sum(p.numel() for p in build_model(shape, 0).parameters())
    n = devices
    return parse_scenario({
        "name": "calibration",
        "devices": [{"id": f"d{i}", "tflops": tflops, "memory_gib": 8} for i in range(n)],
        "latency_s": [[0.0 if i == j else 2 * access_latency_s for j in range(n)] for i in range(n)],
        "bandwidth_Bps": [[None if i == j else rate_Bps for j in range(n)] for i in range(n)],
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
        print("daemons running; waiting for two hosts and the first updates", flush=True)
        wait_for(lambda: len({i for i, _ in hosts_of(daemons).values()}) == 2, 180, "two daemons hosting a stage")
        wait_for(lambda: min((info["version"] for _, info in hosts_of(daemons).values()), default=0)
                 >= warmup_updates, 300, f"{warmup_updates} updates")  # fmt: skip
        samples: list[tuple[float, int, int]] = []  # (t, stage-0 host, its micro_batches_finished)
        bytes_at_start = [net.interface_bytes(i) for i in range(net.n)]
        started = time.monotonic()
        victim = None
        while (t := time.monotonic() - started) < seconds:
            hosts = hosts_of(daemons)
            if 0 in hosts:
                samples.append((t, hosts[0][0], int(hosts[0][1]["host"]["micro_batches_finished"])))
            if victim is None and t >= kill_at:
                hosting = {i for i, _ in hosts.values()}
                victim = max(set(range(net.n)) - hosting)
                daemons[victim].kill()
                print(f"killed d{victim} at {t:.1f} s (it hosted nothing)", flush=True)
            time.sleep(0.25)  # sync-ok: the sampling interval of a measurement
        bytes_at_end = [net.interface_bytes(i) for i in range(net.n)]
        versions = [info["version"] for _, info in hosts_of(daemons).values()]
        # what each daemon did, to explain a difference: tasks, weight pulls, time spent where
        trainers = [(d.status() or {}).get("training") or {} for d in daemons]
        hosts = {s: {"daemon": i, "host": info["host"], "server": info["server"], "push_phases": info["push_phases"]}
                 for s, (i, info) in
                 hosts_of(daemons).items()}  # fmt: skip
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
            "hosts": hosts,
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
    parser.add_argument("--rate-mbps", type=float, default=40.0, help="each device's upload and download")
    parser.add_argument("--access-latency-ms", type=float, default=10.0, help="one way; a link is two of these")
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
    rate_Bps, latency_s = args.rate_mbps * 1e6 / 8, args.access_latency_ms / 1000
    args.out.mkdir(parents=True, exist_ok=True)

    tflops, per_step = measure_tflops(args.devices, 10.0)
    print(f"compute: {args.devices} processes at once, {statistics.median(per_step) * 1e3:.0f} ms per micro-batch "
          f"(forward and backward) each: {tflops * 1e3:.2f} GFLOPS per device", flush=True)  # fmt: skip
    workdir = Path(tempfile.mkdtemp(prefix="swd-cal-", dir="/tmp"))
    net = EmulatedNetwork(f"swc{os.getpid()}", [rate_Bps] * args.devices, [rate_Bps] * args.devices,
                          [latency_s] * args.devices, workdir)  # fmt: skip
    # SIGTERM (a timeout, a CI runner) must unwind through the finally blocks too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        with net:
            goodput, standing_queue_s = measure_link(net, int(rate_Bps * 4))
            print(f"links: {rate_Bps / 1e6:.2f} MB/s shaped, {goodput / 1e6:.2f} MB/s measured for one TCP stream, "
                  f"which keeps {standing_queue_s * 1e3:.0f} ms queued in the shaper; the simulation takes both "
                  "measured figures", flush=True)  # fmt: skip
            real = real_run(net, workdir, args.seconds, args.kill_at, args.warmup_updates)
            real["goodput_Bps"], real["standing_queue_s"] = goodput, standing_queue_s
    finally:
        left = net.leftovers()
        subprocess.run(["rm", "-rf", str(workdir)], check=False)
    if left:
        print(f"calibrate_simulator: namespaces left behind: {left}", file=sys.stderr)
        return 1

    compare(args, calibration_scenario(tflops, args.devices, goodput, latency_s), tflops, real)
    return 0


def compare(args: argparse.Namespace, scenario: Scenario, tflops: float, real: dict) -> None:
    """Simulate the scenario for as long, with a worker that hosts nothing leaving at the kill."""
    shape = Shape(DEFAULT_RUN["stages"], max(1, args.devices // DEFAULT_RUN["stages"]))
    (strategy,) = make_strategies(["swarmd"], shape, 0.5, 0)
    plan = strategy.full_plan(scenario)
    victim = max(set(range(args.devices)) - set(plan.parameter_servers))
    up0 = np.ones(args.devices, dtype=bool)
    settings = SimSettings(hours=args.seconds / 3600, churn=False, detect_s=HEARTBEAT_TTL_S, join_s=5.0,
                           lease_s=LEASE_S, bucket_s=BUCKET_S,
                           standing_queue_s=real.get("standing_queue_s", 0.0))  # fmt: skip
    simulation = Simulation(scenario, strategy, settings, (up0, [ChurnEvent(args.kill_at, victim, False)]))
    sim = simulation.run()
    detail = {"sent_MB": (simulation.sent / 1e6).round(1).tolist(),
              "received_MB": (simulation.received / 1e6).round(1).tolist(),
              "requests_by_op": simulation.requests.status(),
              "push_phases": simulation.push_phases.status()}  # fmt: skip
    tokens = DEFAULT_RUN["batch"]["micro_batch"] * model_shape().seq_len
    sides = {
        "real": summarize(real["timeline"], args.kill_at, tokens),
        "simulated": summarize(sim.timeline[: len(real["timeline"])], args.kill_at, tokens),
    }
    report(args, sides, tflops, real, sim.staleness, detail)


def simulate_again(args: argparse.Namespace) -> int:
    """The simulated side only, against a real run recorded before (for work on the simulator)."""
    recorded = json.loads(args.real_from.read_text())
    for key in ("devices", "rate_mbps", "access_latency_ms", "seconds", "kill_at"):
        setattr(args, key, float(recorded["args"][key]) if key != "devices" else int(recorded["args"][key]))
    args.out.mkdir(parents=True, exist_ok=True)
    rate_Bps = recorded["real"].get("goodput_Bps", args.rate_mbps * 1e6 / 8)
    scenario = calibration_scenario(recorded["tflops"], args.devices, rate_Bps, args.access_latency_ms / 1000)
    compare(args, scenario, recorded["tflops"], recorded["real"])
    return 0


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


def report(args: argparse.Namespace, sides: dict[str, Side], tflops: float, real: dict, staleness: dict,
           simulated: dict[str, Any]) -> None:  # fmt: skip
    r, s = sides["real"], sides["simulated"]

    def ratio(a: float | None, b: float | None) -> str:
        return f"{b / a:.2f}" if a and b is not None else "-"

    def fmt(v: float | None) -> str:
        return "not back" if v is None else f"{v:,.1f}"

    rows = [("tokens/s over the window", r.tokens_per_s, s.tokens_per_s),
            ("tokens/s before the kill", r.before_kill, s.before_kill),
            ("tokens/s after recovery", r.after_kill, s.after_kill),
            ("recovery after the kill, s", r.recovery_s, s.recovery_s)]  # fmt: skip
    lines = [
        f"# Calibration: {args.devices} daemons, {args.rate_mbps:g} Mbit/s up and down each, "
        f"{2 * args.access_latency_ms:g} ms one way between two, {args.seconds:g} s with a kill at {args.kill_at:g} s",
        "",
        f"Devices measured at {tflops * 1e3:.2f} GFLOPS each ({args.devices} processes at once, one thread each).",
        "",
        "| figure | real | simulated | simulated / real |",
        "|---|---:|---:|---:|",
        *(f"| {name} | {fmt(a)} | {fmt(b)} | {ratio(a, b)} |" for name, a, b in rows),
    ]
    if "sent_MB" in real:  # what crossed each device's link: where the time went
        lines += ["", "| MB over the window | " + " | ".join(f"d{i}" for i in range(args.devices)) + " |",
                  "|---|" + "---:|" * args.devices]  # fmt: skip
        for key in ("sent_MB", "received_MB"):
            lines.append(f"| {key[:-3]}, real | " + " | ".join(f"{v:.1f}" for v in real[key]) + " |")
            lines.append(f"| {key[:-3]}, simulated | " + " | ".join(f"{v:.1f}" for v in simulated[key]) + " |")
    real_phases = op_sums(host.get("push_phases") for host in (real.get("hosts") or {}).values())
    for title, real_ops, simulated_ops in (
        ("request (all workers)", op_sums(real.get("workers") or [], "requests_by_op"), simulated["requests_by_op"]),
        ("push at its host (all hosts)", real_phases, simulated.get("push_phases", {})),
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
        "sides": {k: asdict(v) for k, v in sides.items()}, "real": real, "simulated_staleness": staleness,
        "simulated": simulated,
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
