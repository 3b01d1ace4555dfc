"""daemon/node/presence.py: the speed this peer offers the planner, and what its heartbeat and
status say of its device probe."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import pytest

from swarmd.config import ComputeConfig, HeartbeatConfig, LimitsConfig
from swarmd.models.presets import DEFAULT_RUN
from swarmd.node.presence import Presence
from swarmd.peers.records.heartbeat import DeviceInfo, Heartbeat
from swarmd.peers.records.identity import Identity
from swarmd.peers.records.run_spec import parse_spec_body

pytestmark = pytest.mark.timeout(60)

RUN_ID = "test-run.abcdefghijklmnopqrstuvwx"


def presence(share: float = 1.0) -> Presence:
    lan = SimpleNamespace(listen_maddrs=[])
    membership = SimpleNamespace(join_token="", refusals=dict, snapshot=lambda now: [])
    dht = SimpleNamespace(restarts=0)
    p = Presence(RUN_ID, Identity.generate(), dht, membership, lan, HeartbeatConfig(), list, time.time())  # type: ignore[arg-type]
    p.compute_share = lambda: share
    return p


def heartbeat(p: Presence) -> Heartbeat:
    return Heartbeat.parse(p.sign_heartbeat(), run_id=RUN_ID, now=time.time())


def test_before_a_measurement_the_offer_is_the_rated_figure_and_the_heartbeat_says_none() -> None:
    p = presence()
    p.device = DeviceInfo(kind="cuda", name="NVIDIA H100 80GB HBM3", memory_bytes=80 * 2**30, cpus=16)
    p.rated_tflops = 989.0
    assert p.offer() == (989.0, 80.0)
    hb = heartbeat(p)
    assert hb.throughput_gflops == 0.0 and hb.precision == "" and hb.free_memory_bytes == 0
    assert p.status(time.time())["probe"] == {
        "achieved_tflops": None,
        "rated_tflops": 989.0,
        "of_rated": None,
        "cpu_share": 1.0,
    }


def test_a_measured_figure_is_offered_times_the_cpu_share() -> None:
    p = presence(share=0.5)
    p.achieved_tflops, p.rated_tflops = 400.0, 989.0
    assert p.offered_tflops() == 200.0
    assert heartbeat(p).throughput_gflops == 200_000.0
    probe = p.status(time.time())["probe"]
    assert probe["achieved_tflops"] == 400.0 and probe["of_rated"] == round(400 / 989, 4)


def test_the_probe_runs_generic_then_at_the_runs_shapes_and_the_heartbeat_carries_it() -> None:
    p = presence()
    compute, limits = ComputeConfig(device="cpu"), LimitsConfig(torch_threads=1)
    asyncio.run(p.measure_device(compute, limits))
    assert p.probe is not None and not p.probe.run_shapes and p.probe.threads == 1
    assert p.rated_tflops is None and p.achieved_tflops > 0  # a CPU has no rated figure
    asyncio.run(p.measure_device(compute, limits, parse_spec_body(dict(DEFAULT_RUN))))
    assert p.probe.run_shapes and p.offer()[0] == p.achieved_tflops
    hb = heartbeat(p)
    assert hb.throughput_gflops == pytest.approx(p.achieved_tflops * 1000)
    assert hb.precision == "fp32" and hb.free_memory_bytes == p.probe.free_memory_bytes > 0
    status = p.status(time.time())["probe"]
    assert status["run_shapes"] and status["threads"] == 1 and status["seconds"] == round(p.probe.seconds, 2)


def test_without_benchmark_nothing_is_measured() -> None:
    p = presence()
    asyncio.run(p.measure_device(ComputeConfig(device="cpu", benchmark=False), LimitsConfig()))
    assert p.probe is None and p.offer()[0] == 0.0 and p.device.kind == "cpu"
