"""Share tickets: the ledger keeper's signed word that a share was issued to a pipeline.

A shard server other than the ledger's keeper cannot tell an issued share from a made-up one,
nor whose it is. So the keeper (the holder of shard (0, 0)) signs a ticket for every share it
issues: ``(run, share_id, first, count, pipeline, issued_at)``, 28 bytes packed, with its
identity's Ed25519 key (64 bytes). The ticket travels with the share down the pipeline
(``CellForward.ticket``) and with every contribution that covers it (``Contribute``'s second
blob; a reduction head passes its parts'). A server takes a contribution only when each of its
share IDs has a ticket, in order, that:

- is signed by a peer it has known to keep the ledger (the holder of shard (0, 0), its standby,
  the plan's named holder, or one of those within ``KEEPER_MEMORY_S``: a failover hands the
  ledger on, and a ticket signed before it stays good);
- names a pipeline whose cell of this stage the sender holds (or whose group it heads);
- is at most ``TICKET_LIFE_S`` old (and not from the future, past ``CLOCK_SKEW_S``),

and claims no more micro-batches than the tickets' counts together. Verifying needs only the
signer's peer ID: a libp2p Ed25519 peer ID embeds its public key. A verification costs about
0.1 ms, so each verifier remembers the last ``MAX_VERIFIED`` tickets it verified; the cheap
checks (form, share IDs, pipeline, age) go first and the first bad ticket refuses the whole.
"""

from __future__ import annotations

import base64
import binascii
import struct
import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache

import base58
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from swarmd.peers.records.identity import Identity

TICKET_LIFE_S = 6 * 3600.0
"""How long a ticket is taken after it was issued: longer than any round (H shares on a slow
volunteer, then the contribution and its resends), since a round's first ticket must still be
good when the round ends. Bounds how old a ticket a replay may use (a replay of a share the
server still remembers is refused anyway)."""
CLOCK_SKEW_S = 300.0
KEEPER_MEMORY_S = TICKET_LIFE_S
"""How long a peer seen keeping the ledger is still believed for tickets it signed then."""
MAX_KEEPERS = 16
MAX_VERIFIED = 16_384
"""Verified tickets a verifier remembers (92 bytes each and a peer ID: about 3 MiB)."""

_FIELDS = struct.Struct(">QQIII")  # share_id, first, count, pipeline, issued_at (s)
SIGNATURE_BYTES = 64
TICKET_BYTES = _FIELDS.size + SIGNATURE_BYTES
"""A ticket packed: 92 bytes."""
TICKET_CHARS = (TICKET_BYTES * 4 + 2) // 3
"""A ticket as text (URL-safe base64, unpadded): 123 characters."""
_DOMAIN = b"swarmd/share-ticket/1\0"
_PEER_ID_PREFIX = bytes([0x00, 0x24, 0x08, 0x01, 0x12, 0x20])  # identity multihash of an Ed25519 key


