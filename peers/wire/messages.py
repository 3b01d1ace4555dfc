"""Every request and answer between peers (``docs/data-path.md``), as checked dataclasses.

- the data path: ``CellForward`` and ``CellBackward`` between the cells of a pipeline;
  ``Contribute`` and ``Pull`` between a cell and a shard server, ``Reduce`` and
  ``PullFromHead`` from a cell to the head of its reduction group; ``LedgerIssue``,
  ``LedgerComplete`` and ``LedgerAbandon`` at the ledger (the holder of shard (0, 0));
  ``ReplicaLog``, ``ReplicaCheckpoint`` and ``ReplicaFetch`` between a shard server and its
  standby;
- relaying: ``Forward`` (a peer to a relay) and ``Relayed`` (the relay to the target, which
  ``swarmd.peers.wire.rpc`` unwraps before any handler sees it);
- ``Probe``: the bandwidth probe; ``DialBack``: a member asks another to dial it back at the
  addresses its heartbeat announces (``swarmd doctor``'s check, ``swarmd.node.dial_back``).

Bounds come from the contract: a stage < 1024, a shard < 4096, a pipeline < 100,000,
micro-batch indices, share IDs and versions < 2**40, at most 4,096 share IDs in one message.
Version -1 means "none". Tensor blobs are ``swarmd.peers.wire.codecs`` frames, checked by
the handler against what the plan expects.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from swarmd.peers.records.links import MAX_PROBE_BYTES
from swarmd.peers.records.plan_record import MAX_GROUP
from swarmd.peers.taskpool.reduction import REDUCE_WAIT_S
from swarmd.peers.taskpool.tickets import TICKET_CHARS
from swarmd.peers.wire.errors import SchemaError
from swarmd.peers.wire.protocol import MAX_BLOBS, Ack, Answer, Request, bound
from swarmd.peers.wire.sizes import CODECS

MAX_STAGE = 1023
MAX_SHARDS = 4096
MAX_PIPELINE = 99_999
MAX_INDEX = 2**40 - 1
"""Micro-batch indices, share IDs and versions."""
MAX_SHARE_IDS = 4096
MAX_RENEW = 1024
MAX_WANT = 64
MAX_EPOCH_CHARS = 64
MAX_LINEAGE_CHARS = 128
MAX_LEDGER_CHARS = 64 * 1024
MAX_WAIT_S = 30.0
MAX_MICRO_BATCHES = 2**24
"""Micro-batches one contribution covers (H shares of k each)."""
MAX_PEER_ID_CHARS = 128
MAX_FORWARDED_CHARS = 96 * 1024
"""A relayed request's or answer's header, as JSON text: twice this (escaped) still fits the
RPC header limit, and every relayable message fits in it (a unit test checks both)."""
CONTRIBUTION_KINDS = ("gradient", "pseudo")
PULL_KINDS = ("none", "deltas", "full")
FETCH_KINDS = ("none", "checkpoint", "log", "serving")


def _distinct(ids: list[int]) -> None:
    if len(set(ids)) != len(ids):
        raise ValueError("must not name an ID twice")


def _some(ids: list[int]) -> None:
    if not ids:
        raise ValueError("must name at least one")
    _distinct(ids)


def _stage() -> Any:
    return bound(min_value=0, max_value=MAX_STAGE)


def _shard() -> Any:
    return bound(min_value=0, max_value=MAX_SHARDS - 1)


def _shards() -> Any:
    return bound(min_value=1, max_value=MAX_SHARDS)


def _pipeline() -> Any:
    return bound(min_value=0, max_value=MAX_PIPELINE)


def _index(low: int = 0) -> Any:
    return bound(min_value=low, max_value=MAX_INDEX)


def _share_ids(check: Any = _some) -> Any:
    return bound(max_items=MAX_SHARE_IDS, min_value=0, max_value=MAX_INDEX, check=check)


def _versions() -> Any:
    return bound(max_items=MAX_BLOBS, min_value=0, max_value=MAX_INDEX)


def _shard_of(message: Any) -> None:
    if message.shard >= message.shards:
        raise SchemaError(f"{type(message).__name__}.shard", message.shard, f"must be below shards = {message.shards}")


# --- the data path: cells, shard servers, the ledger --------------------------------------------


@dataclass(frozen=True, kw_only=True)
class _CellTensor(Request[Ack]):
    BLOBS = 1
    RELAYABLE = True
    RELAY_FOR_SPEED = True

    pipeline: int = _pipeline()
    stage: int = _stage()
    """The destination cell's stage."""
    epoch: str = bound(min_len=1, max_len=MAX_EPOCH_CHARS)
    """The pipeline's epoch (a digest of its holders): a cell refuses another epoch's (EPOCH)."""
    share_id: int = _index()
    share_first: int = _index()
    """The share's first micro-batch: a cell learns a share from its first message."""
    share_count: int = bound(min_value=1, max_value=MAX_MICRO_BATCHES)
    round_end: bool
    """Whether this share ends its round: after it, every cell contributes."""
    attempt: int = _index()
    """Stage 0's count of the shares it fed: a share fed again (its first try was dropped) has a
    higher one, and a cell starts it afresh instead of taking it for a duplicate."""
    micro_batch: int = _index()
    version: int = _index(-1)
    """The sender's weights version, for status."""
    ticket: str = bound(max_len=TICKET_CHARS, default="")
    """The ledger's signed ticket for the share (``swarmd.peers.taskpool.tickets``): every cell
    of the pipeline sends it with its contribution."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.share_first <= self.micro_batch < self.share_first + self.share_count:
            raise SchemaError(
                f"{type(self).__name__}.micro_batch",
                self.micro_batch,
                f"must lie in its share [{self.share_first}, {self.share_first + self.share_count})",
            )


@dataclass(frozen=True, kw_only=True)
class CellForward(_CellTensor):
    """A forward's output (one activation frame) to the next cell of the pipeline."""

    METHOD = "cell.forward"


