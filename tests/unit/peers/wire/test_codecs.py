"""peers/wire/codecs.py: frames of exactly the size the planner charges, their precision, the
checks a peer's frame must pass, and error feedback."""

from __future__ import annotations

import struct

import pytest
import torch

from swarmd.peers.wire.codecs import (
    MAGIC,
    ErrorFeedback,
    FrameSpec,
    decode_tensor,
    decode_vector,
    encode_tensor,
    encode_vector,
)
from swarmd.peers.wire.errors import FrameError
from swarmd.peers.wire.sizes import CODECS, INT8_BLOCK, frame_bytes

pytestmark = pytest.mark.timeout(60)

SHAPES = [(), (0,), (1,), (INT8_BLOCK,), (INT8_BLOCK + 1,), (3, 7, 300), (2, 1, 1, 5)]


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_a_frame_is_exactly_the_size_the_planner_charges(codec: str, shape: tuple[int, ...]) -> None:
    x = torch.randn(shape)
    frame = encode_tensor(x, codec)
    assert len(frame) == frame_bytes(x.numel(), codec, x.dim())
    y = decode_tensor(frame, FrameSpec(shape))
    assert y.dtype == torch.float32 and tuple(y.shape) == shape


def test_each_codec_keeps_the_precision_it_promises() -> None:
    torch.manual_seed(1)
    x = torch.randn(5, 1000) * torch.logspace(-3, 2, 1000)  # magnitudes over five decades
    spec = FrameSpec(tuple(x.shape))
    assert torch.equal(decode_tensor(encode_tensor(x, "fp32"), spec), x)
    assert torch.equal(decode_tensor(encode_tensor(x, "fp16"), spec), x.half().float())
    assert torch.equal(decode_tensor(encode_tensor(x, "bf16"), spec), x.bfloat16().float())
    y = decode_tensor(encode_tensor(x, "int8"), spec)
    # int8: each value within half a step of its block's scale (absmax / 127)
    flat, back = x.reshape(-1), y.reshape(-1)
    for start in range(0, flat.numel(), INT8_BLOCK):
        block = flat[start : start + INT8_BLOCK]
        step = float(block.abs().max()) / 127
        assert float((block - back[start : start + INT8_BLOCK]).abs().max()) <= step / 2 * (1 + 1e-5) + 1e-12


def test_a_zero_block_stays_zero_in_int8() -> None:
    x = torch.zeros(2 * INT8_BLOCK + 3)
    x[-1] = 5.0
    y = decode_vector(encode_vector(x, "int8"), x.numel(), "int8")
    assert torch.equal(y[: 2 * INT8_BLOCK], torch.zeros(2 * INT8_BLOCK)) and float(y[-1]) == pytest.approx(5.0)


@pytest.mark.parametrize("codec", CODECS)
def test_values_a_codec_cannot_carry_are_refused_when_encoding(codec: str) -> None:
    for bad in (float("nan"), float("inf")):
        with pytest.raises(FrameError, match="NaN or infinite"):
            encode_tensor(torch.tensor([1.0, bad]), codec)
    with pytest.raises(FrameError, match="floating-point"):
        encode_tensor(torch.tensor([1, 2]), codec)


def test_fp16_overflow_is_refused_and_bf16_carries_it() -> None:
    x = torch.tensor([1.0, 1e6])
    with pytest.raises(FrameError, match="overflow"):
        encode_tensor(x, "fp16")
    assert float(decode_vector(encode_tensor(x, "bf16"), 2)[1]) == pytest.approx(1e6, rel=1e-2)


def _frame(codec: str = "fp16", shape: tuple[int, ...] = (2, 3)) -> bytearray:
    # Seeded: the frames name the parametrized cases, which must be the same in every process
    # that collects them (pytest-xdist's workers).
    return bytearray(encode_tensor(torch.randn(shape, generator=torch.Generator().manual_seed(0)), codec))


@pytest.mark.parametrize(
    ("frame", "spec", "why"),
    [
        (b"SWT1" + bytes(20), FrameSpec((2, 3)), "bad magic"),
        (b"", FrameSpec((2, 3)), "bad magic"),
        (MAGIC + bytes([9, 1, 0, 0]) + bytes(8), FrameSpec((1,)), "codec code 9"),
        (MAGIC + bytes([1, 1, 1, 0]) + bytes(8), FrameSpec((1,)), "reserved bits 1"),
        (MAGIC + bytes([1, 40, 0, 0]), FrameSpec((1,)), "too short for 40 dimensions"),
        (bytes(_frame("fp16")), FrameSpec((2, 3), ("int8",)), "frame is fp16; expected int8"),
        (bytes(_frame("fp16")), FrameSpec((3, 2)), r"shape \[2, 3\]; expected \[3, 2\]"),
        (bytes(_frame("fp16")), FrameSpec((2, 3, 1)), "shape"),
        (bytes(_frame("fp16"))[:-1], FrameSpec((2, 3)), "frame is 27 bytes; 6 values in fp16 take 28"),
        (bytes(_frame("fp16")) + b"\0", FrameSpec((2, 3)), "29 bytes"),
        (bytes(_frame("int8"))[:-2], FrameSpec((2, 3)), "take"),
    ],
)
def test_a_frame_that_is_not_what_was_expected_is_refused_before_use(frame: bytes, spec: FrameSpec, why: str) -> None:
    with pytest.raises(FrameError, match=why):
        decode_tensor(frame, spec)