class TicketError(ValueError):
    """A contribution's tickets do not vouch for it; ``reason`` is what its server counts."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class ShareTicket:
    share_id: int
    first: int
    count: int
    pipeline: int
    issued_at: int
    """Unix seconds at the keeper when it issued the share."""
    signature: bytes

    @property
    def fields(self) -> bytes:
        return _FIELDS.pack(self.share_id, self.first, self.count, self.pipeline, self.issued_at)

    @staticmethod
    def message(run_id: str, fields: bytes) -> bytes:
        """What the keeper signs: the run too, so that no ticket of one run serves another."""
        return _DOMAIN + run_id.encode() + b"\0" + fields

    @classmethod
    def sign(
        cls, identity: Identity, run_id: str, *, share_id: int, first: int, count: int, pipeline: int, now: float
    ) -> ShareTicket:
        fields = _FIELDS.pack(share_id, first, count, pipeline, int(now))
        return cls.unpack(fields + identity.sign(cls.message(run_id, fields)))

    def pack(self) -> bytes:
        return self.fields + self.signature

    @classmethod
    def unpack(cls, data: bytes) -> ShareTicket:
        if len(data) != TICKET_BYTES:
            raise TicketError("ticket", f"a share ticket is {TICKET_BYTES} bytes, not {len(data)}")
        share_id, first, count, pipeline, issued_at = _FIELDS.unpack_from(data)
        return cls(share_id, first, count, pipeline, issued_at, bytes(data[_FIELDS.size :]))

    def text(self) -> str:
        return base64.urlsafe_b64encode(self.pack()).decode().rstrip("=")

    @classmethod
    def from_text(cls, text: str) -> ShareTicket:
        if len(text) != TICKET_CHARS:
            raise TicketError("ticket", f"a share ticket is {TICKET_CHARS} characters, not {len(text)}")
        try:
            data = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        except (binascii.Error, ValueError):
            raise TicketError("ticket", "a share ticket is not URL-safe base64") from None
        return cls.unpack(data)

    def signed_by(self, run_id: str, peer_id: str) -> bool:
        key = _verifying_key(peer_id)
        if key is None:
            return False
        try:
            key.verify(self.signature, self.message(run_id, self.fields))
        except InvalidSignature:
            return False
        return True


def public_key_of(peer_id: str) -> bytes | None:
    """The Ed25519 public key a libp2p peer ID embeds (None: not such an ID)."""
    try:
        raw = base58.b58decode(peer_id) if len(peer_id) <= 64 else b""
    except ValueError:
        return None
    if len(raw) != len(_PEER_ID_PREFIX) + 32 or not raw.startswith(_PEER_ID_PREFIX):
        return None
    return raw[len(_PEER_ID_PREFIX) :]


@lru_cache(maxsize=MAX_KEEPERS * 4)
def _verifying_key(peer_id: str) -> Ed25519PublicKey | None:
    """The key to verify ``peer_id``'s signatures with (decoded once: a third of a check's cost)."""
    raw = public_key_of(peer_id)
    return None if raw is None else Ed25519PublicKey.from_public_bytes(raw)


def pack_tickets(texts: Iterable[str]) -> bytes:
    """Tickets as text, packed one after another (a contribution's second blob)."""
    return b"".join(ShareTicket.from_text(t).pack() for t in texts)


def unpack_tickets(blob: bytes, count: int) -> list[ShareTicket]:
    if len(blob) != count * TICKET_BYTES:
        raise TicketError(
            "ticket", f"{count} share tickets take {count * TICKET_BYTES} bytes; the blob holds {len(blob)}"
        )
    return [ShareTicket.unpack(blob[i : i + TICKET_BYTES]) for i in range(0, len(blob), TICKET_BYTES)]


class LedgerKeepers:
    """The peers this one has seen keep the ledger lately: whose tickets it believes."""

    def __init__(self, memory_s: float = KEEPER_MEMORY_S, most: int = MAX_KEEPERS) -> None:
        self.memory_s, self.most = memory_s, most
        self._seen: OrderedDict[str, float] = OrderedDict()

    def trusted(self, now_keepers: Iterable[str | None], now: float) -> list[str]:
        """The keepers seen now (remembered from now on) and those seen within ``memory_s``."""
        for peer in now_keepers:
            if peer:
                self._seen[peer] = now
                self._seen.move_to_end(peer)
        for peer, seen in list(self._seen.items()):
            if now - seen > self.memory_s:
                del self._seen[peer]
        while len(self._seen) > self.most:
            self._seen.popitem(last=False)
        return list(reversed(self._seen))  # the newest first: the likeliest signer


class TicketVerifier:
    """Checks a contribution's tickets; remembers who signed the last ``capacity`` it verified."""

    def __init__(self, capacity: int = MAX_VERIFIED) -> None:
        self.capacity = capacity
        self._verified: OrderedDict[tuple[str, bytes], str] = OrderedDict()
        self._lock = threading.Lock()  # a server checks long lists off the event loop
        self.verifications = 0
        """Signature checks made (those answered from memory not counted)."""

    def signer(self, run_id: str, ticket: ShareTicket, keepers: Sequence[str]) -> str | None:
        """Which of ``keepers`` signed ``ticket`` (None: none of them)."""
        key = (run_id, ticket.pack())
        with self._lock:
            known = self._verified.get(key)
            if known is not None and known in keepers:
                self._verified.move_to_end(key)
                return known
        for peer in keepers:
            self.verifications += 1
            if ticket.signed_by(run_id, peer):
                with self._lock:
                    self._verified[key] = peer
                    while len(self._verified) > self.capacity:
                        self._verified.popitem(last=False)
                return peer
        return None

    def check(
        self,
        run_id: str,
        tickets: Sequence[ShareTicket],
        *,
        share_ids: Sequence[int],
        micro_batches: int,
        pipelines: Iterable[int],
        keepers: Sequence[str],
        now: float,
    ) -> None:
        """TicketError (its ``reason`` to count) unless ``tickets`` vouch for a contribution of
        ``micro_batches`` over ``share_ids`` from a sender whose cells are ``pipelines``."""
        if len(tickets) != len(share_ids) or any(t.share_id != i for t, i in zip(tickets, share_ids, strict=False)):
            raise TicketError(
                "ticket",
                f"a contribution for {len(share_ids)} share(s) carries {len(tickets)} ticket(s); "
                "each share ID needs its ledger ticket, in the same order",
            )
        allowed = set(pipelines)
        if foreign := sorted({t.pipeline for t in tickets} - allowed):
            raise TicketError(
                "ticket_pipeline",
                f"tickets name pipeline(s) {foreign[:4]}, whose cells the sender does not hold here "
                f"(it holds {sorted(allowed)[:4]}); a cell contributes only its own pipeline's shares",
            )
        if old := [t.share_id for t in tickets if not now - TICKET_LIFE_S <= t.issued_at <= now + CLOCK_SKEW_S]:
            raise TicketError(
                "ticket_age",
                f"tickets of shares {old[:4]} were issued more than {TICKET_LIFE_S:.0f} s ago or in the future; "
                "the ledger issues such shares again",
            )
        held = sum(t.count for t in tickets)
        if micro_batches > held:
            raise TicketError(
                "micro_batches",
                f"a contribution claims {micro_batches} micro-batches; its {len(tickets)} share(s) hold {held}",
            )
        for t in tickets:
            if self.signer(run_id, t, keepers) is None:
                raise TicketError(
                    "ticket_signature",
                    f"the ticket of share {t.share_id} is signed by none of the {len(keepers)} peer(s) known "
                    "here to keep the ledger",
                )
