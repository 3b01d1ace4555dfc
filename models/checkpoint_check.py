"""Where a shard checkpoint comes from: a state is believed only when it can be traced.

A checkpoint's own checks (``shard_checkpoint``: the digest, the tensors' dtypes, lengths and
finiteness) say that a file is whole and sane; they do not say whose it is. A file of another
run, of another shard of the same size, or planted by a peer that never held the shard passes
them. So every checkpoint a shard server writes names its :class:`Provenance` (the run, the
shard as stage, index and count, and the holder whose server made the state), and a reader
checks it against the :class:`ShardLayout` it expects and the peers that may have made the
state (:func:`check_checkpoint`). A file without a provenance cannot be traced and is refused.

:class:`TracedShard` is a ``ParameterShard`` that writes its provenance into every checkpoint,
whatever metadata its caller passes (the shard server passes the share ledger's state).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path

from swarmd.models.parameter_shard import ParameterShard
from swarmd.models.shard_config import ShardConfig, ShardError

_KEYS = ("run", "stage", "shard", "shards", "holder")


@dataclass(frozen=True)
class ShardLayout:
    """What a checkpoint of one shard must be in this run."""

    run_id: str
    stage: int
    shard: int
    shards: int
    """How many shards the stage is cut into: the same index in another cut is another slice."""
    span: tuple[int, int]
    """The slice ``[lo, hi)`` of the stage's flat parameters."""
    mode: str
    """The run's step rule (``gradient`` or ``local``): it decides the optimizer's tensors."""


@dataclass(frozen=True)
class Provenance:
    """Who made a checkpoint's state: the run, the shard, and the holder whose server stepped it."""

    run_id: str
    stage: int
    shard: int
    shards: int
    holder: str

    @classmethod
    def of(cls, layout: ShardLayout, holder: str) -> Provenance:
        return cls(layout.run_id, layout.stage, layout.shard, layout.shards, holder)

    def metadata(self) -> dict[str, str]:
        return {
            "run": self.run_id,
            "stage": str(self.stage),
            "shard": str(self.shard),
            "shards": str(self.shards),
            "holder": self.holder,
        }

    @classmethod
    def read(cls, metadata: Mapping[str, str], where: str) -> Provenance:
        """The provenance a checkpoint's (caller) metadata names; ShardError when it names none."""
        missing = [k for k in _KEYS if not metadata.get(k)]
        if missing:
            raise ShardError(
                f"{where} does not name its {', '.join(missing)}: it cannot be traced to a run and a holder; not used"
            )
        numbers = [metadata[k] for k in ("stage", "shard", "shards")]
        if not all(n.isdigit() and len(n) <= 6 for n in numbers):
            raise ShardError(f"{where} names stage, shard and count {numbers}; need three small counts")
        stage, shard, shards = map(int, numbers)
        return cls(metadata["run"], stage, shard, shards, metadata["holder"])

    def check(self, layout: ShardLayout, holders: Collection[str], where: str) -> None:
        """Refuse (ShardError) a state of another run or shard, or made by none of ``holders``."""
        if self.run_id != layout.run_id:
            raise ShardError(f"{where} is a state of run {self.run_id[:40]!r}, not of {layout.run_id!r}; not used")
        ours = (layout.stage, layout.shard, layout.shards)
        if (self.stage, self.shard, self.shards) != ours:
            raise ShardError(
                f"{where} is a state of shard ({self.stage}, {self.shard}) of {self.shards}; "
                f"expected ({ours[0]}, {ours[1]}) of {ours[2]}; not used"
            )
        if self.holder not in holders:
            known = ", ".join(sorted(h[:16] for h in holders)) or "none"
            raise ShardError(
                f"{where} was made by {self.holder[:16]}, who is not a holder of shard {ours[:2]} "
                f"here (known: {known}); not used"
            )


def check_checkpoint(
    metadata: Mapping[str, str],
    span: tuple[int, int],
    version: int,
    layout: ShardLayout,
    holders: Collection[str],
    where: str,
    sent_as: int | None = None,
) -> Provenance:
    """Trace a checkpoint whose form is checked (its caller metadata, slice and version) to
    ``layout`` and one of ``holders``; with ``sent_as``, refuse one at another version than its
    sender said."""
    if tuple(span) != tuple(layout.span):
        raise ShardError(f"{where} holds slice {list(span)}; shard {layout.stage, layout.shard} is {list(layout.span)}")
    provenance = Provenance.read(metadata, where)
    provenance.check(layout, holders, where)
    if sent_as is not None and version != sent_as:
        raise ShardError(f"{where} holds version {version}, not the {sent_as} it was sent as; not used")
    return provenance


def open_traced(path: Path, config: ShardConfig, step_micro_batches: int, span: tuple[int, int]) -> TracedShard:
    """The shard a checkpoint file holds, its form checked (``ShardCheckpoint``); its provenance
    is the caller's to check (``check_checkpoint``) and to set for its own checkpoints."""
    shard = TracedShard.from_checkpoint(path, config, step_micro_batches=step_micro_batches, expected_range=span)
    assert isinstance(shard, TracedShard), "from_checkpoint builds its own class"
    return shard


class TracedShard(ParameterShard):
    """A ParameterShard whose checkpoints name their provenance (module doc)."""

    provenance: Provenance | None = None
    """Set by whoever serves the shard, before its first checkpoint."""

    def checkpoint(self, path: str | Path, metadata: Mapping[str, str] | None = None) -> Path:
        if self.provenance is None:
            raise ShardError(
                f"shard [{self.lo}, {self.hi}) has no provenance; set it before a checkpoint, "
                "which would otherwise be refused by every reader"
            )
        caller = dict(self.metadata if metadata is None else metadata)
        return super().checkpoint(path, {**caller, **self.provenance.metadata()})
