"""What this machine and its emulated links give the daemons, measured before the real run.

The scenario's devices and links take these figures rather than the configured ones: a
device's ``tflops`` is what a daemon's process gets while the others run too, and a link's
bandwidth is what the daemons' own data path gets through the shaper, below the shaped rate
by the overheads of TCP, libp2p and swarmd's framing.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from dataclasses import dataclass

import numpy as np

from swarmd.models.presets import DEFAULT_RUN
from swarmd.peers.planning.plan_cost import stage_flops_per_sequence
from tests.benchmarks.calibration.probes import (
    COMPUTE_PROBE,
    DATA_PATH_CLIENT,
    DATA_PATH_SERVER,
    GOODPUT_SINK,
    GOODPUT_SOURCE,
)
from tests.benchmarks.calibration.scenario import calibration_scenario, model_shape
from tests.integration.netns import EmulatedNetwork


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
