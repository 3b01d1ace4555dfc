"""The two ways through a calibration: the whole of it (devices, links, the real run, the
simulation and the report), or the simulated side again against a real run recorded before.

The whole calibration owns the emulated network's lifetime: every namespace and process it
makes is removed on the way out, also when a step fails or SIGTERM arrives, and namespaces
left behind make it fail.
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
from dataclasses import asdict
from pathlib import Path

from tests.benchmarks.calibration.measure import data_path_efficiency, measure_data_path, measure_link, measure_tflops
from tests.benchmarks.calibration.real_run import real_run
from tests.benchmarks.calibration.report import report
from tests.benchmarks.calibration.scenario import calibration_scenario, per_device
from tests.benchmarks.calibration.simulated import compare
from tests.integration.netns import EmulatedNetwork


def calibrate(args: argparse.Namespace) -> int:
    """The whole calibration, as the command line asks for it: 0 when done, 2 for bad input or
    no root, 1 when namespaces were left behind."""
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
    sides, simulated = compare(args, scenario, real)
    report(args, sides, tflops, real, simulated)
    return 0


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
    sides, simulated = compare(args, scenario, recorded["real"])
    report(args, sides, recorded["tflops"], recorded["real"], simulated)
    return 0
