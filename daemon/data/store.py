"""This peer's checked copies of a run's files, found on disk or fetched into a bounded cache.

This peer's checked copies of a run's files, by SHA-256: found in its data folders, or
fetched into a cache that never outgrows ``[limits] data_cache_gib``.

A run pins every file it reads (the tokenizer, the data manifest, each token shard, the initial
weights' manifest) by digest, so the store knows files by digest alone. A copy is used or
served only once its digest has been checked in full: a file in a data folder is hashed the
first time it is asked for (the result is remembered by path, size and modification time, so
a restart does not hash a hundred gigabytes again), a fetched file before it enters the cache.
A copy that fails is refused, counted and never used; the caller fetches the file from
elsewhere.

The cache holds what was fetched, as one file per digest, and evicts the least recently used
when a new file would not fit. Files a caller pinned (the shards training reads now and the
ones fetched ahead) are never evicted; a fetch that cannot fit beside them is refused with
the figures. Files in data folders are the owner's and are never deleted.

Reads go through ``os.pread`` on a small pool of open descriptors, so memory does not grow
with the data: the kernel's page cache holds what is hot, and gives it back under pressure.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import tempfile
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

from swarmd.errors import SwarmdError

logger = logging.getLogger(__name__)

HASH_CHUNK = 1 << 20
OPEN_FILES = 32
"""Descriptors kept open for reads; the least recently used is closed past this."""
MEMO_FILE = "checked.json"
MAX_MEMO = 1_000_000
_DIGEST = re.compile(r"[0-9a-f]{64}")


class DataError(SwarmdError):
    """A run's file is missing, refused or does not fit this peer's cache."""


def sha256_file(path: Path) -> str:
    """SHA-256 of a file, read in 1 MiB chunks (a shard of gigabytes is never held in memory)."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(HASH_CHUNK):
            h.update(chunk)
    return h.hexdigest()


@dataclass
class _Copy:
    path: Path
    size: int
    cached: bool
    """In the cache folder (evictable), not a data folder (the owner's)."""


@dataclass
class StoreCounters:
    refused_local: int = 0
    """Copies in data folders or the cache whose digest did not match: never used."""
    evicted: int = 0
    evicted_bytes: int = 0