@dataclass(frozen=True, kw_only=True)
class CellBackward(_CellTensor):
    """The gradient of a cell's input (one frame) back to the cell that sent it."""

    METHOD = "cell.backward"


@dataclass(frozen=True, kw_only=True)
class Contributed(Answer):
    version: int = _index()
    """The shard's version when it took the contribution."""
    accepted: bool
    """False: dropped (too stale); the cell goes on with the next round."""
    staleness: int = _index()
    weight: float = bound(min_value=0.0, max_value=1.0)
    duplicate: bool
    """Its shares were committed here already (a resend): acknowledged, not applied again."""
    committed: bool = False
    """Its shares are in a committed step already (this contribution completed one, or a
    resend's step was): the cell need not wait for a pull to learn it."""


@dataclass(frozen=True, kw_only=True)
class Contribute(Request[Contributed]):
    """A cell's gradient or pseudo-gradient slice for one shard (one frame in ``codec``)."""

    METHOD = "shard.contribute"
    BLOBS = (1, 2)
    RELAYABLE = True

    stage: int = _stage()
    shard: int = _shard()
    shards: int = _shards()
    """K_s: the shards the cell split its stage into (the server checks it is the plan's)."""
    share_ids: list[int] = _share_ids()
    base_version: int = _index()
    micro_batches: int = bound(min_value=1, max_value=MAX_MICRO_BATCHES)
    kind: str = bound(choices=CONTRIBUTION_KINDS)
    codec: str = bound(choices=CODECS)
    parts: int = bound(min_value=1, max_value=MAX_GROUP, default=1)
    """The cells' contributions this one sums: more than one from a reduction group's head
    (taken whole or refused ``AlreadyApplied``, never in part)."""
    tickets: int = bound(min_value=0, max_value=MAX_SHARE_IDS, default=0)
    """The share tickets in the second blob (one per share ID, in order, packed: ``tickets``);
    0: no second blob (and the server refuses it)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        _shard_of(self)

    def expected_blobs(self) -> int:
        return 2 if self.tickets else 1


@dataclass(frozen=True, kw_only=True)
class Reduce(Contribute):
    """A cell's slice for one shard, to the head of its reduction group
    (``swarmd.peers.taskpool.reduction``), who sums the group's and answers with what the
    server answered the sum (or, refused, this slice alone)."""

    METHOD = "cell.reduce"

    pipeline: int = _pipeline()
    """The sender's pipeline: the head checks it is in its group."""

    def server_wait_s(self) -> float:
        return REDUCE_WAIT_S[1]


@dataclass(frozen=True, kw_only=True)
class _Versioned(Answer):
    """An answer of kind ``none`` (no blob), ``SINGLE`` (one blob, at ``version``) or ``LISTED``
    (one blob per entry of ``versions``, in order). ``versions`` names the version each blob
    leads to: empty for none, empty or ``[version]`` for ``SINGLE``, increasing up to
    ``version`` for ``LISTED``."""

    BLOBS = (0, MAX_BLOBS)
    SINGLE: ClassVar[str]
    LISTED: ClassVar[str]

    version: int = _index(-1)
    kind: str = bound(max_len=16)
    versions: list[int] = _versions()

    def __post_init__(self) -> None:
        super().__post_init__()
        v = self.versions
        if self.kind == self.LISTED:
            ok = bool(v) and all(a < b for a, b in zip(v, v[1:], strict=False)) and v[-1] <= self.version
        else:
            ok = not v or (self.kind == self.SINGLE and v == [self.version])
        if not ok:
            rule = (
                f"must name the version each blob leads to: increasing up to version = {self.version} for "
                f"{self.LISTED}, [] or [version] for {self.SINGLE}, [] for none"
            )
            raise SchemaError(f"{type(self).__name__}.versions", v, rule)

    def expected_blobs(self) -> int:
        return {"none": 0, self.SINGLE: 1}.get(self.kind, len(self.versions))


