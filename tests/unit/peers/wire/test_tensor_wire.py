"""peers/wire/tensors.py: frames round-trip, and every malformed or unexpected frame is refused."""

from __future__ import annotations

import struct

import pytest
import torch

from swarmd.peers.wire.tensors import MAGIC, TensorSpec, WireError, decode_tensor, encode_tensor

pytestmark = pytest.mark.timeout(30)

ACT = TensorSpec((2, 4, 8), floating=True)
IDS = TensorSpec((2, 4), floating=False)


@pytest.mark.parametrize("wire, tol", [("fp32", 0.0), ("fp16", 1e-3), ("bf16", 1e-2)])
def test_float_round_trip(wire: str, tol: float) -> None:
    x = torch.randn(ACT.shape)
    y = decode_tensor(encode_tensor(x, wire), ACT)
    assert y.dtype == torch.float32 and y.shape == x.shape
    assert torch.allclose(x, y, rtol=tol, atol=tol)


def test_half_precision_halves_the_bytes() -> None:
    x = torch.randn(ACT.shape)
    header = len(MAGIC) + 2 + 4 * x.dim()
    assert len(encode_tensor(x, "fp32")) - header == x.numel() * 4
    assert len(encode_tensor(x, "fp16")) - header == x.numel() * 2
    assert len(encode_tensor(x, "bf16")) - header == x.numel() * 2


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_ids_round_trip(dtype: torch.dtype) -> None:
    ids = torch.randint(0, 256, IDS.shape, dtype=dtype)
    assert torch.equal(decode_tensor(encode_tensor(ids), IDS), ids)


def test_non_contiguous_and_empty() -> None:
    x = torch.randn(8, 4, 2).transpose(0, 2)  # (2, 4, 8), not contiguous
    assert torch.allclose(decode_tensor(encode_tensor(x, "fp32"), ACT), x)
    empty = TensorSpec((0, 3), floating=True)
    assert decode_tensor(encode_tensor(torch.empty(0, 3), "fp16"), empty).shape == (0, 3)


def test_wrong_shape_refused() -> None:
    with pytest.raises(WireError, match="the plan expects"):
        decode_tensor(encode_tensor(torch.randn(2, 4, 9)), ACT)


def test_ids_where_floats_expected_refused() -> None:
    with pytest.raises(WireError, match="the plan expects"):
        decode_tensor(encode_tensor(torch.zeros(ACT.shape, dtype=torch.int64)), ACT)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_refused(bad: float) -> None:
    x = torch.randn(ACT.shape)
    x[1, 2, 3] = bad
    with pytest.raises(WireError, match="NaN or Inf"):
        decode_tensor(encode_tensor(x, "fp32"), ACT)


def test_fp16_overflow_is_refused_not_smuggled_as_inf() -> None:
    x = torch.full(ACT.shape, 1e6)  # beyond fp16's range: becomes Inf on the wire
    with pytest.raises(WireError, match="NaN or Inf"):
        decode_tensor(encode_tensor(x, "fp16"), ACT)


def test_truncated_and_padded_frames_refused() -> None:
    frame = encode_tensor(torch.randn(ACT.shape))
    with pytest.raises(WireError, match="needs"):
        decode_tensor(frame[:-1], ACT)
    with pytest.raises(WireError, match="needs"):
        decode_tensor(frame + b"\x00", ACT)
    with pytest.raises(WireError, match="shorter than its header"):
        decode_tensor(frame[:8], ACT)


@pytest.mark.parametrize(
    "frame, message",
    [
        (b"", "bad magic"),
        (b"NOPE\x01\x00", "bad magic"),
        (MAGIC + b"\x09\x00", "unknown dtype code"),
        (MAGIC + b"\x01\x09", "dimensions"),
    ],
)
def test_garbage_refused(frame: bytes, message: str) -> None:
    with pytest.raises(WireError, match=message):
        decode_tensor(frame, ACT)


def test_oversized_frame_refused_before_parsing() -> None:
    with pytest.raises(WireError, match="over the 100-byte limit"):
        decode_tensor(encode_tensor(torch.randn(ACT.shape)), ACT, max_bytes=100)


def test_huge_declared_shape_cannot_force_an_allocation() -> None:
    # A header claiming a giant tensor with no data: refused on the shape check, nothing allocated.
    frame = MAGIC + struct.pack("<BB3I", 1, 3, 2**31, 2**31, 2**31)
    with pytest.raises(WireError, match="shape"):
        decode_tensor(frame, ACT)


def test_bad_wire_dtype_and_unsendable_dtype() -> None:
    with pytest.raises(WireError, match="wire dtype"):
        encode_tensor(torch.randn(2), "fp8")
    with pytest.raises(WireError, match="cannot send"):
        encode_tensor(torch.zeros(2, dtype=torch.bool))
