"""What an accelerator is rated at: dense bf16 tensor TFLOPS by device name, from the vendors' sheets.

A rated figure is what the silicon could do in the best case, not what a cell achieves (the
probe, ``swarmd.node.compute_probe``, measures that). It serves twice: as the denominator of the
model FLOPs utilisation (MFU) that ``doctor`` and the GPU check report, and as a member's speed
before its probe has measured one (``swarmd.node.swarm_view``). Figures are dense (2:4
sparsity's doubled figure is never used) and, on the GeForce cards, with fp32 accumulation,
which is what autocast's matmuls do. Cards without bf16 tensor cores (V100, T4) carry their fp16
tensor figure. A name not in the table has no rated figure: None, never a guess.
"""

from __future__ import annotations

import re

RATED_BF16_TFLOPS: tuple[tuple[str, float], ...] = (
    # Data-centre parts: NVIDIA's datasheets (nvidia.com/en-us/data-center/<part>/), which print
    # the sparse figure with an asterisk; halved here. H100 SXM 1,979*, PCIe 1,513*, NVL 1,671*;
    # H200 SXM 1,979*, NVL 1,671*; B200 4,500* (HGX B200: 36 PFLOPS* for 8); A100 312 dense;
    # A10 125; A40 149.7; L4 242*; L40 362*; L40S 733*.
    (r"\bH100\b.*\bPCIe\b", 756.0),
    (r"\bH100\b.*\bNVL\b", 835.0),
    (r"\bH100\b", 989.0),  # SXM5: "NVIDIA H100 80GB HBM3"
    (r"\bH200\b.*\bNVL\b", 835.0),
    (r"\bH200\b", 989.0),
    (r"\bB200\b", 2250.0),
    (r"\bA100\b", 312.0),
    (r"\bA10\b", 125.0),  # not the A10G, whose figures AWS does not publish
    (r"\bA40\b", 149.7),
    (r"\bL40S\b", 362.0),
    (r"\bL40\b", 181.0),
    (r"\bL4\b", 121.0),
    # Volta and Turing have no bf16: their fp16 tensor figure (V100 datasheet: SXM2 125, PCIe
    # 112, V100S 130; T4 datasheet: 65).
    (r"\bV100S\b", 130.0),
    (r"\bV100\b.*\bPCIE\b", 112.0),
    (r"\bV100\b", 125.0),
    (r"\bT4\b", 65.0),
    # GeForce: NVIDIA's architecture whitepapers (Ampere GA102 appendix A, Ada AD102 appendix A,
    # RTX Blackwell GB202), "peak BF16 tensor TFLOPS with FP32 accumulate", dense. The Ti, D and
    # laptop parts are other chips or other clocks: left out.
    (r"\bRTX 3090\b(?!\s*(Ti|D|Laptop)\b)", 71.0),
    (r"\bRTX 4090\b(?!\s*(Ti|D|Laptop)\b)", 165.2),
    (r"\bRTX 5090\b(?!\s*(Ti|D|Laptop)\b)", 209.5),
    # AMD Instinct through ROCm (torch's CUDA API names them so): AMD's datasheets, dense bf16.
    (r"\bMI300X\b", 1307.4),
    (r"\bMI250X\b", 383.0),
)
"""(pattern on the device's name, rated dense TFLOPS), the first match wins: more specific first."""

_COMPILED = tuple((re.compile(pattern, re.IGNORECASE), tflops) for pattern, tflops in RATED_BF16_TFLOPS)


def rated_tflops(device_name: str, kind: str = "cuda") -> float | None:
    """The rated dense bf16 TFLOPS of the accelerator named ``device_name`` (as torch names it),
    or None for a device the table does not know. ``kind`` is the device's (``DeviceInfo.kind``):
    a CPU has no rated figure, whatever its name reads like."""
    if kind != "cuda":
        return None
    for pattern, tflops in _COMPILED:
        if pattern.search(device_name):
            return tflops
    return None
