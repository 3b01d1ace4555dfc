"""The shape every signed record about a peer shares: whose it is, for which run, for how long.

Each kind (heartbeat, links, plan, observations, the pool's leases) is a frozen dataclass
deriving from ``SignedRecord``. It declares its own fields, its ``KIND``, ``MAX_BYTES`` and
``MAX_TTL_S``, and how to read its own fields from an untrusted body (``_read_fields``). The
base owns what every kind must check alike, so that a check added for one is made for all:

- the body is exactly the dataclass's fields: signing and parsing cannot drift apart, and a
  field a reader does not know is refused rather than silently dropped;
- the subject: the signer must be the record's ``peer_id`` (nobody can speak for another
  peer), which must also be the DHT subkey the record was stored under;
- the times: a lifetime of at most ``MAX_TTL_S`` (a flood of one-off keys ages out soon),
  issued no further in the future than clock skew explains, and not yet expired.

The wire form is the envelope's (``swarmd.peers.records.envelope``); this module adds no byte.

A record's bytes decide everything but the clock checks and the run asked for, so the records
verified lately are kept by their bytes (``RecentlyParsed``) and only those two checks are made
again: a membership scan reads the same heartbeats every few seconds, and the DHT process
validates each again whenever a bucket comes back from a peer. Under a crowd of 500 keys'
heartbeats, signature checks were a quarter of two training daemons' CPU, and training (at a
CPU share) slowed from several updates a second to 3 updates in 61 s.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import asdict, dataclass, fields
from typing import Any, ClassVar, Self

from swarmd.errors import RecordError, RunSpecError
from swarmd.peers.records.envelope import MAX_RECORD_BYTES, Fields, open_record, sign_record
from swarmd.peers.records.identity import Identity
from swarmd.peers.records.run_id import check_run_id

CLOCK_SKEW_S = 30.0
"""Peers' clocks disagree; a record issued this far in our future is still believed."""
RECENT_RECORDS = 8192
RECENT_BYTES = 16 * 2**20
"""How many records, and how many of their bytes, ``RecentlyParsed`` keeps (whichever is
reached first): a swarm's live records a few times over, a bounded memory whatever is stored."""


@dataclass(frozen=True)
class Head:
    """A record's common fields, checked: what a kind's reader may rely on."""

    run_id: str
    peer_id: str
    issued_at: float
    expires_at: float


@dataclass(frozen=True, kw_only=True)
class SignedRecord:
    """A signed, expiring record one peer publishes about itself (module doc)."""

    KIND: ClassVar[str]
    """The envelope's kind: a signature made for one kind never verifies as another."""
    MAX_BYTES: ClassVar[int] = MAX_RECORD_BYTES
    """The largest record of this kind a reader accepts, checked before it is parsed."""
    MAX_TTL_S: ClassVar[float]
    """The longest lifetime (``expires_at - issued_at``) a reader accepts."""
    READ_EXPIRED: ClassVar[bool] = False
    """Whether an expired record is still read (a plan stands until a newer one replaces it)."""

    run_id: str
    peer_id: str
    """The peer the record is about, and its signer."""
    issued_at: float
    """Unix time the record was signed."""
    expires_at: float
    """Unix time after which readers drop it."""

    @classmethod
    def label(cls) -> str:
        """The kind as prose, for messages (``cell-lease`` -> ``cell lease``)."""
        return cls.KIND.replace("-", " ")

    def sign(self, identity: Identity) -> bytes:
        """The record's wire bytes, signed by ``identity``, which must be the record's peer."""
        if identity.peer_id != self.peer_id:
            raise RecordError(f"cannot sign the {self.label()} of {self.peer_id} with the key of {identity.peer_id}")
        return sign_record(identity, self.KIND, asdict(self))

    @classmethod
    def parse(cls, raw: object, *, run_id: str | None, now: float | None, peer_id: str | None = None) -> Self:
        """Verify and decode a record of this kind for ``run_id``; ``peer_id`` is the DHT subkey
        it was found under. Raises RecordError naming the first check that failed.

        ``run_id=None`` accepts any well-formed run ID: the DHT's validator then checks that the
        record sits under that run's key.

        ``now=None`` skips the clock checks (future issue time, expiry): the DHT's validator does
        so, because hivemind drops a whole list of records when one in it fails, and a record
        that merely expired while in flight must not hide the others.
        """
        key = (cls, bytes(raw), peer_id) if isinstance(raw, bytes | bytearray) else None
        parsed = _RECENT.get(key) if key is not None else None
        if parsed is None:
            parsed = cls._verify(raw, peer_id)
            if key is not None:
                _RECENT.put(key, parsed, len(key[1]))
        assert isinstance(parsed, cls)
        if run_id is not None and parsed.run_id != run_id:
            raise RecordError(f"{cls.label()} is for run {parsed.run_id!r}, not {run_id!r}")
        if now is not None:
            _check_clock(parsed, cls.label(), now, cls.READ_EXPIRED)
        return parsed

    @classmethod
    def _verify(cls, raw: object, peer_id: str | None) -> Self:
        """Everything ``parse`` checks that the bytes alone decide."""
        record = open_record(raw, cls.KIND, cls.MAX_BYTES)
        f = Fields(record.body, cls.KIND)
        f.only({field.name for field in fields(cls)})
        subject, found_run = _check_subject(f, record.signer, cls.label(), peer_id=peer_id)
        issued_at, expires_at = _check_times(f, cls.MAX_TTL_S)
        head = Head(run_id=found_run, peer_id=subject, issued_at=issued_at, expires_at=expires_at)
        return cls(**asdict(head), **cls._read_fields(f, head))

    @classmethod
    def _read_fields(cls, f: Fields, head: Head) -> dict[str, Any]:
        """The kind's own fields read from ``f`` (bounded, typed), by name; ``head`` is checked.

        Raise RecordError for anything out of bounds; ``f.obj`` is the raw body."""
        raise NotImplementedError(f"{cls.__name__} must read its own fields")


