"""Fetching a run's file by its digest, checked in full before it is kept.

Fetching a run's file by its digest: from the sources the data manifest lists, else from
members that hold it, checked in full before it enters the cache.

One fetch runs per file at a time (callers of the same file share it) and at most
``CONCURRENT`` at once. A round tries the manifest's sources in order, then up to
``MEMBERS_A_ROUND`` members, those whose heartbeat says they hold the whole dataset first, then
those that hold some of it, each order shuffled so that newcomers spread over the holders.
A file whose digest does not match is refused, counted against its source and fetched from the
next one; a source that failed sits out a while (doubling, with jitter) so that a mirror that
is down costs one try, not one per file. A round that finds no good copy raises
``DataUnavailable``; ``ensure`` tries again with backoff until its deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from swarmd.data.mirrors import MirrorError, describe, read_source
from swarmd.data.store import DataError, FileStore
from swarmd.peers.wire.errors import RpcError
from swarmd.peers.wire.file_messages import MAX_CHUNK_BYTES, FileChunk, FileFetch
from swarmd.peers.wire.protocol import Request

logger = logging.getLogger(__name__)

CONCURRENT = 2
MEMBERS_A_ROUND = 4
CHUNK_TIMEOUT_S = 60.0
COOLDOWN_S = (5.0, 300.0)
"""A failed source sits out this long, doubling per failure in a row up to the second figure."""
RETRY_S = (1.0, 30.0)

Send = Callable[[str, Request[Any], list[bytes], float], Awaitable[tuple[Any, list[bytes]]]]
Holders = Callable[[], list[tuple[str, list[str]]]]
"""The live members and what their heartbeats say they hold (``Heartbeat.holds``)."""


class DataUnavailable(DataError):
    """No source or member gave a good copy of a file this round; worth trying again."""


@dataclass(frozen=True)
class Wanted:
    """A file a run needs: its digest, its name in the manifest's sources, and its largest size."""

    digest: str
    name: str
    """Its name under the manifest's sources; empty for a file no source has (a chunk of the
    initial weights, a manifest)."""
    max_bytes: int
    """Its size (a shard: the manifest says it), or the most a file of its kind may be."""
    what: str
    """How logs and errors name it (``"train shard 12"``, ``"the tokenizer"``)."""
    holders: tuple[str, ...] = ("dataset", "shards")
    """Which ``Heartbeat.holds`` to ask, in order of preference."""
    anyone: bool = False
    """Ask any member after those (a small file every member that trains has read)."""
    exact: bool = False
    """Whether ``max_bytes`` is its very size: room is made for it before a byte comes."""


@dataclass
class FetchCounters:
    files: Counter[str] = field(default_factory=Counter)
    """Files fetched, by source kind (``source``, ``member``)."""
    bytes: Counter[str] = field(default_factory=Counter)
    refused: int = 0
    """Copies whose digest did not match (never used)."""
    failed: int = 0
    """Tries that gave nothing (a source down, a member without the file)."""
    seconds: float = 0.0


