"""A standby's replicas of the shards it stands by for: what makes a server's step committed.

A shard's server logs every step here before it tells anyone about it (``ReplicaLog``: the
step's fp16 delta, the share IDs it applied and the share ledger's state), and sends a
checkpoint every ``checkpoint_every`` steps (``ReplicaCheckpoint``); the log after the newest
checkpoint is kept. If the server vanishes, this peer takes the shard over from its replica
(the checkpoint, then every logged delta replayed in order: the exact weights of the last
committed version), or hands the replica to whoever the plan names (``ReplicaFetch``).

Nothing is taken on trust: a log entry or a checkpoint comes only from the shard's rightful
holder (the trainer's view of the pool, ``holder_of``), under the lineage of its current
holding; entries must follow each other without a gap; the log and the checkpoint are
bounded in count and bytes. A checkpoint's contents are checked when it is opened.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from swarmd.peers.taskpool.servers import Shard
from swarmd.peers.wire.errors import BadRequest, NotHolder, Unavailable

logger = logging.getLogger(__name__)

MAX_LOG_ENTRIES = 256
MAX_REPLICA_BYTES = 1 << 31
"""Memory one shard's replica may take here (what a faulty holder can make us keep)."""


@dataclass(frozen=True)
class LogEntry:
    version: int
    delta: bytes
    """The step's fp16 delta frame, as the server sent it to cells."""
    share_ids: tuple[int, ...]
    ledger: str
    """The share ledger's state after the step (shard (0, 0) only; empty elsewhere)."""


@dataclass
class Replica:
    lineage: str
    holder: str
    checkpoint: bytes | None = None
    checkpoint_version: int = -1
    log: list[LogEntry] = field(default_factory=list)

    @property
    def version(self) -> int:
        """The newest version this replica rebuilds (-1: nothing usable yet)."""
        if self.checkpoint is None:
            return -1
        return self.log[-1].version if self.log else self.checkpoint_version

    @property
    def nbytes(self) -> int:
        return len(self.checkpoint or b"") + sum(len(e.delta) + len(e.ledger) for e in self.log)


class ReplicaStore:
    def __init__(self, holder_of: Callable[[Shard], str | None]) -> None:
        """``holder_of``: the shard's rightful holder as the pool resolves it now (None: none)."""
        self.holder_of = holder_of
        self.replicas: dict[Shard, Replica] = {}
        self.logged = 0
        self.refused = 0

    def _check_sender(self, key: Shard, sender: str) -> None:
        holder = self.holder_of(key)
        if holder != sender:
            self.refused += 1
            raise NotHolder(
                f"shard {key}: {sender[:16]} is not its holder here ({str(holder)[:16]}); "
                "only the rightful holder replicates"
            )

    def store_checkpoint(self, key: Shard, sender: str, lineage: str, version: int, data: bytes) -> None:
        """A new checkpoint from the holder: the log before it is no longer needed."""
        self._check_sender(key, sender)
        if len(data) > MAX_REPLICA_BYTES:
            raise BadRequest(f"shard {key}: a {len(data)}-byte checkpoint is over the {MAX_REPLICA_BYTES}-byte limit")
        replica = self.replicas.get(key)
        if replica is None or replica.lineage != lineage:
            replica = self.replicas[key] = Replica(lineage=lineage, holder=sender)
        elif version < replica.checkpoint_version:
            raise BadRequest(
                f"shard {key}: checkpoint version {version} is older than the one held ({replica.checkpoint_version})"
            )
        replica.checkpoint, replica.checkpoint_version = data, version
        replica.log = [e for e in replica.log if e.version > version]

    def append(self, key: Shard, sender: str, lineage: str, entry: LogEntry) -> None:
        """A committed step from the holder; it must follow the replica without a gap."""
        self._check_sender(key, sender)
        replica = self.replicas.get(key)
        if replica is None or replica.lineage != lineage or replica.checkpoint is None:
            raise Unavailable(f"shard {key}: no checkpoint of this holding here yet; send one first")
        if entry.version <= replica.version:
            return  # sent again after a lost answer: kept once
        if entry.version != replica.version + 1:
            raise Unavailable(
                f"shard {key}: step {entry.version} does not follow {replica.version}; send a checkpoint first"
            )
        if len(replica.log) >= MAX_LOG_ENTRIES or replica.nbytes + len(entry.delta) > MAX_REPLICA_BYTES:
            raise Unavailable(
                f"shard {key}: {len(replica.log)} steps logged since the checkpoint, the limit is "
                f"{MAX_LOG_ENTRIES}; send a checkpoint"
            )
        replica.log.append(entry)
        self.logged += 1

    def newest(self, key: Shard) -> Replica | None:
        replica = self.replicas.get(key)
        return replica if replica is not None and replica.checkpoint is not None else None

    def forget(self, key: Shard) -> None:
        self.replicas.pop(key, None)

    def status(self) -> dict[str, object]:
        return {
            "shards": {f"{s}/{k}": r.version for (s, k), r in sorted(self.replicas.items())},
            "logged": self.logged,
            "refused": self.refused,
        }
