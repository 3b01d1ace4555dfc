"""Requests for a run's files between members.

A chunk of a file named by its digest, and a slice of the weights a run starts from.

A run pins every file it needs by SHA-256 (the tokenizer, the data manifest and the token
shards it lists; ``swarmd.data``), so a file is asked for by its digest alone: whoever holds
it answers a chunk, and the asker checks the whole file's digest before it uses a byte of it.
A run that starts from a pretrained checkpoint pins the checkpoint's digest; a member that
holds the folder answers slices of a stage's flat parameter vector, so that a shard server
without the folder loads only its own slice.

Both are members-only and go direct (never through a relay: a relay's links are for the
pipelines' tensors, not for bulk data). Bounds: a chunk is at most ``MAX_CHUNK_BYTES``, a
slice at most ``MAX_SLICE_ELEMENTS`` values, so one answer stays well under the message limit
and one slow peer holds up little.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from swarmd.peers.wire.errors import SchemaError
from swarmd.peers.wire.protocol import Answer, Request, bound

MAX_CHUNK_BYTES = 8 * 1024 * 1024
MAX_FILE_BYTES = 2**44
"""16 TiB: larger than any shard or checkpoint file a run could name."""
MAX_SLICE_ELEMENTS = 4 * 1024 * 1024
"""16 MiB of fp32 values a slice answer."""
MAX_VECTOR_ELEMENTS = 2**40
_SHA256 = re.compile(r"[0-9a-f]{64}")


def _sha256(value: str) -> None:
    if not _SHA256.fullmatch(value):
        raise ValueError("must be 64 lowercase hex digits (a SHA-256)")


@dataclass(frozen=True, kw_only=True)
class FileChunk(Answer):
    """A chunk of the file asked for (one blob of ``min(length, size - offset)`` bytes)."""

    BLOBS = 1

    size: int = bound(min_value=0, max_value=MAX_FILE_BYTES)
    """The whole file's size: the asker learns it from the first chunk."""


@dataclass(frozen=True, kw_only=True)
class FileFetch(Request[FileChunk]):
    """``length`` bytes of the file whose SHA-256 is ``sha256``, from ``offset``; NOT_HOLDER when
    this peer holds no checked copy of it."""

    METHOD = "data.fetch"

    sha256: str = bound(min_len=64, max_len=64, check=_sha256)
    offset: int = bound(min_value=0, max_value=MAX_FILE_BYTES)
    length: int = bound(min_value=1, max_value=MAX_CHUNK_BYTES)


@dataclass(frozen=True, kw_only=True)
class InitSliceAnswer(Answer):
    """Values ``[lo, hi)`` of the stage's flat vector: one fp32 vector frame."""

    BLOBS = 1


@dataclass(frozen=True, kw_only=True)
class InitSlice(Request[InitSliceAnswer]):
    """A slice of the run's initial weights for ``stage`` (the checkpoint the spec pins), read
    from the folder by a member that holds it; NOT_HOLDER from one that does not."""

    METHOD = "init.slice"

    stage: int = bound(min_value=0, max_value=1023)
    lo: int = bound(min_value=0, max_value=MAX_VECTOR_ELEMENTS)
    hi: int = bound(min_value=1, max_value=MAX_VECTOR_ELEMENTS)

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0 < self.hi - self.lo <= MAX_SLICE_ELEMENTS:
            raise SchemaError(
                "InitSlice.hi", self.hi, f"must be above lo = {self.lo} by at most {MAX_SLICE_ELEMENTS} values"
            )
