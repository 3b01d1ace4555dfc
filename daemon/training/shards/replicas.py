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
bounded in count and bytes. A checkpoint is read whole before it is kept: it must load, match
its digest, hold finite tensors of its slice's dtype and length, be at the version its sender
says, and, checked against the stage's layout (``ShardRules``: ``shard_sources.StageGeometry``), be of
this run and shard, made by the sender, at a version the swarm may have reached. A logged
delta must be a finite fp16 vector of the slice's length. Every refusal is ``BadRequest``
(the sender's fault) and counted in ``invalid``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from swarmd.errors import SwarmdError
from swarmd.models.checkpoint_check import ShardLayout, check_checkpoint
from swarmd.models.shard_checkpoint import ShardCheckpoint
from swarmd.models.shard_config import ShardError
from swarmd.peers.taskpool.servers import Shard
from swarmd.peers.wire.codecs import decode_vector
from swarmd.peers.wire.errors import BadRequest, FrameError, NotHolder, Unavailable

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


class ShardRules(Protocol):
    """What a replica is checked against (``shard_sources.StageGeometry``)."""

    def layout(self, key: Shard) -> ShardLayout | None:
        """The shard's run, slice and mode under the assignment in force (None: no assignment yet)."""

    def admits(self, key: Shard, version: int) -> bool:
        """Whether the swarm may have reached ``version`` of the shard (``SeenVersions``)."""


@dataclass
class Replica:
    lineage: str
    holder: str
    length: int = 0
    """The slice's length, as the checkpoint holds it: what every logged delta must have."""
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
    def __init__(self, holder_of: Callable[[Shard], str | None], rules: ShardRules | None = None) -> None:
        """``holder_of``: the shard's rightful holder as the pool resolves it now (None: none).
        ``rules``: what a checkpoint is traced against; without them (a store outside a trainer)
        only its form is checked: whole, finite, of its own slice's shapes, at its version."""
        self.holder_of = holder_of
        self.rules = rules
        self.replicas: dict[Shard, Replica] = {}
        self.logged = 0
        self.refused = 0
        """Replication refused because the sender is not the shard's holder here."""
        self.invalid = 0
        """Checkpoints and log entries refused for what they hold (module doc)."""

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
        self.keep_checkpoint(
            key, sender, lineage, version, data, self.check_checkpoint(key, sender, lineage, version, data)
        )

    def check_checkpoint(self, key: Shard, sender: str, lineage: str, version: int, data: bytes) -> int:
        """Every check of a checkpoint, without keeping it: its slice's length. Reads the whole
        file (about 80 ms for 64 MB), so the server runs it in a worker thread."""
        self._check_sender(key, sender)
        if len(data) > MAX_REPLICA_BYTES:
            raise BadRequest(f"shard {key}: a {len(data)}-byte checkpoint is over the {MAX_REPLICA_BYTES}-byte limit")
        self._check_order(key, lineage, version)
        return self._checked_length(key, sender, version, data)

    def _check_order(self, key: Shard, lineage: str, version: int) -> None:
        replica = self.replicas.get(key)
        if replica is not None and replica.lineage == lineage and version < replica.checkpoint_version:
            raise BadRequest(
                f"shard {key}: checkpoint version {version} is older than the one held ({replica.checkpoint_version})"
            )

    def keep_checkpoint(self, key: Shard, sender: str, lineage: str, version: int, data: bytes, length: int) -> None:
        """Keep a checkpoint ``check_checkpoint`` passed (on the event loop: the replica may have
        moved on while it was checked, so its sender and order are checked again)."""
        self._check_sender(key, sender)
        self._check_order(key, lineage, version)
        replica = self.replicas.get(key)
        if replica is None or replica.lineage != lineage:
            replica = self.replicas[key] = Replica(lineage=lineage, holder=sender)
        replica.checkpoint, replica.checkpoint_version, replica.length = data, version, length
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
        try:  # a NaN or a short delta kept here would poison, or break, the take-over's replay
            decode_vector(entry.delta, replica.length, "fp16")
        except FrameError as e:
            self.invalid += 1
            raise BadRequest(f"shard {key}: logged step {entry.version} refused: {e}") from None
        replica.log.append(entry)
        self.logged += 1

    def _checked_length(self, key: Shard, sender: str, version: int, data: bytes) -> int:
        """Check a checkpoint whole (module doc) before anything of it is kept; its slice's length."""
        layout = None
        if self.rules is not None:
            layout = self.rules.layout(key)
            if layout is None:
                raise Unavailable(f"shard {key}: this peer follows no assignment yet to check a checkpoint against")
            if not self.rules.admits(key, version):
                self.invalid += 1
                raise BadRequest(f"shard {key}: checkpoint version {version} is far past what the swarm has seen")
        where = f"shard {key}'s checkpoint from {sender[:16]}"
        try:
            saved = ShardCheckpoint.parse(data, None if layout is None else layout.mode, None)
            if layout is not None:
                check_checkpoint(saved.caller_metadata(), saved.span, saved.version, layout, {sender}, where, version)
            elif saved.version != version:
                raise ShardError(f"{where} holds version {saved.version}, not the {version} it was sent as")
        except (SwarmdError, ValueError) as e:
            self.invalid += 1
            logger.warning("%s refused: %s", where, e)
            raise BadRequest(f"{where} refused: {e}") from None
        return saved.span[1] - saved.span[0]

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
            "invalid": self.invalid,
        }
