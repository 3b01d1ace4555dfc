"""Tensors on the wire: a small self-describing frame, checked against the plan before use.

A frame is ``SWT1`` | dtype code (1 byte) | ndim (1 byte) | dims (ndim x uint32, little
endian) | the raw little-endian data. Activations and gradients travel as fp16 or bf16 (half
the bytes of fp32) and are widened to fp32 on arrival; token ids as int32 or int64.

Everything a peer sends is hostile until checked: the frame's length must match its header
exactly, the shape and dtype must be what the plan expects for that stage (a peer cannot make
us allocate an arbitrary tensor), and floating-point data must be finite (a NaN or Inf would
poison the weights of everyone downstream).
"""

from __future__ import annotations

import struct
import sys
from dataclasses import dataclass
from typing import Any

import torch

from swarmd.errors import SwarmdError

MAGIC = b"SWT1"
MAX_NDIM = 8
# One micro-batch's activations of a large model fit easily; anything bigger is refused unread.
DEFAULT_MAX_FRAME_BYTES = 256 * 1024 * 1024

_CODES: dict[torch.dtype, int] = {
    torch.float32: 1,
    torch.float16: 2,
    torch.bfloat16: 3,
    torch.int64: 4,
    torch.int32: 5,
}
_DTYPES = {code: dtype for dtype, code in _CODES.items()}
WIRE_FLOAT_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}

if sys.byteorder != "little":  # the frame is little endian and copied without swapping
    raise ImportError("swarmd's tensor wire format supports little-endian hosts only")


class WireError(SwarmdError):
    """A tensor frame was malformed, oversized, or not what the plan expects."""


@dataclass(frozen=True)
class TensorSpec:
    """What the plan says a tensor must be: its shape, and whether it holds floats or ids."""

    shape: tuple[int, ...]
    floating: bool

    @classmethod
    def like(cls, spec: Any) -> TensorSpec:
        """The wire's view of a stage tensor spec (anything with ``shape`` and a torch ``dtype``)."""
        return cls(tuple(spec.shape), spec.dtype.is_floating_point)

    def describe(self) -> str:
        return f"{'float' if self.floating else 'integer'} tensor of shape {list(self.shape)}"


def encode_tensor(tensor: torch.Tensor, wire_dtype: str = "fp16") -> bytes:
    """Frame ``tensor``: floats are cast to ``wire_dtype`` (fp32, fp16 or bf16); ints keep theirs."""
    if tensor.dtype.is_floating_point:
        if wire_dtype not in WIRE_FLOAT_DTYPES:
            raise WireError(f"wire dtype {wire_dtype!r} is not one of {', '.join(WIRE_FLOAT_DTYPES)}")
        tensor = tensor.detach().to(WIRE_FLOAT_DTYPES[wire_dtype])
    elif tensor.dtype not in (torch.int64, torch.int32):
        raise WireError(f"cannot send a {tensor.dtype} tensor; floats, int32 and int64 only")
    if tensor.dim() > MAX_NDIM:
        raise WireError(f"tensor has {tensor.dim()} dimensions, over {MAX_NDIM}")
    tensor = tensor.detach().cpu().contiguous()
    header = MAGIC + struct.pack(f"<BB{tensor.dim()}I", _CODES[tensor.dtype], tensor.dim(), *tensor.shape)
    data = tensor.reshape(-1).view(torch.uint8).numpy().tobytes() if tensor.numel() else b""
    return header + data


def decode_tensor(frame: bytes, expected: TensorSpec, *, max_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> torch.Tensor:
    """Check ``frame`` against ``expected`` and return it (floats widened to fp32)."""
    if len(frame) > max_bytes:
        raise WireError(f"tensor frame is {len(frame)} bytes, over the {max_bytes}-byte limit")
    if len(frame) < len(MAGIC) + 2 or frame[: len(MAGIC)] != MAGIC:
        raise WireError("not a tensor frame (bad magic)")
    code, ndim = frame[len(MAGIC)], frame[len(MAGIC) + 1]
    dtype = _DTYPES.get(code)
    if dtype is None:
        raise WireError(f"tensor frame has unknown dtype code {code}")
    if ndim > MAX_NDIM:
        raise WireError(f"tensor frame has {ndim} dimensions, over {MAX_NDIM}")
    header_len = len(MAGIC) + 2 + 4 * ndim
    if len(frame) < header_len:
        raise WireError("tensor frame is shorter than its header")
    shape = struct.unpack_from(f"<{ndim}I", frame, len(MAGIC) + 2)
    if tuple(shape) != tuple(expected.shape):
        raise WireError(f"tensor has shape {list(shape)}; the plan expects {expected.describe()}")
    if dtype.is_floating_point != expected.floating:
        raise WireError(f"tensor is {dtype}; the plan expects a {expected.describe()}")
    itemsize = torch.empty((), dtype=dtype).element_size()
    numel = 1
    for dim in shape:
        numel *= dim
    if len(frame) != header_len + numel * itemsize:
        raise WireError(
            f"tensor frame is {len(frame)} bytes; a {dtype} tensor of shape {list(shape)} needs "
            f"{header_len + numel * itemsize}"
        )
    data = bytearray(frame[header_len:])  # writable: torch.frombuffer warns on read-only memory
    tensor = torch.frombuffer(data, dtype=dtype).reshape(shape) if numel else torch.empty(shape, dtype=dtype)
    if dtype.is_floating_point:
        tensor = tensor.to(torch.float32)
        if not bool(torch.isfinite(tensor).all()):
            raise WireError("tensor holds NaN or Inf values; refused so that it cannot poison training")
    return tensor
