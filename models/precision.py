"""Where and in what precision a cell computes: its device, autocast dtype, checkpointing, compile.

``ComputeSettings`` is what a cell is built with (``cell_compute.CellCompute``): the torch device
it computes on, the autocast dtype of its forward and backward ("bf16" or "fp32"; weights, the
global copy and optimizer state stay fp32 whatever it is), whether each decoder layer runs under
activation checkpointing, and whether the layers are compiled (``layer_runner``).

``resolve_precision`` turns the config's ``[compute] precision`` (auto, bf16, fp32) into the
dtype: "auto" is bf16 on a CUDA device that computes in it natively (Ampere and later; ROCm
through torch's CUDA API), fp32 elsewhere. fp32 stays the CPU default: most CPUs have no bf16
units (autocast then emulates it, slowly), and the CPU runs and tests compare against an fp32
reference. A CPU with AVX512-BF16 did measure bf16 faster (docs/data-path.md): there an
explicit "bf16" is worth its rounding.

Tensors cross between the wire (host memory) and the device here: ``to_device`` stages a host
tensor in pinned memory and copies it without blocking on CUDA, and ``to_host`` brings a result
back in fp32. ``start_device`` turns on TF32 matmuls once, when the first CUDA compute starts.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass

import torch

from swarmd.models.shape import ModelError

logger = logging.getLogger(__name__)

PRECISIONS = ("auto", "bf16", "fp32")
"""What ``[compute] precision`` may say."""
DTYPES = ("bf16", "fp32")
"""What a cell computes in (``ComputeSettings.dtype``)."""


@dataclass(frozen=True)
class ComputeSettings:
    """How a cell computes: on which device, in which autocast dtype, checkpointed, compiled."""

    device: str = "cpu"
    """A torch device string ("cpu", "cuda:0"): the module, the global copy, sums and optimizer live there."""
    dtype: str = "fp32"
    """The autocast dtype of forward and backward, "bf16" or "fp32"; master weights stay fp32."""
    checkpointing: bool = False
    """Recompute each decoder layer's activations in the backward instead of keeping them."""
    compile: bool = False
    """``torch.compile`` each decoder layer (falls back to eager, with a warning, if that fails)."""

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ModelError(f"compute dtype {self.dtype!r} is not one of {DTYPES}; resolve_precision() gives one")
        try:
            torch.device(self.device)
        except RuntimeError as e:
            raise ModelError(f"compute device {self.device!r} is not a torch device ('cpu', 'cuda:0'): {e}") from e

    @property
    def torch_device(self) -> torch.device:
        return torch.device(self.device)

    def autocast(self) -> AbstractContextManager[object]:
        """The context a cell's forward runs in: bf16 autocast, or a disabled one for fp32."""
        return torch.autocast(self.torch_device.type, dtype=torch.bfloat16, enabled=self.dtype == "bf16")


def cuda_supports_bf16(device: str) -> bool:
    """Whether ``device`` computes in bf16 natively (emulated bf16 is slower than fp32 with TF32)."""
    with torch.cuda.device(torch.device(device)):
        return bool(torch.cuda.is_bf16_supported(including_emulation=False))


def resolve_precision(precision: str, device: str, *, bf16_supported: Callable[[str], bool] | None = None) -> str:
    """The config's ``precision`` ("auto", "bf16", "fp32") on ``device`` as "bf16" or "fp32".

    "auto" is bf16 on a CUDA device that supports it natively (``bf16_supported``, by default
    asking torch), fp32 on the CPU and on older GPUs. An explicit "bf16" is taken as it is,
    on the CPU too (autocast runs there, if slowly)."""
    if precision not in PRECISIONS:
        raise ModelError(f"[compute] precision = {precision!r} is not one of {', '.join(PRECISIONS)}")
    if precision != "auto":
        return precision
    if torch.device(device).type != "cuda":
        return "fp32"
    supported = bf16_supported or cuda_supports_bf16
    return "bf16" if supported(device) else "fp32"


_fast_matmul_on = False


def start_device(device: torch.device) -> None:
    """Ready ``device`` for a cell's compute: on CUDA, fp32 matmuls in TF32 (once per process).

    TF32 keeps fp32's range with a 10-bit mantissa in the tensor cores, as torchtitan and
    nanoGPT run; it touches only what is left in fp32 under autocast (and an fp32 run's
    matmuls), never the global copy's exact adds, which are not matmuls."""
    global _fast_matmul_on
    if device.type != "cuda" or _fast_matmul_on:
        return
    torch.set_float32_matmul_precision("high")
    _fast_matmul_on = True
    logger.info("fp32 matmuls on %s run in TF32 (torch.set_float32_matmul_precision('high'))", device)


def copies_through_pinned_memory(source: torch.device, target: torch.device) -> bool:
    """Whether a copy from ``source`` to ``target`` goes through pinned host memory, non-blocking:
    host to a CUDA device (the DMA engine reads only page-locked memory asynchronously)."""
    return source.type == "cpu" and target.type == "cuda"


def to_device(x: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``x`` (from the wire, in host memory) on ``device``: through pinned memory and a
    non-blocking copy on CUDA (the stream orders it before the compute that reads it), the
    tensor itself where it is there already."""
    if x.device == device:
        return x
    if copies_through_pinned_memory(x.device, device):
        # The pinned buffer is returned to torch's host allocator only once the copy's stream
        # event has passed, so it may go out of scope here.
        return x.pin_memory().to(device, non_blocking=True)
    return x.to(device)


def to_host(x: torch.Tensor) -> torch.Tensor:
    """``x`` detached, in fp32, in host memory for the wire (the very tensor when it is already so)."""
    return x.detach().to("cpu", torch.float32)
