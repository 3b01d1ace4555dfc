"""The weights a run starts from, as this peer finds or fetches them.

The weights a run starts from, on this peer: computed from the checkpoint folder where it is
here, else fetched chunk by chunk from a member that holds it, every chunk checked against the
initial weights' manifest the run spec pins (``swarmd.models.initial_weights``).

Only a shard server that opens a shard the swarm never trained asks for them, and only for its
own slice: cells take their weights from the servers as always. A member that holds the folder
serves any chunk of it (``FileServer`` asks ``provide``), reading from the folder only the
tensors the chunk covers; the last few chunks made are kept in memory for the next asker.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections import OrderedDict
from pathlib import Path

import torch

from swarmd.data.fetching import Fetcher, Wanted
from swarmd.data.store import DataError, FileStore
from swarmd.models.initial_weights import (
    MAX_MANIFEST_BYTES,
    InitialWeights,
    InitialWeightsError,
    chunk_bytes,
    values_of,
)
from swarmd.models.pretrained import checkpoint_digest

logger = logging.getLogger(__name__)

KEEP_CHUNKS = 2
"""Chunks made from the folder and kept for the next asker (32 MiB)."""
SCAN_DEPTH = 2


class InitialWeightsSource:
    def __init__(self, digest: str, store: FileStore, fetcher: Fetcher) -> None:
        self.digest = digest
        """The initial weights' manifest, as the run spec pins it."""
        self.store = store
        self.fetcher = fetcher
        self.weights: InitialWeights | None = None
        self.folder: Path | None = None
        """The checkpoint folder, when it is here and hashes to the manifest's digest."""
        self._made: OrderedDict[str, bytes] = OrderedDict()
        self._lock = threading.Lock()

    async def open(self, candidates: list[Path]) -> None:
        """Read the manifest (fetched if need be), then look for the checkpoint among ``candidates``
        (the creator's own folder, and those under the data folders)."""
        wanted = Wanted(self.digest, "", MAX_MANIFEST_BYTES, "the initial weights' manifest", ("init",), anyone=True)
        path = await self.fetcher.ensure(wanted)
        try:
            self.weights = weights = InitialWeights.parse(await asyncio.to_thread(path.read_bytes))
        except InitialWeightsError as e:
            raise DataError(f"the run's {e}") from None
        for folder in candidates:
            if await asyncio.to_thread(_is_checkpoint, folder, weights.checkpoint):
                self.folder = folder
                logger.info("the run starts from the checkpoint in %s; serving its chunks to members", folder)
                return

    def holds(self) -> bool:
        return self.folder is not None

    def provide(self, digest: str) -> bytes | None:
        """A chunk of the initial weights by its digest, made from the folder (blocking)."""
        weights, folder = self.weights, self.folder
        if weights is None or folder is None:
            return None
        found = weights.locate(digest)
        if found is None:
            return None
        with self._lock:
            data = self._made.get(digest)
        if data is None:
            data = chunk_bytes(folder, weights, *found)
            with self._lock:
                self._made[digest] = data
                while len(self._made) > KEEP_CHUNKS:
                    self._made.popitem(last=False)
        return data

    async def slice(self, stage: int, lo: int, hi: int) -> torch.Tensor:
        """Values ``[lo, hi)`` of ``stage``'s flat vector as the run starts: ``DataError`` when no
        copy of a chunk can be had this round (no member that holds the checkpoint is up)."""
        weights = self.weights
        if weights is None:
            raise DataError("the initial weights' manifest is not here yet")
        parts = []
        for chunk in weights.chunks_of(stage, lo, hi):
            digest = weights.chunks[stage][chunk]
            data = await asyncio.to_thread(self.provide, digest)
            if data is None:
                what = f"chunk {chunk} of stage {stage}'s initial weights"
                c_lo, c_hi = weights.chunk_span(stage, chunk)
                wanted = Wanted(digest, "", 4 * (c_hi - c_lo), what, ("init",), exact=True)
                path = await self.fetcher.get(wanted)
                data = await asyncio.to_thread(path.read_bytes)
            c_lo, c_hi = weights.chunk_span(stage, chunk)
            values = values_of(data)
            if values.numel() != c_hi - c_lo:
                raise DataError(f"chunk {chunk} of stage {stage} holds {values.numel()} values, not {c_hi - c_lo}")
            parts.append(values[max(lo, c_lo) - c_lo : min(hi, c_hi) - c_lo])
        return torch.cat(parts)


def _is_checkpoint(folder: Path, digest: str) -> bool:
    """Whether ``folder`` is the checkpoint with this digest (hashes its files: call in a thread)."""
    if not (folder / "config.json").is_file():
        return False
    try:
        return checkpoint_digest(folder) == digest
    except Exception as e:  # a folder that only looks like a checkpoint
        logger.debug("%s is not the run's checkpoint (%s)", folder, e)
        return False


def checkpoint_candidates(recorded: Path, data_dirs: list[Path]) -> list[Path]:
    """Folders that may hold the run's checkpoint: the one ``run create`` recorded, then any with a
    ``config.json`` under the data folders."""
    found: list[Path] = []
    try:
        files = json.loads(recorded.read_text()) if recorded.is_file() else {}
    except (OSError, ValueError):
        files = {}
    if isinstance(files, dict) and isinstance(files.get("init"), str):
        found.append(Path(files["init"]))
    for folder in data_dirs:
        for depth in range(SCAN_DEPTH + 1):
            found += sorted(p.parent for p in folder.glob("/".join(["*"] * depth + ["config.json"])))
    return list(dict.fromkeys(found))
