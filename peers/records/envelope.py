"""Signed records: the envelope every piece of swarm state travels in.

A record is ``kind`` + ``body`` (a JSON object) signed by one Ed25519 key. On the wire it is
one canonical JSON object::

    {"v": 1, "kind": "heartbeat", "body": "<canonical JSON>", "pk": "<b64>", "sig": "<b64>"}

The signature covers a domain-separated message (``swarmd-record-v1``, the kind, the body
bytes), so a signature made for one kind can never be replayed as another. Everything here
treats its input as hostile: the size is checked before parsing, the schema before use, and
the signature before anything trusts the body.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from typing import Any

from swarmd.errors import RecordError
from swarmd.peers.records.identity import Identity, peer_id_from_public_key, verify_signature

RECORD_VERSION = 1
_DOMAIN = b"swarmd-record-v1\x00"
# The largest record any reader accepts; each kind sets a tighter bound of its own.
MAX_RECORD_BYTES = 64 * 1024


def canonical_json(obj: Any) -> bytes:
    """One byte string per value: sorted keys, no whitespace, UTF-8, no NaN."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def _parse_json(data: bytes, what: str) -> Any:
    # Hostile JSON can also nest past the recursion limit or carry a 5000-digit integer.
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as e:
        raise RecordError(f"{what} is not valid JSON ({type(e).__name__}: {str(e)[:80]})") from None


def _signed_message(kind: str, body: bytes) -> bytes:
    return _DOMAIN + kind.encode() + b"\x00" + body


@dataclass(frozen=True)
class OpenedRecord:
    """An envelope whose signature has been checked: ``signer`` really signed ``body``.

    What the body says is not checked yet: that is each kind's reader
    (``swarmd.peers.records.signed`` for the records peers publish about themselves)."""

    kind: str
    body: dict[str, Any]
    public_key: bytes
    signer: str  # the peer ID of public_key
    raw: bytes  # the exact bytes received, to re-publish unchanged


def sign_record(identity: Identity, kind: str, body: dict[str, Any]) -> bytes:
    """Sign ``body`` as a record of ``kind`` and return its wire bytes."""
    body_bytes = canonical_json(body)
    envelope = {
        "v": RECORD_VERSION,
        "kind": kind,
        "body": body_bytes.decode(),
        "pk": base64.b64encode(identity.public_key).decode(),
        "sig": base64.b64encode(identity.sign(_signed_message(kind, body_bytes))).decode(),
    }
    raw = canonical_json(envelope)
    if len(raw) > MAX_RECORD_BYTES:
        raise RecordError(f"{kind} record is {len(raw)} bytes, over the {MAX_RECORD_BYTES}-byte limit")
    return raw


def open_record(raw: object, kind: str, max_bytes: int = MAX_RECORD_BYTES) -> OpenedRecord:
    """Check size, envelope schema and signature of ``raw``; return the verified record.

    Raises RecordError naming the first check that failed. The body's own schema is the
    caller's to check (see ``SignedRecord.parse`` in ``swarmd.peers.records.signed``).
    """
    if not isinstance(raw, bytes | bytearray):
        raise RecordError(f"{kind} record must be bytes, got {type(raw).__name__}")
    raw = bytes(raw)
    if len(raw) > max_bytes:
        raise RecordError(f"{kind} record is {len(raw)} bytes, over the {max_bytes}-byte limit")
    envelope = _parse_json(raw, f"{kind} record")
    if not isinstance(envelope, dict) or set(envelope) != {"v", "kind", "body", "pk", "sig"}:
        raise RecordError(f"{kind} record has the wrong envelope fields")
    if type(envelope["v"]) is not int or envelope["v"] != RECORD_VERSION:
        raise RecordError(f"{kind} record version {envelope['v']!r} is not {RECORD_VERSION}; upgrade swarmd")
    if envelope["kind"] != kind:
        raise RecordError(f"expected a {kind} record, got {str(envelope['kind'])[:40]!r}")
    if not all(isinstance(envelope[k], str) for k in ("body", "pk", "sig")):
        raise RecordError(f"{kind} record fields body, pk and sig must be strings")
    try:
        public_key = base64.b64decode(envelope["pk"], validate=True)
        signature = base64.b64decode(envelope["sig"], validate=True)
    except (binascii.Error, ValueError):
        raise RecordError(f"{kind} record has a malformed key or signature encoding") from None
    try:
        body_bytes = envelope["body"].encode()
    except UnicodeEncodeError:  # a lone surrogate, as JSON "\ud800", has no UTF-8 form
        raise RecordError(f"{kind} record body is not valid Unicode") from None
    if not verify_signature(public_key, signature, _signed_message(kind, body_bytes)):
        raise RecordError(f"{kind} record has a bad signature")
    body = _parse_json(body_bytes, f"{kind} record body")
    if not isinstance(body, dict):
        raise RecordError(f"{kind} record body must be a JSON object")
    return OpenedRecord(kind, body, public_key, peer_id_from_public_key(public_key), raw)


