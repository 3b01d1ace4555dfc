"""daemon/node/device.py: the device's free memory, and the precision its cells compute in."""

from __future__ import annotations

import pytest

from swarmd.node.device import free_memory_bytes, meminfo_available_bytes

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