def _check_subject(f: Fields, signer: str, label: str, *, peer_id: str | None) -> tuple[str, str]:
    """The peer and run a record is about, checked: the peer must be its signer (and the DHT
    subkey it was stored under), the run well formed."""
    claimed = f.string("peer_id", 128)
    if claimed != signer:
        raise RecordError(f"{label} claims peer {claimed[:60]} but is signed by {signer}")
    if peer_id is not None and peer_id != claimed:
        raise RecordError(f"{label} of {claimed} was stored under another peer's key {peer_id[:60]}")
    found_run = f.string("run_id", 128)
    try:
        check_run_id(found_run)
    except RunSpecError as e:
        raise RecordError(str(e)) from None
    return claimed, found_run


def _check_times(f: Fields, max_ttl_s: float) -> tuple[float, float]:
    """A record's ``issued_at`` and ``expires_at``, checked: a lifetime of at most ``max_ttl_s``."""
    issued_at = f.number("issued_at", 0, 1e11)
    return issued_at, f.number("expires_at", issued_at, issued_at + max_ttl_s)


def _check_clock(record: SignedRecord, label: str, now: float, read_expired: bool) -> None:
    """Issued no further in the future than clock skew explains and (unless ``read_expired``)
    not yet expired."""
    if record.issued_at > now + CLOCK_SKEW_S:
        raise RecordError(f"{label} of {record.peer_id} is issued {record.issued_at - now:.0f} s in the future")
    if not read_expired and record.expires_at <= now:
        raise RecordError(f"{label} of {record.peer_id} expired {now - record.expires_at:.0f} s ago")


class RecentlyParsed:
    """Records verified lately, by (kind, bytes, subkey), least recently used dropped first
    beyond ``entries`` records or ``max_bytes`` of their bytes. Thread-safe: scans check
    records in worker threads. Records are frozen; readers never change their contents."""

    def __init__(self, entries: int = RECENT_RECORDS, max_bytes: int = RECENT_BYTES) -> None:
        self.entries, self.max_bytes = entries, max_bytes
        self._records: OrderedDict[tuple[Any, ...], tuple[SignedRecord, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key: tuple[Any, ...]) -> SignedRecord | None:
        with self._lock:
            found = self._records.get(key)
            if found is None:
                return None
            self._records.move_to_end(key)
            return found[0]

    def put(self, key: tuple[Any, ...], record: SignedRecord, size: int) -> None:
        with self._lock:
            if key in self._records:
                return
            self._records[key] = (record, size)
            self._bytes += size
            while len(self._records) > self.entries or self._bytes > self.max_bytes:
                _, (_, dropped) = self._records.popitem(last=False)
                self._bytes -= dropped

    def __len__(self) -> int:
        return len(self._records)


_RECENT = RecentlyParsed()
