"""daemon/node/device.py: the device's free memory, and the precision its cells compute in."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from swarmd.errors import ConfigError
from swarmd.node.device import _resolve_precision, compute_dtype, free_memory_bytes, meminfo_available_bytes

pytestmark = pytest.mark.timeout(30)

MEMINFO = """MemTotal:       16303412 kB
MemFree:          824012 kB
MemAvailable:    9123456 kB
Buffers:          512340 kB
"""


def test_free_memory_on_a_cpu_is_the_kernels_available_memory() -> None:
    assert meminfo_available_bytes(MEMINFO) == 9123456 * 1024
    assert meminfo_available_bytes("MemTotal: 1 kB\n") == 0  # a kernel before 3.14 says none
    assert free_memory_bytes("cpu") > 0


def test_auto_is_fp32_on_a_cpu_and_an_explicit_precision_stands() -> None:
    assert _resolve_precision("auto", "cpu") == "fp32"
    assert _resolve_precision("bf16", "cpu") == "bf16" and _resolve_precision("fp32", "cuda:0") == "fp32"
    with pytest.raises(ConfigError, match="'fp16' is not one of auto, bf16, fp32"):
        _resolve_precision("fp16", "cpu")


def test_a_config_from_before_compute_precision_reads_as_auto() -> None:
    assert compute_dtype(SimpleNamespace(device="cpu"), "cpu") == "fp32"
    assert compute_dtype(SimpleNamespace(device="cpu", precision="bf16"), "cpu") == "bf16"
