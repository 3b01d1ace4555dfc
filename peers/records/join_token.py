"""Join tokens: the run creator's signed word that one peer may join a private run.

A run whose spec says ``membership = "token"`` admits a peer only when its heartbeat carries a
token for it: a record signed by the creator's key naming the run, the peer and a lifetime.
The run ID is self-certifying (``swarmd.peers.records.run_spec``): it is the hash of the run's
name and its creator's public key. So a token is checked against the run ID alone, without the
spec: its key must hash, with the run's name, to that very run ID, and nobody but the creator
holds that key. A token for one peer is useless to another (it names the peer), and a token
for one run verifies for no other.

Tokens travel as text (base64 of the signed record): printed by ``swarmd run token``, passed
with ``--join-token`` or ``[swarm] join_token``, carried in every heartbeat.
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass
from typing import TypeGuard

import base58

from swarmd.errors import RecordError
from swarmd.peers.records.envelope import Fields, open_record, sign_record
from swarmd.peers.records.identity import Identity
from swarmd.peers.records.run_id import check_run_id, derive_run_id
from swarmd.peers.records.signed import CLOCK_SKEW_S

KIND = "join-token"
MAX_TOKEN_BYTES = 1024
"""A token is about 400 bytes: one key, one signature, two IDs and two times."""
MAX_TOKEN_CHARS = (MAX_TOKEN_BYTES + 2) // 3 * 4
"""The longest token text (base64 of ``MAX_TOKEN_BYTES``) a heartbeat or a config may carry."""
MAX_TOKEN_DAYS = 366
"""Longest lifetime a creator may give a token: a member past it asks for a new one."""
DEFAULT_TOKEN_DAYS = 30
_DAY_S = 86400.0
_BASE64 = re.compile(r"[A-Za-z0-9+/]+={0,2}")
# An Ed25519 peer ID: identity multihash (0x00, length 36) of the key's protobuf form.
_PEER_ID_PREFIX = bytes([0x00, 36, 0x08, 0x01, 0x12, 0x20])


@dataclass(frozen=True, kw_only=True)
class JoinToken:
    """A verified token: ``creator`` (the key that certifies ``run_id``) admits ``peer_id``."""

    run_id: str
    peer_id: str
    """The one peer the token admits."""
    issued_at: float
    expires_at: float
    creator: str
    """Peer ID of the signer, which the run ID certifies as the run's creator."""
    text: str
    """The token as it travels (base64 of the signed record)."""

    def is_valid(self, now: float) -> bool:
        return self.issued_at <= now + CLOCK_SKEW_S and now < self.expires_at


def is_token_text(text: object) -> TypeGuard[str]:
    """Whether ``text`` has a token's form (base64, bounded); says nothing of its signature."""
    return isinstance(text, str) and len(text) <= MAX_TOKEN_CHARS and _BASE64.fullmatch(text) is not None


def check_peer_id(peer_id: str) -> str:
    """Validate the form of a peer ID typed by a user: an Ed25519 libp2p ID (``12D3KooW…``)."""
    try:
        raw = base58.b58decode(peer_id) if isinstance(peer_id, str) and len(peer_id) <= 64 else b""
    except ValueError:
        raw = b""
    if len(raw) != len(_PEER_ID_PREFIX) + 32 or not raw.startswith(_PEER_ID_PREFIX):
        shown = peer_id[:80] if isinstance(peer_id, str) else type(peer_id).__name__
        raise RecordError(
            f"peer ID {shown!r} is malformed: expected an Ed25519 peer ID (52 characters, 12D3KooW...) "
            "as 'swarmd status' prints it on that peer"
        )
    return peer_id


def sign_join_token(identity: Identity, run_id: str, peer_id: str, *, now: float, days: float) -> JoinToken:
    """The creator's token admitting ``peer_id`` to ``run_id`` for ``days`` from ``now``.

    Raises RecordError when ``identity`` is not the run's creator (its key does not certify
    ``run_id``), or when the peer ID, run ID or lifetime is malformed."""
    check_run_id(run_id)
    check_peer_id(peer_id)
    if not 0 < days <= MAX_TOKEN_DAYS:
        raise RecordError(f"a join token lives 0 to {MAX_TOKEN_DAYS} days, not {days}; pick --days in that range")
    name = run_id.split(".", 1)[0]
    if derive_run_id(name, identity.public_key) != run_id:
        raise RecordError(
            f"this peer ({identity.peer_id}) did not create run {run_id}, so its tokens would admit nobody; "
            "run 'swarmd run token' with the state directory (the key) of the daemon that ran 'swarmd run create'"
        )
    body = {"run_id": run_id, "peer_id": peer_id, "issued_at": now, "expires_at": now + days * _DAY_S}
    text = base64.b64encode(sign_record(identity, KIND, body)).decode()
    return parse_join_token(text, run_id=run_id, now=now)


def parse_join_token(text: object, *, run_id: str, peer_id: str | None = None, now: float | None) -> JoinToken:
    """Verify a token for ``run_id`` (and ``peer_id`` when given); raise RecordError naming
    the first check that failed. ``now=None`` skips the clock checks (a reader that caches
    verified tokens checks ``JoinToken.is_valid`` on each use)."""
    if not is_token_text(text):
        size = len(text) if isinstance(text, str) else type(text).__name__
        raise RecordError(
            f"join token is not base64 text of at most {MAX_TOKEN_CHARS} characters (got {size}); "
            "pass it exactly as 'swarmd run token' printed it"
        )
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise RecordError("join token is not valid base64; pass it exactly as 'swarmd run token' printed it") from None
    record = open_record(raw, KIND, MAX_TOKEN_BYTES)
    f = Fields(record.body, "join token")
    f.only({"run_id", "peer_id", "issued_at", "expires_at"})
    found_run = f.string("run_id", 128)
    if found_run != run_id:
        raise RecordError(f"join token is for run {found_run[:60]!r}, not {run_id}")
    name = run_id.split(".", 1)[0]
    if derive_run_id(name, record.public_key) != run_id:
        raise RecordError(f"join token for run {run_id} is signed by {record.signer}, who did not create that run")
    admitted = f.string("peer_id", 128)
    if peer_id is not None and admitted != peer_id:
        raise RecordError(f"join token admits peer {admitted[:60]}, not {peer_id}")
    issued_at = f.number("issued_at", 0, 1e11)
    expires_at = f.number("expires_at", issued_at, issued_at + MAX_TOKEN_DAYS * _DAY_S)
    if now is not None and issued_at > now + CLOCK_SKEW_S:
        raise RecordError(f"join token is issued {issued_at - now:.0f} s in the future; check this machine's clock")
    if now is not None and expires_at <= now:
        ago = (now - expires_at) / _DAY_S
        raise RecordError(f"join token for {admitted} expired {ago:.1f} days ago; ask the run's creator for a new one")
    return JoinToken(
        run_id=run_id,
        peer_id=admitted,
        issued_at=issued_at,
        expires_at=expires_at,
        creator=record.signer,
        text=text,
    )
