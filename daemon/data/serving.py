"""Serving the run's files this peer holds to the members that ask (``FileFetch``).

Only members are served, in every run, open or private, whatever its spec says of who may pull
the weights (``access.checkpoints`` opens ``Pull`` alone): data shards, the manifest, the
tokenizer and the initial weights' chunks are a member's business (the request server admits
no stranger for ``FileFetch``, ``swarmd.node.request_gate``, and the handler asks again). Only
files of this run's store are sent (each checked against its digest before it was ever used),
and only in chunks of at most ``MAX_CHUNK_BYTES``. At most ``CONCURRENT_READS``
chunks are read from disk at once; the bytes sent are paced by the owner's ``[limits]`` caps
on training traffic like every other answer (``swarmd.peers.wire.shaping``), and count
towards its daily cap. Files computed rather than stored (a chunk of the initial weights,
``swarmd.data.initial_weights``) come from the providers registered for them.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable

from swarmd.data.store import DataError, FileStore
from swarmd.peers.wire.errors import NotHolder, NotMember
from swarmd.peers.wire.file_messages import FileChunk, FileFetch

logger = logging.getLogger(__name__)

CONCURRENT_READS = 4

Provider = Callable[[str], bytes | None]
"""The whole content of a computed file by its digest, or None when it is not one of its own
(blocking: called in a worker thread)."""


class FileServer:
    def __init__(self, store: FileStore, is_member: Callable[[str], bool]) -> None:
        self.store = store
        self.is_member = is_member
        self.providers: list[Provider] = []
        self.served: Counter[str] = Counter()
        """Bytes served, by asking peer (the first 16 characters of its ID)."""
        self.refused = 0
        self._reads = asyncio.Semaphore(CONCURRENT_READS)

    async def handle(self, sender: str, request: FileFetch, blobs: list[bytes]) -> tuple[FileChunk, list[bytes]]:
        if not self.is_member(sender):
            raise NotMember(f"{sender[:16]} is not a live member of this run; only members are sent its files")
        async with self._reads:
            found = await asyncio.to_thread(self._read, request)
        if found is None:
            self.refused += 1
            raise NotHolder(f"this peer holds no checked copy of file {request.sha256[:12]}...; ask another member")
        size, chunk = found
        self.served[sender[:16]] += len(chunk)
        return FileChunk(size=size), [chunk]

    def _read(self, request: FileFetch) -> tuple[int, bytes] | None:
        digest = request.sha256
        if self.store.find(digest) is not None:
            try:
                size = self.store.size(digest)
                return (
                    (size, self.store.read(digest, request.offset, request.length)) if request.offset <= size else None
                )
            except DataError:  # evicted meanwhile
                return None
        for provider in self.providers:
            data = provider(digest)
            if data is not None:
                if request.offset > len(data):
                    return None
                return len(data), data[request.offset : request.offset + request.length]
        return None

    def status(self) -> dict[str, object]:
        return {"served_bytes": sum(self.served.values()), "served_peers": len(self.served), "refused": self.refused}
