"""daemon/training/run_facts.py: the settings a peer's cells compute with, from its device and config."""

from __future__ import annotations

import pytest

from swarmd.models.build import ModelError
from swarmd.models.precision import ComputeSettings
from swarmd.training.run_facts import compute_settings

pytestmark = pytest.mark.timeout(30)


def test_compute_settings_take_the_resolved_device_and_the_config() -> None:
    assert compute_settings("cpu") == ComputeSettings(device="cpu", dtype="fp32")  # auto on the CPU
    assert compute_settings("cpu", "bf16", compile=True) == ComputeSettings(device="cpu", dtype="bf16", compile=True)
    assert not compute_settings("cpu", "bf16").checkpointing  # the plan's choice, per cell
    with pytest.raises(ModelError, match="precision = 'half' is not one of"):
        compute_settings("cpu", "half")
