"""daemon/node/device_offer.py: the speed this peer offers the planner, and what its heartbeat and
status say of its device probe (the presence that signs them imports hivemind: not here)."""

from __future__ import annotations

import asyncio
import time

import pytest

from swarmd.config import ComputeConfig, LimitsConfig
from swarmd.models.presets import DEFAULT_RUN
from swarmd.node.device_offer import DeviceOffer
from swarmd.peers.records.heartbeat import DeviceInfo, Heartbeat
from swarmd.peers.records.identity import Identity
from swarmd.peers.records.run_spec import parse_spec_body

pytestmark = pytest.mark.timeout(60)

RUN_ID = "test-run.abcdefghijklmnopqrstuvwx"


def heartbeat(offer: DeviceOffer) -> Heartbeat:
    """A heartbeat carrying the offer, signed and read back as a member would read it."""
    identity, now = Identity.generate(), time.time()
    fields = offer.heartbeat_fields()
    hb = Heartbeat(
        run_id=RUN_ID,
        peer_id=identity.peer_id,
        issued_at=now,
        expires_at=now + 30,
        addrs=[],
        device=offer.device,
        version="0.1.0",
        roles=["worker"],
        uptime_s=1.0,
        **fields,
    )
    return Heartbeat.parse(hb.sign(identity), run_id=RUN_ID, now=now)


def test_before_a_measurement_the_offer_is_the_rated_figure_and_the_heartbeat_says_none() -> None:
    offer = DeviceOffer(share=lambda: 1.0)
    offer.device = DeviceInfo(kind="cuda", name="NVIDIA H100 80GB HBM3", memory_bytes=80 * 2**30, cpus=16)
    offer.rated_tflops = 989.0
    assert offer.tflops() == 989.0
    hb = heartbeat(offer)
    assert hb.throughput_gflops == 0.0 and hb.precision == "" and hb.free_memory_bytes == 0
    assert offer.status() == {"achieved_tflops": None, "rated_tflops": 989.0, "of_rated": None, "cpu_share": 1.0}


def test_a_measured_figure_is_offered_times_the_cpu_share() -> None:
    offer = DeviceOffer(share=lambda: 0.5)
    offer.achieved_tflops, offer.rated_tflops = 400.0, 989.0
    assert offer.tflops() == 200.0 and heartbeat(offer).throughput_gflops == 200_000.0
    status = offer.status()
    assert status["achieved_tflops"] == 400.0 and status["of_rated"] == round(400 / 989, 4)
    assert status["cpu_share"] == 0.5


def test_the_probe_runs_generic_then_at_the_runs_shapes_and_the_heartbeat_carries_it() -> None:
    offer = DeviceOffer(share=lambda: 1.0)
    compute, limits = ComputeConfig(device="cpu"), LimitsConfig(torch_threads=1)
    asyncio.run(offer.measure(compute, limits, None))
    assert offer.probe is not None and not offer.probe.run_shapes and offer.probe.threads == 1
    assert offer.rated_tflops is None and offer.achieved_tflops > 0  # a CPU has no rated figure
    asyncio.run(offer.measure(compute, limits, parse_spec_body(dict(DEFAULT_RUN))))
    assert offer.probe.run_shapes and offer.tflops() == offer.achieved_tflops
    hb = heartbeat(offer)
    assert hb.throughput_gflops == pytest.approx(offer.achieved_tflops * 1000)
    assert hb.precision == "fp32" and hb.free_memory_bytes == offer.probe.free_memory_bytes > 0
    status = offer.status()
    assert status["run_shapes"] and status["threads"] == 1 and status["seconds"] == round(offer.probe.seconds, 2)


def test_without_benchmark_nothing_is_measured() -> None:
    offer = DeviceOffer()
    asyncio.run(offer.measure(ComputeConfig(device="cpu", benchmark=False), LimitsConfig(), None))
    assert offer.probe is None and offer.tflops() == 0.0 and offer.device.kind == "cpu"
    assert heartbeat(offer).throughput_gflops == 0.0