def test_a_huge_claimed_shape_is_refused_by_its_length_without_allocating() -> None:
    frame = MAGIC + struct.pack("<BBH2I", 0, 2, 0, 2**31, 2**31)  # 2**62 fp32 values claimed, none sent
    with pytest.raises(FrameError, match="take"):
        decode_tensor(frame, FrameSpec((2**31, 2**31)))


@pytest.mark.parametrize("codec", ["fp32", "fp16", "bf16"])
def test_non_finite_values_in_a_peers_frame_are_refused(codec: str) -> None:
    frame = _frame(codec, (4,))
    item = {"fp32": 4, "fp16": 2, "bf16": 2}[codec]
    nan = {"fp32": struct.pack("<f", float("nan")), "fp16": b"\x00\x7e", "bf16": b"\xc0\x7f"}[codec]
    frame[-item:] = nan
    with pytest.raises(FrameError, match="NaN or infinite values"):
        decode_tensor(bytes(frame), FrameSpec((4,)))


def test_a_bad_int8_scale_is_refused() -> None:
    for scale in (-1.0, float("nan"), float("inf")):
        frame = _frame("int8", (4,))
        frame[12:16] = struct.pack("<f", scale)  # the first block's scale follows the 12-byte header
        with pytest.raises(FrameError, match="scales"):
            decode_tensor(bytes(frame), FrameSpec((4,)))


def test_a_bound_on_values_is_enforced() -> None:
    frame = encode_tensor(torch.tensor([0.5, -3.0]), "fp32")
    assert decode_tensor(frame, FrameSpec((2,), max_abs=3.0)).tolist() == [0.5, -3.0]
    with pytest.raises(FrameError, match="over the bound 2"):
        decode_tensor(frame, FrameSpec((2,), max_abs=2.0))


def test_specs_for_activations_and_slices() -> None:
    class Shape:
        seq_len, hidden = 16, 32

    spec = FrameSpec.activation(Shape(), 3, 4, ("fp16", "int8"))
    assert spec.shape == (4, 16, 32) and spec.codecs == ("fp16", "int8") and "stage 3" in spec.what
    with pytest.raises(FrameError, match="stage 3: frame is bf16"):
        decode_tensor(encode_tensor(torch.randn(4, 16, 32), "bf16"), spec)
    x = torch.randn(3, 5)
    assert torch.equal(decode_vector(encode_vector(x, "fp32"), 15, "fp32"), x.reshape(-1))
    with pytest.raises(FrameError, match="expected fp16"):
        decode_vector(encode_vector(x, "fp32"), 15, "fp16")


@pytest.mark.parametrize("codec", ["int8", "fp16", "bf16"])
def test_error_feedback_repays_what_rounding_left_out(codec: str) -> None:
    torch.manual_seed(2)
    feedback = ErrorFeedback(codec)
    meant, arrived = torch.zeros(3000), torch.zeros(3000)
    for _ in range(40):
        g = torch.randn(3000)
        meant += g
        arrived += decode_vector(feedback.encode("shard-0", g), 3000, codec)
    residual = feedback.residual("shard-0")
    assert residual is not None
    # What has not arrived is exactly what is kept for the next frame (up to fp32 sums).
    assert torch.allclose(meant - arrived, residual, atol=1e-4)
    one_shot = (meant - decode_vector(encode_vector(meant, codec), 3000, codec)).abs().max()
    assert float(residual.abs().max()) <= 2 * float(one_shot) + 1e-6  # bounded: no drift over 40 frames


def test_error_feedback_keys_codecs_and_reset() -> None:
    feedback = ErrorFeedback()
    x = torch.randn(500)
    first = feedback.encode(0, x)
    assert len(first) == frame_bytes(500, "int8")
    assert len(feedback.encode(1, x, "fp16")) == frame_bytes(500, "fp16")
    assert feedback.residual(0) is not None and feedback.residual(1) is not None
    assert encode_vector(x, "int8") == first  # nothing kept yet for a new key
    feedback.reset(0)
    assert feedback.residual(0) is None and feedback.encode(0, x) == first
    with pytest.raises(FrameError, match="reset the key"):
        feedback.encode(0, torch.randn(7))
    feedback.reset()
    assert feedback.residual(1) is None
    assert feedback.encode(0, torch.randn(7))


@pytest.mark.parametrize("codec", CODECS)
def test_encoding_leaves_the_tensor_as_it_was(codec: str) -> None:
    for n in (INT8_BLOCK * 4, INT8_BLOCK * 4 + 1):
        x = torch.randn(n)
        kept = x.clone()
        encode_tensor(x, codec)
        ErrorFeedback(codec).encode("k", x)
        assert torch.equal(x, kept)


@pytest.mark.parametrize("position", [0, 7, 4095, 99_999])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_one_bad_value_anywhere_in_a_large_tensor_is_found(position: int, bad: float) -> None:
    x = torch.randn(100_000)
    x[position] = bad
    for codec in CODECS:
        with pytest.raises(FrameError, match="NaN or infinite"):
            encode_tensor(x, codec)
    frame = encode_tensor(torch.randn(100_000), "fp32")
    frame[12 + 4 * position : 16 + 4 * position] = struct.pack("<f", bad)
    with pytest.raises(FrameError, match="NaN or infinite"):
        decode_vector(frame, 100_000)
