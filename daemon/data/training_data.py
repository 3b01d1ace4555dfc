"""The sequences a peer trains on and scores with, read from wherever its copies of them are.

A run's data is either a corpus held in memory (the built-in one, or a local text file every
peer has: byte tokens) or a prepared dataset (``swarmd data prepare``): token shards listed by a
manifest the run pins. Both give the same thing to a cell: ``micro_batch(index, size)``, the
same tokens on every peer for the same index, so that any micro-batch can be recomputed
anywhere. For a prepared dataset, ``ready`` comes first: it makes sure the shards a share reads
are here (fetching them if need be) and pinned in the cache while training reads them, and it
starts fetching the next ``AHEAD`` shards training will read (the whole swarm walks through the
data together, following the ledger), so that a fetch is done long before it is waited for.
Memory never grows with the dataset: a read is one ``pread`` of the window's tokens.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import torch

from swarmd.data.fetching import Fetcher, Wanted
from swarmd.data.store import DataError, FileStore
from swarmd.models.data.windows import Dataset

if TYPE_CHECKING:
    from swarmd.models.data.manifest import Manifest, ShardEntry

logger = logging.getLogger(__name__)

AHEAD = 2
"""Shards fetched ahead of the one training reads."""
ACTIVE = 4
"""Shards read lately that stay pinned: a share spans one or two, and one dropped is recomputed."""


class TrainingData(Protocol):
    """What cells and the held-out score read."""

    train: Dataset

    async def ready(self, first: int, count: int, size: int, deadline_s: float | None = None) -> None:
        """Micro-batches ``first .. first + count - 1`` of ``size`` sequences can be read now;
        ``DataError`` when their files cannot be had within ``deadline_s``."""

    def micro_batch(self, index: int, size: int) -> torch.Tensor:
        """Micro-batch ``index``: data indices ``[index * size, (index + 1) * size)``."""

    async def held_out(self) -> Dataset | None:
        """The held-out split, its files here (None: the data has none)."""

    async def stop(self) -> None:
        """End the fetches it started."""

    def status(self) -> dict[str, Any]: ...


class CorpusData:
    """A corpus held in memory: nothing to fetch."""

    def __init__(self, train: Dataset, held_out: Dataset) -> None:
        self.train = train
        self._held_out = held_out

    async def ready(self, first: int, count: int, size: int, deadline_s: float | None = None) -> None:
        return None

    def micro_batch(self, index: int, size: int) -> torch.Tensor:
        return self.train.micro_batch(index, size)

    async def held_out(self) -> Dataset | None:
        return self._held_out

    async def stop(self) -> None:
        return None

    def status(self) -> dict[str, Any]:
        return {"kind": "corpus", "sequences": len(self.train), "held_out_sequences": len(self._held_out)}


class ShardedData:
    """A prepared dataset's shards, here or fetched (module doc)."""

    def __init__(self, manifest: Manifest, store: FileStore, fetcher: Fetcher, seq_len: int, seed: int) -> None:
        self.manifest = manifest
        self.store = store
        self.fetcher = fetcher
        self._dtype = np.dtype(manifest.dtype).newbyteorder("<")
        self.train = Dataset([e.tokens for e in manifest.train], seq_len, seed, self._reader(manifest.train))
        # A dataset prepared with no held-out split is trained on all the same; it is never scored.
        self._held_out = (
            Dataset([e.tokens for e in manifest.validation], seq_len, seed, self._reader(manifest.validation))
            if manifest.validation
            else None
        )
        self._active: OrderedDict[int, None] = OrderedDict()
        self._ahead: dict[int, asyncio.Task[None]] = {}
        self.waited_s = 0.0
        """Time cells spent waiting for a shard that was not here yet: what prefetching did not hide."""

    def _reader(self, entries: tuple[ShardEntry, ...]) -> Any:
        size = self._dtype.itemsize

        def read(shard: int, start: int, count: int) -> np.ndarray:
            data = self.store.read(entries[shard].sha256, start * size, count * size)
            if len(data) != count * size:
                raise DataError(f"shard file {entries[shard].file} is shorter than its manifest says")
            return np.frombuffer(data, dtype=self._dtype).astype(np.int64)

        return read

    def _wanted(self, shard: int, entries: tuple[ShardEntry, ...] | None = None, what: str = "train shard") -> Wanted:
        entry = (entries or self.manifest.train)[shard]
        size = entry.tokens * self._dtype.itemsize
        return Wanted(entry.sha256, entry.file, size, f"{what} {shard} ({entry.file})", exact=True)

    async def ready(self, first: int, count: int, size: int, deadline_s: float | None = None) -> None:
        train = self.train
        needed = list(dict.fromkeys(train.shard_of(i) for i in range(first * size, (first + count) * size)))
        missing = [s for s in needed if not self.store.has(self.manifest.train[s].sha256)]
        if missing:
            loop = asyncio.get_running_loop()
            started = loop.time()
            await asyncio.gather(*(self.fetcher.ensure(self._wanted(s), deadline_s) for s in missing))
            self.waited_s += loop.time() - started
        for shard in needed:
            self._use(shard)
        for shard in train.shards_ahead((first + count) * size - 1, AHEAD):
            self._fetch_ahead(shard)

    def _use(self, shard: int) -> None:
        digest = self.manifest.train[shard].sha256
        if shard in self._active:
            self._active.move_to_end(shard)
        else:
            self.store.pin(digest)
            self._active[shard] = None
        self.store.touch(digest)
        while len(self._active) > ACTIVE:
            old, _ = self._active.popitem(last=False)
            self.store.unpin(self.manifest.train[old].sha256)

    def _fetch_ahead(self, shard: int) -> None:
        digest = self.manifest.train[shard].sha256
        if shard in self._ahead or self.store.has(digest):
            return
        self.store.pin(digest)  # reserved: fetched for a share that comes soon

        async def fetch() -> None:
            try:
                await self.fetcher.ensure(self._wanted(shard))
            except DataError as e:  # a cache too small: the share itself will wait and say so
                logger.warning("could not fetch train shard %d ahead: %s", shard, e)
            finally:
                self.store.unpin(digest)
                self._ahead.pop(shard, None)

        self._ahead[shard] = asyncio.create_task(fetch(), name=f"fetch ahead {shard}")

    def micro_batch(self, index: int, size: int) -> torch.Tensor:
        return self.train.micro_batch(index, size)

    async def held_out(self) -> Dataset | None:
        if self._held_out is None:
            return None
        entries = self.manifest.validation
        missing = [i for i, e in enumerate(entries) if not self.store.has(e.sha256)]
        await asyncio.gather(*(self.fetcher.ensure(self._wanted(i, entries, "held-out shard")) for i in missing))
        for i in missing:
            self.store.pin(entries[i].sha256)  # small, and read at every score: kept
        return self._held_out

    async def stop(self) -> None:
        tasks = list(self._ahead.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def status(self) -> dict[str, Any]:
        m = self.manifest
        return {
            "kind": "shards",
            "shards": len(m.train),
            "held_out_shards": len(m.validation),
            "held_out_sequences": 0 if self._held_out is None else len(self._held_out),
            "tokens": sum(e.tokens for e in m.train),
            "sequences": len(self.train),
            "shards_here": sum(self.store.has(e.sha256) for e in m.train),
            "reading": list(self._active),
            "fetching_ahead": sorted(self._ahead),
            "waited_s": round(self.waited_s, 2),
        }
