"""Token shards of one split, written as documents arrive: several files open at once, each hashed as it grows.

A document goes whole to one of ``slots`` open shards, chosen by the caller (by the document's
content hash, so that every shard mixes the whole input instead of holding one stretch of it,
as an input sorted by source or date would otherwise give). A shard is closed when the next
document would take it past ``shard_tokens``; a document longer than a whole shard is cut into
pieces of ``shard_tokens``. Shards are numbered in the order they are opened, so the same
documents in the same order give the same files.

A file is written under a temporary name and renamed when it is closed and flushed: a shard
under its final name is always whole. Its SHA-256 is computed from the bytes as they are
written, so finishing a dataset never reads it back.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import numpy as np

from swarmd.models.data.manifest import ShardEntry

WRITE_BUFFER = 1 << 20


@dataclass
class _OpenShard:
    number: int
    path: Path
    file: IO[bytes]
    hash: hashlib._Hash = field(default_factory=hashlib.sha256)
    tokens: int = 0


class ShardWriter:
    """Writes ``{prefix}-00000.bin``, ... in ``folder``: raw little-endian tokens of ``dtype``."""

    def __init__(self, folder: Path, prefix: str, dtype: str, shard_tokens: int, slots: int) -> None:
        if shard_tokens < 1 or slots < 1:
            raise ValueError(f"shard_tokens ({shard_tokens}) and slots ({slots}) must be at least 1")
        self.folder = folder
        self.prefix = prefix
        self.dtype = np.dtype(dtype).newbyteorder("<")
        self.shard_tokens = shard_tokens
        self.slots: list[_OpenShard | None] = [None] * slots
        self.closed: list[tuple[int, ShardEntry]] = []
        self.documents = 0
        self.tokens = 0
        """Tokens written so far, in closed and open shards."""
        self._next = 0

    def add(self, tokens: np.ndarray, slot: int) -> None:
        """Append one document's tokens (separator included) to the shard open in ``slot``."""
        self.documents += 1
        data = tokens.astype(self.dtype, copy=False)
        while len(data):
            shard = self.slots[slot]
            if shard is not None and shard.tokens and shard.tokens + len(data) > self.shard_tokens:
                self._close(slot)
                shard = None
            if shard is None:
                shard = self._open(slot)
            piece = data[: self.shard_tokens - shard.tokens]
            raw = piece.tobytes()
            shard.file.write(raw)
            shard.hash.update(raw)
            shard.tokens += len(piece)
            self.tokens += len(piece)
            data = data[len(piece) :]

    def finish(self) -> list[ShardEntry]:
        """Close every open shard; the shards in number order."""
        for slot in range(len(self.slots)):
            if self.slots[slot] is not None:
                self._close(slot)
        return [entry for _, entry in sorted(self.closed)]

    def abort(self) -> None:
        """Close and delete every shard written (after an error: no manifest will name them)."""
        for shard in self.slots:
            if shard is not None:
                shard.file.close()
                with contextlib.suppress(OSError):
                    os.unlink(_partial(shard.path))
        for _, entry in self.closed:
            with contextlib.suppress(OSError):
                os.unlink(self.folder / entry.file)
        self.slots = [None] * len(self.slots)
        self.closed = []

    def _open(self, slot: int) -> _OpenShard:
        number, self._next = self._next, self._next + 1
        path = self.folder / f"{self.prefix}-{number:05d}.bin"
        shard = _OpenShard(number, path, _partial(path).open("wb", buffering=WRITE_BUFFER))
        self.slots[slot] = shard
        return shard

    def _close(self, slot: int) -> None:
        shard = self.slots[slot]
        assert shard is not None
        shard.file.flush()
        os.fsync(shard.file.fileno())
        shard.file.close()
        os.replace(_partial(shard.path), shard.path)
        self.closed.append((shard.number, ShardEntry(shard.path.name, shard.hash.hexdigest(), shard.tokens)))
        self.slots[slot] = None


def _partial(path: Path) -> Path:
    return path.with_name(f".{path.name}.partial")
