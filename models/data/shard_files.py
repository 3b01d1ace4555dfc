"""Token shards in local files, read a window at a time, and a prepared dataset opened from its folder.

A read is one ``os.pread`` of exactly the window's bytes into a fresh array: the process holds
what it reads and nothing more. ``np.memmap`` of whole shards was not used: every page a memmap
touches stays in the process's resident set until the kernel needs it back, so a reader that
walks a 100 GB dataset would look (and be accounted, in a container) as if it held it all.
Descriptors are kept open in a small LRU (opening a file per window costs more than the read),
bounded because a dataset may have a million shards and a process a few thousand descriptors.

:func:`open_prepared` is the short way from a ``swarmd data prepare`` folder to its datasets.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from swarmd.models.data.manifest import MANIFEST_FILE, MAX_MANIFEST_BYTES, Manifest, ManifestError, ShardEntry
from swarmd.models.data.windows import CorpusError, Dataset

logger = logging.getLogger(__name__)

MAX_OPEN = 16
"""Shard files kept open at once: training reads one or two, the held-out score a few more."""


class ShardFiles:
    """Shards on local disk, read with ``pread`` through a bounded LRU of open descriptors.

    ``read`` is the ``read(shard, start, count)`` a :class:`Dataset` takes; it may be called
    from several threads.
    """

    def __init__(
        self, paths: Sequence[str | Path], dtype: str, *, tokens: Sequence[int] | None = None, max_open: int = MAX_OPEN
    ) -> None:
        if max_open < 1:
            raise ValueError(f"max_open must be at least 1, got {max_open}")
        if tokens is not None and len(tokens) != len(paths):
            raise ValueError(f"{len(paths)} shard paths but {len(tokens)} token counts")
        self.paths = [Path(p) for p in paths]
        self.dtype = np.dtype(dtype).newbyteorder("<")
        """Token dtype as stored: little-endian, whatever this machine's order."""
        self.tokens = None if tokens is None else [int(t) for t in tokens]
        """Each shard's token count, when known: a read past it is refused before touching the file."""
        self.max_open = max_open
        self._open: OrderedDict[int, int] = OrderedDict()
        self._lock = threading.Lock()

    @classmethod
    def of_entries(cls, folder: str | Path, entries: Sequence[ShardEntry], dtype: str) -> ShardFiles:
        """The shards a manifest lists, in ``folder`` (where ``swarmd data prepare`` put them)."""
        folder = Path(folder)
        return cls([folder / e.file for e in entries], dtype, tokens=[e.tokens for e in entries])

    def read(self, shard: int, start: int, count: int) -> np.ndarray:
        """Tokens ``[start, start + count)`` of ``shard`` (native byte order)."""
        if not 0 <= shard < len(self.paths):
            raise IndexError(f"shard {shard} is not one of the {len(self.paths)} shards")
        if start < 0 or count < 0 or (self.tokens is not None and start + count > self.tokens[shard]):
            limit = "" if self.tokens is None else f" of {self.tokens[shard]}"
            raise IndexError(f"tokens {start}..{start + count} are outside shard {shard}{limit}")
        size = self.dtype.itemsize
        want = count * size
        # Under the lock: another thread's read could otherwise close this descriptor (LRU) and
        # a new open reuse its number for another file. A window is a few kB from the page cache.
        with self._lock:
            data = os.pread(self._fd(shard), want, start * size)
        if len(data) != want:
            raise CorpusError(
                f"shard file {self.paths[shard]} ends at byte {start * size + len(data)}, before token "
                f"{start + count}: it is truncated; fetch or prepare it again"
            )
        return np.frombuffer(data, dtype=self.dtype).astype(self.dtype.newbyteorder("="), copy=False)

    def _fd(self, shard: int) -> int:
        """The open descriptor of ``shard`` (opened if need be); the caller holds the lock."""
        fd = self._open.get(shard)
        if fd is not None:
            self._open.move_to_end(shard)
            return fd
        path = self.paths[shard]
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except OSError as e:
            raise CorpusError(f"cannot open shard file {path}: {e.strerror or e}") from None
        self._open[shard] = fd
        while len(self._open) > self.max_open:
            _, old = self._open.popitem(last=False)
            os.close(old)
        return fd

    def close(self) -> None:
        with self._lock:
            while self._open:
                os.close(self._open.popitem()[1])

    def __enter__(self) -> ShardFiles:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass
class PreparedData:
    """A prepared dataset opened from its folder: the manifest, and its training and held-out datasets."""

    folder: Path
    manifest: Manifest
    manifest_sha256: str
    train: Dataset
    validation: Dataset | None
    """None when the manifest has no held-out shard, or none holds one sequence."""
    files: list[ShardFiles]

    def close(self) -> None:
        for f in self.files:
            f.close()


def read_manifest(folder: str | Path) -> tuple[Manifest, str]:
    """The manifest in ``folder`` and its SHA-256; ManifestError naming the path when missing or malformed."""
    path = Path(folder) / MANIFEST_FILE
    try:
        size = path.stat().st_size
        if size > MAX_MANIFEST_BYTES:
            raise ManifestError(f"{path} is {size} bytes, over the limit of {MAX_MANIFEST_BYTES}")
        raw = path.read_bytes()
    except OSError as e:
        raise ManifestError(
            f"cannot read {path}: {e.strerror or e}; is it a folder 'swarmd data prepare' wrote?"
        ) from None
    try:
        return Manifest.parse(raw), hashlib.sha256(raw).hexdigest()
    except ManifestError as e:
        raise ManifestError(f"{path}: {e}") from None


def open_prepared(folder: str | Path, seq_len: int, seed: int, *, verify: bool = False) -> PreparedData:
    """The datasets of a ``swarmd data prepare`` folder, read from its files (bounded memory).

    With ``verify``, every file's SHA-256 is checked against the manifest first (reads it all).
    """
    folder = Path(folder)
    manifest, digest = read_manifest(folder)
    if verify:
        for entry in (*manifest.train, *manifest.validation):
            check_shard(folder / entry.file, entry, manifest.dtype)
    train_files = ShardFiles.of_entries(folder, manifest.train, manifest.dtype)
    train = Dataset([e.tokens for e in manifest.train], seq_len, seed, train_files.read)
    files = [train_files]
    validation = None
    if manifest.validation and max(e.tokens for e in manifest.validation) >= seq_len:
        val_files = ShardFiles.of_entries(folder, manifest.validation, manifest.dtype)
        validation = Dataset([e.tokens for e in manifest.validation], seq_len, seed, val_files.read)
        files.append(val_files)
    return PreparedData(folder, manifest, digest, train, validation, files)


def check_shard(path: str | Path, entry: ShardEntry, dtype: str) -> None:
    """Refuse a shard file whose size or SHA-256 is not what the manifest says (CorpusError naming it)."""
    path = Path(path)
    expected = entry.tokens * np.dtype(dtype).itemsize
    try:
        size = path.stat().st_size
        if size != expected:
            raise CorpusError(
                f"shard file {path} is {size} bytes; the manifest says {entry.tokens} tokens, {expected} bytes"
            )
        h = hashlib.sha256()
        with path.open("rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
    except OSError as e:
        raise CorpusError(f"cannot read shard file {path}: {e.strerror or e}") from None
    if h.hexdigest() != entry.sha256:
        raise CorpusError(
            f"shard file {path} has SHA-256 {h.hexdigest()[:16]}..., the manifest says {entry.sha256[:16]}...: "
            "it is corrupt or from another dataset; fetch or prepare it again"
        )