class Fetcher:
    def __init__(
        self, run_id: str, store: FileStore, send: Send, holders: Holders, sources: tuple[str, ...] = ()
    ) -> None:
        self.run_id = run_id
        self.store = store
        self.send = send
        self.holders = holders
        self.sources = sources
        """The manifest's sources (set once the manifest is read)."""
        self.counters = FetchCounters()
        self._running: dict[str, asyncio.Task[Path]] = {}
        self._slots = asyncio.Semaphore(CONCURRENT)
        self._cooldown: dict[str, tuple[float, int]] = {}  # source or peer -> (until, failures in a row)

    async def ensure(self, wanted: Wanted, deadline_s: float | None = None) -> Path:
        """The checked local copy of ``wanted``, fetched if need be; tried again with backoff
        (and jitter) until ``deadline_s`` (None: until it comes)."""
        started = time.monotonic()
        delay = RETRY_S[0]
        while True:
            try:
                return await self.get(wanted)
            except DataUnavailable as e:
                if deadline_s is not None and time.monotonic() - started + delay > deadline_s:
                    raise
                logger.warning("%s; retrying in %.0f s", e, delay)
            await asyncio.sleep(delay * random.uniform(0.8, 1.2))
            delay = min(2 * delay, RETRY_S[1])

    async def get(self, wanted: Wanted) -> Path:
        """One round (module doc); callers of the same file share it."""
        task = self._running.get(wanted.digest)
        if task is None:
            task = asyncio.create_task(self._round(wanted), name=f"fetch {wanted.what}")
            self._running[wanted.digest] = task
            task.add_done_callback(lambda _: self._running.pop(wanted.digest, None))
        return await asyncio.shield(task)

    async def _round(self, wanted: Wanted) -> Path:
        local = await asyncio.to_thread(self.store.find, wanted.digest)
        if local is not None:
            return local
        async with self._slots:
            why: list[str] = []
            for source in self._ready(list(self.sources) if wanted.name else []):
                path = await self._try(wanted, source, "source", self._from_source, why)
                if path is not None:
                    return path
            for peer in self._ready(self._members(wanted))[:MEMBERS_A_ROUND]:
                path = await self._try(wanted, peer, "member", self._from_member, why)
                if path is not None:
                    return path
        tried = "; ".join(why) if why else "no source is listed and no member says it holds the data"
        raise DataUnavailable(f"cannot fetch {wanted.what} ({wanted.digest[:12]}...): {tried}")

    def _members(self, wanted: Wanted) -> list[str]:
        """Whom to ask: the members that say they hold such files, by preference, each group
        shuffled (newcomers spread over the holders); then, for a small file, anyone."""
        members = self.holders()
        order: list[str] = []
        for kind in (*wanted.holders, *(("",) if wanted.anyone else ())):
            group = [p for p, holds in members if (kind in holds or not kind) and p not in order]
            random.shuffle(group)
            order += group
        return order

    def _ready(self, names: list[str]) -> list[str]:
        now = time.monotonic()
        return [n for n in names if self._cooldown.get(n, (0.0, 0))[0] <= now]

    async def _try(
        self,
        wanted: Wanted,
        where: str,
        kind: str,
        read: Callable[[Wanted, str, Path, Any], Awaitable[int]],
        why: list[str],
    ) -> Path | None:
        reserved = wanted.max_bytes if wanted.exact else 0
        if reserved:  # room first: the cache never holds more than its bound, fetches in progress included
            self.store.make_room(reserved, wanted.what)
        try:
            return await self._fetch_into_cache(wanted, where, kind, read, why)
        finally:
            self.store.release(reserved)

    async def _fetch_into_cache(
        self,
        wanted: Wanted,
        where: str,
        kind: str,
        read: Callable[[Wanted, str, Path, Any], Awaitable[int]],
        why: list[str],
    ) -> Path | None:
        tmp = self.store.temporary()
        digest = hashlib.sha256()
        started = time.monotonic()
        try:
            size = await read(wanted, where, tmp, digest)
        except (MirrorError, RpcError, DataError, OSError) as e:
            self._failed(where)
            why.append(f"{_name(where, kind)}: {e}")
            with contextlib.suppress(OSError):
                tmp.unlink()
            return None
        if digest.hexdigest() != wanted.digest:
            self.counters.refused += 1
            self._failed(where)
            why.append(f"{_name(where, kind)} sent a copy whose SHA-256 is {digest.hexdigest()[:12]}...")
            logger.warning(
                "%s from %s is not the file the run pins (SHA-256 %s..., expected %s...); refused",
                wanted.what,
                _name(where, kind),
                digest.hexdigest()[:12],
                wanted.digest[:12],
            )
            with contextlib.suppress(OSError):
                tmp.unlink()
            return None
        try:
            if not wanted.exact:  # a small file whose size only its copy told
                self.store.make_room(size, wanted.what)
                self.store.release(size)  # admitted at once: the room is made, the file takes it
        except DataError:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise
        path = self.store.admit(wanted.digest, tmp)
        self._cooldown.pop(where, None)
        seconds = time.monotonic() - started
        self.counters.files[kind] += 1
        self.counters.bytes[kind] += size
        self.counters.seconds += seconds
        logger.info("fetched %s (%.1f MiB) from %s in %.1f s", wanted.what, size / 2**20, _name(where, kind), seconds)
        return path

    def _failed(self, where: str) -> None:
        self.counters.failed += 1
        _, failures = self._cooldown.get(where, (0.0, 0))
        wait = min(COOLDOWN_S[0] * 2**failures, COOLDOWN_S[1]) * random.uniform(0.8, 1.2)
        self._cooldown[where] = (time.monotonic() + wait, failures + 1)

    async def _from_source(self, wanted: Wanted, source: str, tmp: Path, digest: Any) -> int:
        return await asyncio.to_thread(read_source, source, wanted.name, tmp, wanted.max_bytes, digest.update)

    async def _from_member(self, wanted: Wanted, peer: str, tmp: Path, digest: Any) -> int:
        offset, size = 0, None
        with tmp.open("wb") as out:
            while size is None or offset < size:
                request = FileFetch(run_id=self.run_id, sha256=wanted.digest, offset=offset, length=MAX_CHUNK_BYTES)
                answer, blobs = await self.send(peer, request, [], CHUNK_TIMEOUT_S)
                assert isinstance(answer, FileChunk)
                if size is None:
                    size = answer.size
                    if size > wanted.max_bytes:
                        raise DataError(f"the copy is {size} bytes, over the {wanted.max_bytes} the run allows")
                expected = min(MAX_CHUNK_BYTES, size - offset)
                if answer.size != size or len(blobs[0]) != expected:
                    raise DataError(
                        f"a chunk at {offset} is {len(blobs[0])} bytes of {answer.size}; expected {expected}"
                    )
                await asyncio.to_thread(_keep, out, digest, blobs[0])  # 8 MiB hashed: off the loop
                offset += expected
        return offset

    def status(self) -> dict[str, Any]:
        c = self.counters
        return {
            "fetched_files": dict(c.files),
            "fetched_bytes": dict(c.bytes),
            "refused": c.refused,
            "failed_tries": c.failed,
            "fetch_seconds": round(c.seconds, 1),
            "fetching": sorted(t.get_name().removeprefix("fetch ") for t in self._running.values()),
        }


def _keep(out: Any, digest: Any, chunk: bytes) -> None:
    digest.update(chunk)
    out.write(chunk)


def _name(where: str, kind: str) -> str:
    return f"member {where[:16]}" if kind == "member" else f"source {describe(where)}"