@dataclass(frozen=True, kw_only=True)
class Pulled(_Versioned):
    """``deltas``: one fp16 frame per version in ``versions``, in order, each the change that
    leads to that version; ``full``: the whole slice in fp32 at ``version``; ``none``: nothing
    newer than the cell's version."""

    SINGLE = "full"
    LISTED = "deltas"

    version: int = _index()
    kind: str = bound(choices=PULL_KINDS)
    committed: list[int] = _share_ids(_distinct)
    """Those of the cell's pending share IDs that are committed at this shard."""
    unknown: list[int] = bound(
        max_items=MAX_SHARE_IDS, min_value=0, max_value=MAX_INDEX, check=_distinct, default_factory=list
    )
    """Those this shard never saw (to send again, to this holder)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if len(self.committed) + len(self.unknown) > MAX_SHARE_IDS:
            raise SchemaError(
                "Pulled.committed",
                len(self.committed),
                f"with unknown ({len(self.unknown)}) must name at most {MAX_SHARE_IDS} IDs",
            )


@dataclass(frozen=True, kw_only=True)
class Pull(Request[Pulled]):
    """A cell's long poll for a newer version of one shard, and for its pending shares."""

    METHOD = "shard.pull"
    RELAYABLE = True

    stage: int = _stage()
    shard: int = _shard()
    shards: int = _shards()
    have_version: int = _index(-1)
    """The version the cell holds; -1: none (the answer is the whole slice)."""
    pending_share_ids: list[int] = _share_ids(_distinct)
    wait_s: float = bound(min_value=0.0, max_value=MAX_WAIT_S)
    """How long the server may wait for a newer version before answering."""

    def __post_init__(self) -> None:
        super().__post_init__()
        _shard_of(self)

    def server_wait_s(self) -> float:
        return self.wait_s


@dataclass(frozen=True, kw_only=True)
class PullFromHead(Pull):
    """A pull of one shard from the head of the cell's reduction group, which relays the deltas
    it pulled from the server (``swarmd.peers.taskpool.reduction``). Refused ``UNAVAILABLE``
    when the head cannot answer it (the cell is new, or further behind than the head keeps):
    the cell pulls from the server."""

    METHOD = "cell.pull"

    pipeline: int = _pipeline()
    """The sender's pipeline: the head checks it is in its group."""


@dataclass(frozen=True, kw_only=True)
class Issued(Answer):
    shares: list[list[int]] = bound(max_items=MAX_WANT, inner_items=3, min_value=0, max_value=MAX_INDEX)
    """Each ``[share_id, first, count]``: the micro-batches ``first .. first + count - 1``."""
    kept: list[int] = bound(max_items=MAX_RENEW, min_value=0, max_value=MAX_INDEX, check=_distinct)
    """Those of the renewed shares still held by the asker."""
    tickets: list[str] = bound(max_items=MAX_WANT, max_len=TICKET_CHARS, default_factory=list)
    """Each share's ticket, signed by the ledger's keeper, in the order of ``shares``."""


@dataclass(frozen=True, kw_only=True)
class LedgerIssue(Request[Issued]):
    """A stage-0 cell asks for shares for its pipeline and renews those it still works on."""

    METHOD = "ledger.issue"
    RELAYABLE = True

    pipeline: int = _pipeline()
    renew: list[int] = bound(max_items=MAX_RENEW, min_value=0, max_value=MAX_INDEX, check=_distinct)
    want: int = bound(min_value=0, max_value=MAX_WANT)


@dataclass(frozen=True, kw_only=True)
class Completed(Answer):
    done: list[int] = _share_ids(_distinct)
    """The shares the ledger now counts as complete (the others were not open)."""


@dataclass(frozen=True, kw_only=True)
class LedgerComplete(Request[Completed]):
    """Shares whose contributions are committed at every shard of stage 0."""

    METHOD = "ledger.complete"
    RELAYABLE = True

    pipeline: int = _pipeline()
    share_ids: list[int] = _share_ids()


@dataclass(frozen=True, kw_only=True)
class LedgerAbandon(Request[Ack]):
    """Shares the pipeline dropped (it lost a cell): the ledger issues them again."""

    METHOD = "ledger.abandon"
    RELAYABLE = True

    pipeline: int = _pipeline()
    share_ids: list[int] = _share_ids()


