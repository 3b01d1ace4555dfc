"""[limits] applied live: what changed, what a reload applies, what needs a restart."""

from __future__ import annotations

import dataclasses
import logging

import pytest

from swarmd.config import Config, LimitsConfig, SwarmConfig
from swarmd.node.limits import live as limits_module
from swarmd.node.limits.live import LiveLimits, gpu_memory_fraction, reload_changes
from swarmd.training.cells.throttle import ComputeLimits

pytestmark = pytest.mark.timeout(30)


def test_a_reload_applies_limits_and_names_the_rest_as_needing_a_restart() -> None:
    old = Config()
    new = Config(
        limits=LimitsConfig(cpu_share=0.5, windows=["22:00-07:00"]),
        swarm=SwarmConfig(run_id=old.swarm.run_id, join_timeout_s=old.swarm.join_timeout_s + 5),
    )
    new.node.log_level = "debug"
    live, restart = reload_changes(old, new)
    assert live == ["windows", "cpu_share"]
    assert restart == ["node.log_level", "swarm.join_timeout_s"]
    assert reload_changes(old, Config()) == ([], [])


def test_the_gpu_memory_fraction() -> None:
    total = 24 << 30
    assert gpu_memory_fraction(0, total) == 1.0
    assert gpu_memory_fraction(6, total) == pytest.approx(0.25)
    assert gpu_memory_fraction(48, total) == 1.0  # a cap over the device is no cap


def test_apply_sets_the_share_at_once_and_logs_one_line_a_key(caplog: pytest.LogCaptureFixture) -> None:
    compute = ComputeLimits()
    live = LiveLimits(LimitsConfig(), compute)
    live.start()
    assert compute.share == 1.0
    with caplog.at_level(logging.INFO, logger="swarmd.node.limits.live"):
        lines = live.apply(LimitsConfig(cpu_share=0.5, in_use_idle_s=60.0))
    assert lines == ["[limits] in_use_idle_s: 180.0 -> 60.0", "[limits] cpu_share: 1.0 -> 0.5"]
    assert compute.share == 0.5
    assert caplog.text.count("Applied [limits]") == 2
    assert live.apply(LimitsConfig(cpu_share=0.5, in_use_idle_s=60.0)) == []
    status = live.status()
    assert status["cpu_share"] == 0.5 and status["applied"]["cpu_share"] == 0.5


def test_threads_and_gpu_memory_apply_once_compute_starts() -> None:
    pytest.importorskip("torch")
    compute = ComputeLimits()
    live = LiveLimits(LimitsConfig(torch_threads=1), compute)
    assert live.status()["applied"]["torch_threads"] is None
    live.start_compute("cpu")
    try:
        assert compute.threads == 1 and compute.cores == 1  # on a CPU the share meters its CPU time
        assert live.status()["applied"]["gpu_memory"] == "does not apply: compute runs on the CPU"
        assert live.status()["applied"]["gpu_memory_peak_bytes"] is None
        live.apply(LimitsConfig(torch_threads=0))  # back to torch's default
        assert compute.threads == live._default_threads and compute.threads >= 1
        assert compute.cores == compute.threads
        live.apply(LimitsConfig(torch_threads=0, gpu_memory_gib=4))
        assert "does not apply" in live.status()["applied"]["gpu_memory"]
    finally:
        import torch

        torch.set_num_threads(live._default_threads)


def test_traffic_caps_go_to_the_shaper(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[LimitsConfig] = []
    monkeypatch.setattr(limits_module, "apply_traffic_limits", seen.append)
    live = LiveLimits(LimitsConfig(), ComputeLimits())
    live.start()
    capped = dataclasses.replace(LimitsConfig(), upload_mbit_s=20.0)
    live.apply(capped)
    live.apply(dataclasses.replace(capped, cpu_share=0.9))  # no traffic key changed
    assert seen == [LimitsConfig(), capped]
