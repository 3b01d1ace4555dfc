"""daemon/node/rated_tflops.py: the rated dense bf16 TFLOPS of a device, by the name torch gives it."""

from __future__ import annotations

import pytest

from swarmd.node.rated_tflops import rated_tflops

pytestmark = pytest.mark.timeout(30)


@pytest.mark.parametrize(
    ("name", "rated"),
    [
        ("NVIDIA H100 80GB HBM3", 989.0),  # SXM5
        ("NVIDIA H100 PCIe", 756.0),
        ("NVIDIA H100 NVL", 835.0),
        ("NVIDIA H200", 989.0),
        ("NVIDIA H200 NVL", 835.0),
        ("NVIDIA A100-SXM4-80GB", 312.0),
        ("NVIDIA A100 80GB PCIe", 312.0),
        ("NVIDIA A10", 125.0),
        ("NVIDIA L4", 121.0),
        ("NVIDIA L40", 181.0),
        ("NVIDIA L40S", 362.0),
        ("NVIDIA GeForce RTX 3090", 71.0),
        ("NVIDIA GeForce RTX 4090", 165.2),
        ("NVIDIA GeForce RTX 5090", 209.5),
        ("Tesla V100-SXM2-16GB", 125.0),  # fp16: Volta has no bf16
        ("Tesla V100-PCIE-32GB", 112.0),
        ("Tesla T4", 65.0),
        ("AMD Instinct MI300X", 1307.4),
    ],
)
def test_known_devices_have_their_datasheets_dense_figure(name: str, rated: float) -> None:
    assert rated_tflops(name) == rated


@pytest.mark.parametrize(
    "name",
    [
        "NVIDIA A10G",  # no published figure
        "NVIDIA GeForce RTX 3090 Ti",  # another clock
        "NVIDIA GeForce RTX 4090 D",  # fewer SMs
        "NVIDIA GeForce RTX 4090 Laptop GPU",  # another chip
        "NVIDIA GeForce GTX 1080",
        "AMD EPYC 7B13 64-Core Processor",
        "",
    ],
)
def test_an_unknown_device_has_no_rated_figure_rather_than_a_guess(name: str) -> None:
    assert rated_tflops(name) is None


def test_a_cpu_has_no_rated_figure_whatever_its_name_reads_like() -> None:
    assert rated_tflops("NVIDIA H100 80GB HBM3", "cpu") is None
    assert rated_tflops("NVIDIA H100 80GB HBM3", "cuda") == 989.0
