"""Tensors on the wire: frames in fp32, fp16, bf16 or int8, checked against what is expected.

A frame is exactly ``sizes.frame_bytes(elements, codec, ndim)`` bytes, the size the planner
and the simulator charge (a unit test ties the two):

    magic "SWF1" | codec (u8, index in sizes.CODECS) | ndim (u8) | reserved (u16, 0)
    | dims (ndim x u32) | payload

all little endian. The payload of fp32, fp16 and bf16 is the values; that of int8 is one fp32
scale per block of ``sizes.INT8_BLOCK`` consecutive elements of the flattened tensor (its
absolute maximum over 127), then one int8 per element. Encoding refuses values the codec
cannot carry (NaN, infinities, fp16 overflow) rather than send what the receiver must refuse.

Everything a peer sends is hostile until checked: ``decode_tensor`` reads the frame's codec
and shape, compares them and the exact length with the ``FrameSpec`` the plan expects, and
only then allocates; the values must be finite (a NaN would poison every weight downstream)
and, if the spec bounds them, within ``max_abs``. Decoded tensors are fp32.

``ErrorFeedback`` keeps, per key (a shard, say), what rounding left out of the last frame and
adds it to the next one, so that a lossy codec's error is repaid instead of accumulating.
"""

from __future__ import annotations

import math
import struct
import sys
import warnings
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

import torch

from swarmd.peers.wire.errors import FrameError
from swarmd.peers.wire.sizes import CODECS, DIM_BYTES, FRAME_HEADER_BYTES, INT8_BLOCK, frame_bytes

MAGIC = b"SWF1"
MAX_NDIM = 8
MAX_DIM = 2**32 - 1
INT8_MAX = 127
_CHUNK_ROWS = 4096
"""Blocks quantised at a time (4 MiB of fp32): the scaled values stay in cache."""
FLOAT_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}

if sys.byteorder != "little":  # frames are little endian and copied without swapping
    raise ImportError("swarmd's tensor frames support little-endian hosts only")

_quiet = False
"""Whether torch has given its once-per-process warning about views of immutable bytes."""


def _view(frame: bytes, dtype: torch.dtype, offset: int, count: int) -> torch.Tensor:
    """A view of a peer's bytes, converted into a tensor of our own before use (never written
    to nor kept), so torch's warning about it is silenced; it warns once, so once is enough."""
    global _quiet
    if _quiet:
        return torch.frombuffer(frame, dtype=dtype, offset=offset, count=count)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given buffer is not writable", category=UserWarning)
        view = torch.frombuffer(frame, dtype=dtype, offset=offset, count=count)
    _quiet = isinstance(frame, bytes)  # the warning came (and went) only for immutable bytes
    return view


@dataclass(frozen=True)
class FrameSpec:
    """What a frame must be: its shape, the codecs accepted, and optionally a bound on values."""

    shape: tuple[int, ...]
    codecs: tuple[str, ...] = CODECS
    max_abs: float | None = None
    what: str = "tensor"
    """Names the tensor in errors: "the activation into stage 3"."""

    @classmethod
    def activation(cls, model: Any, stage: int, micro_batch: int, codecs: tuple[str, ...] = CODECS) -> FrameSpec:
        """The hidden states into ``stage`` (or their gradient) of one micro-batch of ``model``
        (a ``swarmd.models.shape.ModelShape``: its ``seq_len`` and ``hidden``)."""
        return cls((micro_batch, model.seq_len, model.hidden), codecs, what=f"the activation into stage {stage}")

    @classmethod
    def vector(cls, elements: int, codec: str | None = None) -> FrameSpec:
        """A flat slice of ``elements`` values, in ``codec`` (any when None)."""
        return cls((elements,), CODECS if codec is None else (codec,), what=f"a {elements}-element slice")


def _check_codec(codec: str) -> int:
    if codec not in CODECS:
        raise FrameError(f"codec {codec!r} is not one of {', '.join(CODECS)}")
    return CODECS.index(codec)


def _finite(t: torch.Tensor) -> bool:
    """Whether every value is finite: one pass without a mask (``isfinite().all()`` allocates a
    bool per value and costs 40x more here); the minimum and the maximum carry any NaN."""
    if not t.numel():
        return True
    low, high = torch.aminmax(t)
    return math.isfinite(float(low)) and math.isfinite(float(high))


