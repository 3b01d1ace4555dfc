"""The bytes every data-path message costs on the wire: what the planner and the simulator charge.

No torch here: the planner's cost model and the simulator price messages without building
tensors, and ``swarmd.peers.wire.codecs`` encodes exactly these sizes (a unit test ties the
two). A codec is chosen per link by ``codec_for``: 16-bit by default, 8-bit where the link
is slow (``SLOW_LINK_Bps``); whole weights travel in fp32 so that a cell that joins holds the
servers' weights bit for bit (the deltas after it are exact too, ``docs/data-path.md``).
"""

from __future__ import annotations

import math

CODECS = ("fp32", "fp16", "bf16", "int8")
ELEMENT_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2, "int8": 1}
INT8_BLOCK = 256
"""Elements that share one fp32 absmax scale in the int8 codec (the scale costs 4 bytes)."""
FRAME_HEADER_BYTES = 8
"""A tensor frame's fixed header: magic (4), codec (1), ndim (1), reserved (2)."""
DIM_BYTES = 4
REQUEST_OVERHEAD_BYTES = 768
"""A request's or answer's framing and typed header (JSON), on average; small next to tensors."""
SLOW_LINK_Bps = 25e6
"""Below this measured rate (200 Mbit/s) activations and contributions travel as int8: the
time saved on the link is worth far more than the rounding, which error feedback repays
for contributions (and activations are re-quantised per block, so their error stays local)."""

KINDS = ("activation", "contribution", "delta", "weights")
"""What a message carries: an activation or its gradient between two cells; a cell's
gradient or pseudo-gradient slice to a shard; a shard's change since a version; a whole slice."""


def encoded_bytes(elements: int, codec: str) -> int:
    """The payload bytes of ``elements`` values in ``codec`` (int8: one scale per block)."""
    if codec not in ELEMENT_BYTES:
        raise ValueError(f"codec {codec!r} is not one of {CODECS}")
    if elements < 0:
        raise ValueError(f"elements = {elements} must be >= 0")
    payload = elements * ELEMENT_BYTES[codec]
    if codec == "int8":
        payload += 4 * math.ceil(elements / INT8_BLOCK)
    return payload


def frame_bytes(elements: int, codec: str, ndim: int = 1) -> int:
    """One tensor frame: its header, its dimensions and its payload."""
    return FRAME_HEADER_BYTES + DIM_BYTES * ndim + encoded_bytes(elements, codec)


def message_bytes(elements: int, codec: str, ndim: int = 1) -> int:
    """One request carrying one tensor frame, framing and header included."""
    return REQUEST_OVERHEAD_BYTES + frame_bytes(elements, codec, ndim)


def codec_for(kind: str, link_Bps: float, *, half: str = "fp16") -> str:
    """The codec a message of ``kind`` takes on a link measured at ``link_Bps`` (0: unknown,
    taken as fast). ``half`` is the run's 16-bit type (bf16 for llama, whose activations
    overflow fp16)."""
    if kind not in KINDS:
        raise ValueError(f"kind {kind!r} is not one of {KINDS}")
    if half not in ("fp16", "bf16"):
        raise ValueError(f"half {half!r} must be fp16 or bf16")
    if kind == "weights":
        return "fp32"
    if kind == "delta":
        return "fp16"  # exact by construction (the server keeps the rounding), whatever the link
    slow = 0 < link_Bps < SLOW_LINK_Bps
    return "int8" if slow else half


def activation_elements(micro_batch: int, seq_len: int, hidden: int) -> int:
    """Values in one activation (or its gradient) between two stages: a hidden state per token."""
    return micro_batch * seq_len * hidden