# --- between a shard server and its standby ------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class _ReplicaBlob(Request[Ack]):
    BLOBS = 1

    stage: int = _stage()
    shard: int = _shard()
    lineage: str = bound(min_len=1, max_len=MAX_LINEAGE_CHARS)
    """The shard's line of holders, so that a standby never mixes two histories."""
    version: int = _index()


@dataclass(frozen=True, kw_only=True)
class ReplicaLog(_ReplicaBlob):
    """One step of a shard, logged at its standby (one fp16 delta frame, leading to
    ``version``): once taken, the step is committed."""

    METHOD = "replica.log"

    share_ids: list[int] = _share_ids(_distinct)
    ledger: str = bound(max_len=MAX_LEDGER_CHARS)
    """The ledger's events since the previous step, as JSON (shard (0, 0) only; else empty)."""


@dataclass(frozen=True, kw_only=True)
class ReplicaCheckpoint(_ReplicaBlob):
    """A shard's checkpoint (one safetensors blob, at ``version``) at its standby."""

    METHOD = "replica.checkpoint"


@dataclass(frozen=True, kw_only=True)
class Fetched(_Versioned):
    """``checkpoint``: one safetensors blob at ``version``; ``log``: one delta frame per
    version in ``versions``, in order; ``none``: nothing after the asked version; ``serving``:
    the peer still serves the shard (at ``version``) under the assignment it follows, and hands
    its state over once it follows the one that moved the shard: ask again."""

    SINGLE = "checkpoint"
    LISTED = "log"

    version: int = _index(-1)
    kind: str = bound(choices=FETCH_KINDS)


@dataclass(frozen=True, kw_only=True)
class ReplicaFetch(Request[Fetched]):
    """What a standby holds of a shard after a version (-1: everything)."""

    METHOD = "replica.fetch"

    stage: int = _stage()
    shard: int = _shard()
    after_version: int = _index(-1)


# --- relaying ------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Forwarded(Answer):
    """The target's answer to a relayed request, as it came (ok or refused), and its blobs."""

    BLOBS = (0, MAX_BLOBS)

    answer: str = bound(min_len=2, max_len=MAX_FORWARDED_CHARS)
    """The target's answer header, as JSON text."""


@dataclass(frozen=True, kw_only=True)
class Forward(Request[Forwarded]):
    """Ask a relay of the plan to pass a request on to ``to`` (``swarmd.node.relay``)."""

    METHOD = "relay.forward"
    BLOBS = (0, MAX_BLOBS)

    to: str = bound(min_len=1, max_len=MAX_PEER_ID_CHARS)
    header: str = bound(min_len=2, max_len=MAX_FORWARDED_CHARS)
    """The inner request's header (its method included), as JSON text."""


@dataclass(frozen=True, kw_only=True)
class Relayed(Request[Answer]):
    """A relay passes a request on, speaking for ``on_behalf_of``. The target believes it only
    from a relay of its plan (else NOT_RELAY) and answers as the inner request's answer."""

    METHOD = "relay.relayed"
    BLOBS = (0, MAX_BLOBS)

    on_behalf_of: str = bound(min_len=1, max_len=MAX_PEER_ID_CHARS)
    header: str = bound(min_len=2, max_len=MAX_FORWARDED_CHARS)
    """The inner request's header, as the asker sent it to the relay."""


# --- probes --------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Probed(Answer):
    bytes: int = bound(min_value=0, max_value=MAX_PROBE_BYTES)
    """The probe's bytes, as received."""


@dataclass(frozen=True, kw_only=True)
class Probe(Request[Probed]):
    """A bandwidth probe: one blob of at most ``MAX_PROBE_BYTES``, counted and dropped."""

    METHOD = "probe"
    BLOBS = 1
    MAX_BYTES = MAX_PROBE_BYTES + 4096
    """Refused while being read beyond this (the blob and its framing)."""


MAX_DIAL_ADDRS = 4
"""Addresses one dial-back tries at most (of those the asker's heartbeat announces)."""


@dataclass(frozen=True, kw_only=True)
class DialedBack(Answer):
    """One entry per address tried, in order: the address, whether a libp2p host answered there,
    and what happened (``connected``, ``refused``, ``timed out``, ...)."""

    addrs: list[str] = bound(max_items=MAX_DIAL_ADDRS, min_len=1, max_len=256)
    reached: list[int] = bound(max_items=MAX_DIAL_ADDRS, min_value=0, max_value=1)
    details: list[str] = bound(max_items=MAX_DIAL_ADDRS, max_len=120)


@dataclass(frozen=True, kw_only=True)
class DialBack(Request[DialedBack]):
    """Dial me back: the answerer opens fresh TCP connections to the addresses the sender's signed
    heartbeat announces (never addresses from the request) and says which a libp2p host answered.
    Members only, and rate-limited per sender: it is a port check, not a scanner."""

    METHOD = "reach.dial_back"