class FileStore:
    """The store of the module doc, for one run (its cache folder is the run's own)."""

    def __init__(self, cache_dir: Path, cache_bytes: int) -> None:
        self.cache_dir = cache_dir
        self.cache_bytes = cache_bytes
        self.counters = StoreCounters()
        self._copies: dict[str, _Copy] = {}
        self._candidates: dict[str, list[Path]] = {}
        self._recent: OrderedDict[str, None] = OrderedDict()  # cached digests, least recently used first
        self._pins: dict[str, int] = {}
        self._reserved = 0  # bytes of fetches in progress, counted against the bound
        self._lock = threading.Lock()  # reads run in worker threads; bookkeeping on the loop
        self._fds: OrderedDict[str, int] = OrderedDict()
        self._memo_path = cache_dir / MEMO_FILE
        self._memo: dict[str, list[object]] = {}

    # --- where copies are --------------------------------------------------------------------

    def open(self) -> None:
        """Make the cache folder, read the memo of checked files, and list the cached copies
        (each is checked again the first time it is used: a disk can rot)."""
        self.cache_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        with contextlib.suppress(OSError, ValueError):
            memo = json.loads(self._memo_path.read_text())
            if isinstance(memo, dict) and len(memo) <= MAX_MEMO:
                self._memo = {k: v for k, v in memo.items() if isinstance(v, list) and len(v) == 3}
        for path in self.cache_dir.iterdir():
            if _DIGEST.fullmatch(path.name) and path.is_file():
                self.offer(path.name, path)
            elif path.name.startswith(".fetch-"):  # a fetch cut short by a crash
                with contextlib.suppress(OSError):
                    path.unlink()

    def offer(self, digest: str, path: Path) -> None:
        """A place where the file ``digest`` may be; checked when it is first asked for."""
        with self._lock:
            places = self._candidates.setdefault(digest, [])
            if path not in places:
                places.append(path)

    def has(self, digest: str) -> bool:
        """Whether a checked copy is here (no I/O)."""
        return digest in self._copies

    def knows(self, digest: str) -> bool:
        """Whether a copy is here or offered (a data folder's, checked when first asked for)."""
        return digest in self._copies or bool(self._candidates.get(digest))

    def find(self, digest: str) -> Path | None:
        """The checked copy of ``digest``, checking the places offered for it (blocking: call
        from a worker thread when a check may hash a large file)."""
        copy = self._copies.get(digest)
        if copy is not None:
            self.touch(digest)
            return copy.path
        with self._lock:
            places = list(self._candidates.get(digest, []))
        for path in places:
            cached = path.parent == self.cache_dir
            if self._check(digest, path):
                size = path.stat().st_size
                with self._lock:
                    self._copies[digest] = _Copy(path, size, cached)
                    if cached:
                        self._recent[digest] = None
                return path
            with self._lock:
                self._candidates[digest].remove(path)
            if cached:  # our own copy went bad: it only takes room
                with contextlib.suppress(OSError):
                    path.unlink()
        return None

    def _check(self, digest: str, path: Path) -> bool:
        try:
            stat = path.stat()
        except OSError:
            return False
        key = str(path.resolve())
        if self._memo.get(key) == [stat.st_size, stat.st_mtime_ns, digest]:
            return True
        started = time.monotonic()
        try:
            actual = sha256_file(path)
        except OSError as e:
            logger.warning("cannot read %s (%s); fetching its file from elsewhere", path, e)
            return False
        if actual != digest:
            self.counters.refused_local += 1
            logger.warning(
                "%s is not the file the run pins (SHA-256 %s..., expected %s...); not used, fetching it from elsewhere",
                path,
                actual[:12],
                digest[:12],
            )
            return False
        logger.debug("checked %s (%d bytes) in %.2f s", path, stat.st_size, time.monotonic() - started)
        self._remember(key, [stat.st_size, stat.st_mtime_ns, digest])
        return True

    def _remember(self, key: str, entry: list[object]) -> None:
        self._memo[key] = entry
        if len(self._memo) > MAX_MEMO:
            self._memo.pop(next(iter(self._memo)))
        # Renamed into place but not synced: losing it to a power cut costs a re-hash, not a file.
        tmp = self._memo_path.with_name(f".{MEMO_FILE}.tmp")
        with contextlib.suppress(OSError):
            tmp.write_text(json.dumps(self._memo))
            os.replace(tmp, self._memo_path)

    # --- the cache ---------------------------------------------------------------------------

    def resize(self, cache_bytes: int) -> None:
        """A new bound (``[limits] data_cache_gib`` reloaded): a smaller one evicts at the next fetch."""
        self.cache_bytes = cache_bytes

    def cached_bytes(self) -> int:
        return sum(self._copies[d].size for d in self._recent)

    def pin(self, digest: str) -> None:
        self._pins[digest] = self._pins.get(digest, 0) + 1

    def unpin(self, digest: str) -> None:
        left = self._pins.get(digest, 0) - 1
        if left > 0:
            self._pins[digest] = left
        else:
            self._pins.pop(digest, None)

    def touch(self, digest: str) -> None:
        if digest in self._recent:
            self._recent.move_to_end(digest)

    def make_room(self, size: int, what: str) -> None:
        """Evict unpinned cached files, least recently used first, until ``size`` more bytes fit,
        and reserve them for a fetch (``release`` them once it is admitted or has failed)."""
        if size > self.cache_bytes:
            raise DataError(
                f"{what} is {size / 2**20:.0f} MiB, over the whole data cache of {self.cache_bytes / 2**30:.2f} GiB; "
                "raise [limits] data_cache_gib, or give this peer the data in a --data-dir"
            )
        used = self.cached_bytes() + self._reserved
        for digest in list(self._recent):
            if used + size <= self.cache_bytes:
                break
            if self._pins.get(digest):
                continue
            used -= self._evict(digest)
        if used + size > self.cache_bytes:
            raise DataError(
                f"{what} ({size / 2**20:.0f} MiB) does not fit the data cache of {self.cache_bytes / 2**30:.2f} GiB "
                f"beside the {used / 2**20:.0f} MiB of files training reads now; raise [limits] data_cache_gib"
            )
        self._reserved += size

    def release(self, size: int) -> None:
        """A fetch's reservation ends (its file admitted, or the fetch failed)."""
        self._reserved = max(0, self._reserved - size)

    def _evict(self, digest: str) -> int:
        with self._lock:
            copy = self._copies.pop(digest)
            self._recent.pop(digest, None)
            fd = self._fds.pop(digest, None)
        if fd is not None:
            os.close(fd)
        with contextlib.suppress(OSError):
            copy.path.unlink()
        self._candidates.pop(digest, None)
        self.counters.evicted += 1
        self.counters.evicted_bytes += copy.size
        logger.debug("evicted %s (%d bytes) from the data cache", digest[:12], copy.size)
        return copy.size

    def temporary(self) -> Path:
        """A fresh file in the cache folder for a fetch to write (``admit`` or delete it)."""
        fd, name = tempfile.mkstemp(prefix=".fetch-", dir=self.cache_dir)
        os.close(fd)
        return Path(name)

    def admit(self, digest: str, tmp: Path) -> Path:
        """A fetched file, already checked against ``digest``, into the cache."""
        path = self.cache_dir / digest
        os.replace(tmp, path)
        stat = path.stat()
        with self._lock:
            self._copies[digest] = _Copy(path, stat.st_size, True)
            self._recent[digest] = None
        self._remember(str(path.resolve()), [stat.st_size, stat.st_mtime_ns, digest])
        return path

    # --- reading -----------------------------------------------------------------------------

    def size(self, digest: str) -> int:
        copy = self._copies.get(digest)
        if copy is None:
            raise DataError(f"no checked copy of file {digest[:12]}... is here")
        return copy.size

    def read(self, digest: str, offset: int, length: int) -> bytes:
        """``length`` bytes of ``digest`` from ``offset`` (fewer at its end); thread-safe."""
        with self._lock:
            copy = self._copies.get(digest)
            if copy is None:
                raise DataError(f"file {digest[:12]}... is not here (evicted, or never fetched); fetch it first")
            fd = self._fds.get(digest)
            if fd is None:
                fd = os.open(copy.path, os.O_RDONLY)
                self._fds[digest] = fd
                while len(self._fds) > OPEN_FILES:
                    os.close(self._fds.popitem(last=False)[1])
            else:
                self._fds.move_to_end(digest)
            # Read under the lock: an eviction must not close the descriptor mid-read.
            return os.pread(fd, length, offset)

    def close(self) -> None:
        with self._lock:
            for fd in self._fds.values():
                os.close(fd)
            self._fds.clear()

    def status(self) -> dict[str, object]:
        return {
            "files": len(self._copies),
            "cached_files": len(self._recent),
            "cached_bytes": self.cached_bytes(),
            "cache_bytes": self.cache_bytes,
            "refused_local": self.counters.refused_local,
            "evicted": self.counters.evicted,
        }
