"""The weights a run starts from when it starts from a checkpoint, described chunk by chunk.

The weights a run starts from, when it starts from a checkpoint: described chunk by chunk,
so that a peer without the checkpoint can check every value it is sent.

A run that continues from a pretrained model pins one small file, the initial weights'
manifest: the checkpoint's own digest (``swarmd.models.pretrained.checkpoint_digest``), the
model's shape and stage split, and for each stage's flat parameter vector (the order a shard
slices, ``cell_compute.flatten_parameters``) the SHA-256 of every chunk of ``CHUNK_ELEMENTS``
float32 values, little-endian. A peer that holds the checkpoint folder computes any chunk
from it (``chunk_bytes``); a peer without it fetches the chunks its shards need from one that
has it, by their digests, and checks each. Nobody needs the whole checkpoint but its holders,
and a member cannot slip different starting weights past the digest the spec pins.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from swarmd.errors import SwarmdError
from swarmd.models.pretrained import checkpoint_digest, read_stage_slice
from swarmd.models.shape import ModelShape
from swarmd.models.stages import split_layers, stage_sizes

FORMAT = "swarmd-initial-weights/1"
CHUNK_ELEMENTS = 1 << 22
"""4 Mi values: 16 MiB of float32 a chunk (what ``describe`` uses; a manifest says its own)."""
MIN_CHUNK_ELEMENTS = 1 << 10
MAX_CHUNK_ELEMENTS = 1 << 22
"""A chunk is fetched whole, in two requests at most (``swarmd.peers.wire.file_messages``)."""
MAX_MANIFEST_BYTES = 16 * 1024 * 1024
MAX_CHUNKS = 200_000
"""A 800-billion-value model; far past anything a swarm starts from."""
_HEX = frozenset("0123456789abcdef")


class InitialWeightsError(SwarmdError):
    """The initial weights' manifest is malformed, or a chunk does not match it."""