def _quantize(flat: torch.Tensor, codec: str, keep_sent: bool) -> tuple[list[torch.Tensor], torch.Tensor | None]:
    """The payload's parts (in order) and, when ``keep_sent``, the values the frame stands for
    (in the codec's type)."""
    if codec in FLOAT_DTYPES:
        q = flat.to(FLOAT_DTYPES[codec])
        if not _finite(q):
            why = "NaN or infinite values" if codec == "fp32" or not _finite(flat) else "overflow"
            raise FrameError(f"a tensor with {why} cannot travel as {codec}; check the values (or use fp32/bf16)")
        return [q], q
    n = flat.numel()
    x = flat.to(torch.float32)
    # The whole blocks as rows, then the last partial block: no padded copy of the tensor.
    whole = n - n % INT8_BLOCK
    rows = ([x[:whole].view(-1, INT8_BLOCK)] if whole else []) + ([x[whole:].view(1, -1)] if whole < n else [])
    # |x|'s maximum per block without a copy of |x| (amax and amin apart are 5x faster than
    # aminmax by rows here); a NaN stays a NaN through both and through maximum.
    absmax = torch.cat([torch.maximum(r.amax(dim=1), r.amin(dim=1).neg_()) for r in rows]) if n else x.new_zeros(0)
    if not _finite(absmax):
        raise FrameError("a tensor with NaN or infinite values cannot travel as int8; check the values")
    scale = absmax / INT8_MAX
    inverse = torch.where(absmax > 0, INT8_MAX / absmax, torch.zeros_like(absmax))
    q = torch.empty(n, dtype=torch.int8, device=x.device)
    sent = torch.empty(n, dtype=torch.float32, device=x.device) if keep_sent else None
    scratch = x.new_empty(min(n, _CHUNK_ROWS * INT8_BLOCK))  # reused: no page faults on a fresh tensor
    start, block = 0, 0
    for r in rows:
        for first in range(0, r.shape[0], _CHUNK_ROWS):  # in cache-sized chunks
            part = r[first : first + _CHUNK_ROWS]
            count, blocks = part.numel(), slice(block + first, block + first + part.shape[0])
            scaled = torch.mul(part, inverse[blocks, None], out=scratch[:count].view_as(part)).round_()
            q[start : start + count].view_as(part).copy_(scaled)  # integral already: the cast is exact
            if sent is not None:
                sent[start : start + count].view_as(part).copy_(scaled).mul_(scale[blocks, None])
            start += count
        block += r.shape[0]
    return [scale, q], sent


def _frame(x: torch.Tensor, codec: str, keep_sent: bool = False) -> tuple[bytearray, torch.Tensor | None]:
    code = _check_codec(codec)
    if not x.dtype.is_floating_point:
        raise FrameError(f"cannot send a {x.dtype} tensor; frames carry floating-point values")
    if x.dim() > MAX_NDIM or any(d > MAX_DIM for d in x.shape):
        raise FrameError(
            f"tensor of shape {list(x.shape)} has over {MAX_NDIM} dimensions or a dimension over {MAX_DIM}"
        )
    flat = x.detach().reshape(-1)
    parts, sent = _quantize(flat, codec, keep_sent)
    ndim = x.dim()
    out = bytearray(frame_bytes(flat.numel(), codec, ndim))
    struct.pack_into(f"<4sBBH{ndim}I", out, 0, MAGIC, code, ndim, 0, *x.shape)
    offset = FRAME_HEADER_BYTES + DIM_BYTES * ndim
    for part in parts:
        size = part.numel() * part.element_size()
        if size:  # copied straight from the tensor's device into the frame
            torch.frombuffer(out, dtype=torch.uint8, offset=offset, count=size).copy_(
                part.contiguous().view(torch.uint8)
            )
        offset += size
    return out, sent


def encode_tensor(x: torch.Tensor, codec: str) -> bytearray:
    """``x`` as a frame in ``codec`` (module doc): built in place, in one allocation, so it is a
    bytearray (a blob like any other to the RPC layer); copying it into ``bytes`` would cost
    as much again."""
    return _frame(x, codec)[0]


def encode_vector(x: torch.Tensor, codec: str) -> bytearray:
    """A flat slice (any tensor, flattened) as a one-dimensional frame."""
    return encode_tensor(x.reshape(-1), codec)