def _printable(text: str) -> bool:
    # Peers' strings end up in logs and terminals: no escapes, newlines or surrogates.
    return text.isprintable() and all(not "\ud800" <= c <= "\udfff" for c in text)


def peek_kind(raw: object, max_bytes: int = MAX_RECORD_BYTES) -> str:
    """The kind an envelope says it is (unverified: only to pick the parser that verifies it)."""
    if not isinstance(raw, bytes | bytearray) or len(raw) > max_bytes:
        raise RecordError("record is not bytes, or over the size limit")
    envelope = _parse_json(bytes(raw), "record")
    kind = envelope.get("kind") if isinstance(envelope, dict) else None
    if not isinstance(kind, str):
        raise RecordError("record has no kind")
    return kind


class Fields:
    """Typed reads from an untrusted JSON object, with errors that name the field."""

    def __init__(self, obj: dict[str, Any], what: str) -> None:
        self.obj = obj
        self.what = what

    def _get(self, name: str, types: type | tuple[type, ...]) -> Any:
        if name not in self.obj:
            raise RecordError(f"{self.what}: missing field {name!r}")
        value = self.obj[name]
        # bool is an int in Python; never accept it where a number is meant.
        if isinstance(value, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
            raise RecordError(f"{self.what}: field {name!r} must not be a boolean")
        if not isinstance(value, types):
            raise RecordError(f"{self.what}: field {name!r} has type {type(value).__name__}")
        return value

    def string(self, name: str, max_len: int = 256) -> str:
        value: str = self._get(name, str)
        if len(value) > max_len:
            raise RecordError(f"{self.what}: field {name!r} is {len(value)} characters, over {max_len}")
        if not _printable(value):
            raise RecordError(f"{self.what}: field {name!r} holds control characters")
        return value

    def number(self, name: str, lo: float, hi: float) -> float:
        try:
            value = float(self._get(name, (int, float)))
        except OverflowError:
            raise RecordError(f"{self.what}: field {name!r} is too large a number") from None
        if not lo <= value <= hi:
            raise RecordError(f"{self.what}: field {name!r} = {value} is outside [{lo}, {hi}]")
        return value

    def integer(self, name: str, lo: int, hi: int) -> int:
        value: int = self._get(name, int)
        if not lo <= value <= hi:
            raise RecordError(f"{self.what}: field {name!r} = {value} is outside [{lo}, {hi}]")
        return value

    def boolean(self, name: str) -> bool:
        value: bool = self._get(name, bool)
        return value

    def strings(self, name: str, max_items: int, max_len: int = 256) -> list[str]:
        values = self._get(name, list)
        if len(values) > max_items:
            raise RecordError(f"{self.what}: field {name!r} has {len(values)} items, over {max_items}")
        if not all(isinstance(v, str) and len(v) <= max_len and _printable(v) for v in values):
            raise RecordError(f"{self.what}: field {name!r} must hold strings of at most {max_len} characters")
        return list(values)

    def object(self, name: str) -> Fields:
        return Fields(self._get(name, dict), f"{self.what}.{name}")

    def only(self, allowed: set[str]) -> None:
        unknown = set(self.obj) - allowed
        if unknown:
            raise RecordError(f"{self.what}: unknown fields {sorted(unknown)[:5]}")