@dataclass(frozen=True)
class InitialWeights:
    checkpoint: str
    """The checkpoint folder's digest: a folder is used only when it hashes to this."""
    shape: ModelShape
    stages: int
    sizes: tuple[int, ...]
    """Each stage's flat vector length."""
    chunks: tuple[tuple[str, ...], ...]
    """Per stage, each chunk's SHA-256."""
    chunk_elements: int = CHUNK_ELEMENTS

    def chunk_span(self, stage: int, chunk: int) -> tuple[int, int]:
        lo = chunk * self.chunk_elements
        return lo, min(lo + self.chunk_elements, self.sizes[stage])

    def chunks_of(self, stage: int, lo: int, hi: int) -> range:
        """The chunks of ``stage`` that values ``[lo, hi)`` lie in."""
        return range(lo // self.chunk_elements, (hi - 1) // self.chunk_elements + 1)

    def locate(self, digest: str) -> tuple[int, int] | None:
        """(stage, chunk) of the chunk with this digest, if it is one of ours."""
        for stage, digests in enumerate(self.chunks):
            if digest in digests:
                return stage, digests.index(digest)
        return None

    def to_json(self) -> bytes:
        body = {
            "format": FORMAT,
            "checkpoint": self.checkpoint,
            "model": self.shape.to_dict(),
            "stages": self.stages,
            "sizes": list(self.sizes),
            "chunk_elements": self.chunk_elements,
            "chunks": [list(c) for c in self.chunks],
        }
        return (json.dumps(body, sort_keys=True, separators=(",", ":")) + "\n").encode()

    @classmethod
    def parse(cls, raw: bytes) -> InitialWeights:
        """Read a manifest from anyone: its size, keys, counts and digests checked."""
        if len(raw) > MAX_MANIFEST_BYTES:
            raise InitialWeightsError(f"initial weights' manifest of {len(raw)} bytes, over {MAX_MANIFEST_BYTES}")
        try:
            body = json.loads(raw)
        except ValueError as e:
            raise InitialWeightsError(f"initial weights' manifest is not JSON: {e}") from None
        if not isinstance(body, dict) or body.get("format") != FORMAT:
            raise InitialWeightsError(f"not an initial weights' manifest of format {FORMAT}")
        expected = {"format", "checkpoint", "model", "stages", "sizes", "chunk_elements", "chunks"}
        if set(body) != expected:
            raise InitialWeightsError(f"initial weights' manifest has keys {sorted(body)}, expected {sorted(expected)}")
        stages, sizes, chunks, per_chunk = body["stages"], body["sizes"], body["chunks"], body["chunk_elements"]
        ok = (
            _digest(body["checkpoint"])
            and isinstance(per_chunk, int)
            and MIN_CHUNK_ELEMENTS <= per_chunk <= MAX_CHUNK_ELEMENTS
            and isinstance(stages, int)
            and 1 <= stages <= 1024
            and isinstance(sizes, list)
            and len(sizes) == stages
            and all(isinstance(n, int) and 0 < n < 2**40 for n in sizes)
            and isinstance(chunks, list)
            and len(chunks) == stages
            and sum(len(c) for c in chunks if isinstance(c, list)) <= MAX_CHUNKS
        )
        if not ok:
            raise InitialWeightsError("initial weights' manifest: bad checkpoint digest, stages, sizes or chunks")
        for stage, (size, digests) in enumerate(zip(sizes, chunks, strict=True)):
            count = -(-size // per_chunk)
            if not isinstance(digests, list) or len(digests) != count or not all(map(_digest, digests)):
                raise InitialWeightsError(f"initial weights' manifest: stage {stage} needs {count} chunk digests")
        try:
            shape = ModelShape.from_dict(body["model"])
        except (SwarmdError, TypeError, ValueError) as e:
            raise InitialWeightsError(f"initial weights' manifest: model: {e}") from None
        return cls(body["checkpoint"], shape, stages, tuple(sizes), tuple(tuple(c) for c in chunks), per_chunk)


def _digest(value: Any) -> bool:
    return isinstance(value, str) and len(value) == 64 and set(value) <= _HEX


def chunk_bytes(folder: Path, weights: InitialWeights, stage: int, chunk: int) -> bytes:
    """One chunk's float32 values, little-endian, read from the checkpoint folder."""
    lo, hi = weights.chunk_span(stage, chunk)
    ranges = split_layers(weights.shape.layers, weights.stages)
    values = read_stage_slice(folder, weights.shape, ranges, stage, lo, hi)
    return values.to(torch.float32).contiguous().numpy().astype("<f4", copy=False).tobytes()


def values_of(data: bytes) -> torch.Tensor:
    """A chunk's bytes as float32 values (a copy the caller may change)."""
    return torch.frombuffer(bytearray(data), dtype=torch.float32)


def describe(
    folder: Path,
    shape: ModelShape,
    stages: int,
    progress: Callable[[float], None] | None = None,
    *,
    chunk_elements: int = CHUNK_ELEMENTS,
) -> InitialWeights:
    """The manifest of a checkpoint folder: every chunk read once and hashed (what ``swarmd run
    create`` does for a run that starts from it)."""
    sizes = stage_sizes(shape, split_layers(shape.layers, stages))
    draft = InitialWeights(checkpoint_digest(folder), shape, stages, tuple(sizes), (), chunk_elements)
    total = sum(-(-n // chunk_elements) for n in sizes)
    chunks: list[tuple[str, ...]] = []
    done = 0
    for stage, size in enumerate(sizes):
        digests = []
        for chunk in range(-(-size // chunk_elements)):
            digests.append(hashlib.sha256(chunk_bytes(folder, draft, stage, chunk)).hexdigest())
            done += 1
            if progress is not None:
                progress(done / total)
        chunks.append(tuple(digests))
    return InitialWeights(draft.checkpoint, shape, stages, tuple(sizes), tuple(chunks), chunk_elements)