def decode_tensor(frame: bytes, spec: FrameSpec, *, device: torch.device | str | None = None) -> torch.Tensor:
    """Check ``frame`` against ``spec`` and return it in fp32 (on ``device``; the CPU when None)."""
    if len(frame) < FRAME_HEADER_BYTES or frame[:4] != MAGIC:
        raise FrameError(f"{spec.what}: not a tensor frame (bad magic)")
    code, ndim, reserved = struct.unpack_from("<BBH", frame, 4)
    if code >= len(CODECS) or reserved:
        raise FrameError(f"{spec.what}: frame has codec code {code} and reserved bits {reserved}; not a known frame")
    codec = CODECS[code]
    if codec not in spec.codecs:
        raise FrameError(f"{spec.what}: frame is {codec}; expected {' or '.join(spec.codecs)}")
    if ndim > MAX_NDIM or len(frame) < FRAME_HEADER_BYTES + DIM_BYTES * ndim:
        raise FrameError(f"{spec.what}: frame of {len(frame)} bytes is too short for {ndim} dimensions")
    shape = struct.unpack_from(f"<{ndim}I", frame, FRAME_HEADER_BYTES)
    if tuple(shape) != tuple(spec.shape):
        raise FrameError(f"{spec.what}: frame has shape {list(shape)}; expected {list(spec.shape)}")
    n = math.prod(shape)
    if len(frame) != frame_bytes(n, codec, ndim):
        raise FrameError(
            f"{spec.what}: frame is {len(frame)} bytes; {n} values in {codec} take {frame_bytes(n, codec, ndim)}"
        )
    offset = FRAME_HEADER_BYTES + DIM_BYTES * ndim
    target = torch.device("cpu") if device is None else torch.device(device)
    if not n:
        return torch.zeros(shape, dtype=torch.float32, device=target)
    if codec in FLOAT_DTYPES:
        values = _view(frame, FLOAT_DTYPES[codec], offset, n).to(target)
        out = values.to(torch.float32, copy=True)  # our own memory, never the peer's bytes
    else:
        blocks = math.ceil(n / INT8_BLOCK)
        scale = _view(frame, torch.float32, offset, blocks).to(target)
        if not bool(torch.isfinite(scale).all()) or bool((scale < 0).any()):
            raise FrameError(f"{spec.what}: int8 frame has negative, NaN or infinite scales")
        q = _view(frame, torch.int8, offset + 4 * blocks, n).to(target)
        out = q.to(torch.float32)
        whole = (n // INT8_BLOCK) * INT8_BLOCK
        out[:whole].view(-1, INT8_BLOCK).mul_(scale[: n // INT8_BLOCK, None])
        if whole < n:
            out[whole:].mul_(scale[-1])
    if codec in FLOAT_DTYPES and not _finite(out):
        raise FrameError(f"{spec.what}: holds NaN or infinite values; refused so that it cannot poison training")
    if spec.max_abs is not None and float(out.abs().max()) > spec.max_abs:
        raise FrameError(f"{spec.what}: values up to {float(out.abs().max()):.3g}, over the bound {spec.max_abs:g}")
    return out.view(shape)


def decode_vector(frame: bytes, elements: int, codec: str | None = None) -> torch.Tensor:
    """A one-dimensional frame of ``elements`` values (in ``codec``, any when None), in fp32."""
    return decode_tensor(frame, FrameSpec.vector(elements, codec))


class ErrorFeedback:
    """Per key, the rounding a lossy codec left out, added to the next tensor sent under that
    key (Seide et al. 2014; Karimireddy et al. 2019): the sum of what arrives tracks the sum of
    what was meant, whatever the codec."""

    def __init__(self, codec: str = "int8") -> None:
        _check_codec(codec)
        self.codec = codec
        self._residuals: dict[Hashable, torch.Tensor] = {}

    def encode(self, key: Hashable, x: torch.Tensor, codec: str | None = None) -> bytearray:
        """The frame of ``x`` plus the residual kept for ``key``, in ``codec`` (this helper's
        by default); keeps what this frame leaves out."""
        target = x.detach().to(torch.float32)
        residual = self._residuals.get(key)
        if residual is not None:
            if residual.shape != target.shape:
                raise FrameError(
                    f"error feedback for {key!r}: shape {list(target.shape)}, the residual's "
                    f"{list(residual.shape)}; reset the key when the tensor changes"
                )
            target = target + residual
        frame, sent = _frame(target, codec or self.codec, keep_sent=True)
        assert sent is not None
        self._residuals[key] = (target - sent.view(target.shape).to(torch.float32)).detach()
        return frame

    def residual(self, key: Hashable) -> torch.Tensor | None:
        return self._residuals.get(key)

    def put_back(self, key: Hashable, residual: torch.Tensor | None) -> None:
        """A frame of ``key`` was not used after all: its residual goes back to what it was
        before (``residual(key)`` then), so that its rounding is not carried twice."""
        if residual is None:
            self._residuals.pop(key, None)
        else:
            self._residuals[key] = residual

    def reset(self, key: Hashable | None = None) -> None:
        """Forget the residual of ``key`` (of every key when None): the tensor it belonged to is gone."""
        if key is None:
            self._residuals.clear()
        else:
            self._residuals.pop(key, None)
