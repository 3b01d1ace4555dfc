"""This peer's one identity: an Ed25519 key kept in the state directory.

The same key gives the peer its ID everywhere: in the hivemind daemon (p2pd reads it through
``-id``), in the py-libp2p host, and in every record it signs. The peer ID is the libp2p
encoding of the public key (an identity multihash of its protobuf form), so anyone holding a
record and its public key can check which peer signed it without asking anyone else.
"""

from __future__ import annotations

import logging
import os
import stat
from dataclasses import dataclass
from pathlib import Path

import base58
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from swarmd.errors import IdentityError

logger = logging.getLogger(__name__)

KEY_FILENAME = "identity.key"
P2PD_IDENTITY_FILENAME = "p2pd.identity"

# libp2p crypto.proto: KeyType Ed25519 = 1; fields Type (1, varint) and Data (2, bytes).
_ED25519_KEY_TYPE = 1
_IDENTITY_MULTIHASH = 0x00
PUBLIC_KEY_BYTES = 32
SIGNATURE_BYTES = 64


def _protobuf_key(data: bytes) -> bytes:
    assert len(data) < 128, "single-byte varint lengths only"
    return bytes([0x08, _ED25519_KEY_TYPE, 0x12, len(data)]) + data


def peer_id_from_public_key(public_key: bytes) -> str:
    """The libp2p peer ID (base58, ``12D3KooW…``) of an Ed25519 public key."""
    if len(public_key) != PUBLIC_KEY_BYTES:
        raise IdentityError(f"Ed25519 public key must be {PUBLIC_KEY_BYTES} bytes, got {len(public_key)}")
    encoded = _protobuf_key(public_key)
    return base58.b58encode(bytes([_IDENTITY_MULTIHASH, len(encoded)]) + encoded).decode()


def verify_signature(public_key: bytes, signature: bytes, message: bytes) -> bool:
    """True when ``signature`` is ``public_key``'s Ed25519 signature of ``message``."""
    if len(public_key) != PUBLIC_KEY_BYTES or len(signature) != SIGNATURE_BYTES:
        return False
    try:
        Ed25519PublicKey.from_public_bytes(public_key).verify(signature, message)
    except InvalidSignature:
        return False
    return True


@dataclass(frozen=True)
class Identity:
    """An Ed25519 key pair and the peer ID it gives."""

    private_key: Ed25519PrivateKey

    @classmethod
    def generate(cls) -> Identity:
        return cls(Ed25519PrivateKey.generate())

    @property
    def seed(self) -> bytes:
        """The 32-byte private seed (what py-libp2p and p2pd are given)."""
        return self.private_key.private_bytes(
            serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
        )

    @property
    def public_key(self) -> bytes:
        return self.private_key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)

    @property
    def peer_id(self) -> str:
        return peer_id_from_public_key(self.public_key)

    def sign(self, message: bytes) -> bytes:
        return self.private_key.sign(message)

    def p2pd_identity_bytes(self) -> bytes:
        """The key as go-libp2p's marshalled PrivateKey protobuf (Ed25519 data = seed || public)."""
        return _protobuf_key(self.seed + self.public_key)


def load_or_create_identity(state_dir: Path) -> Identity:
    """Read this peer's key from ``state_dir``, creating it (mode 0600) on first start.

    A key that exists but cannot be read is never replaced: doing so would silently give the
    volunteer a new peer ID and lose the reputation the old one earned.
    """
    path = state_dir / KEY_FILENAME
    if path.exists():
        return _load_identity(path)
    identity = Identity.generate()
    pem = identity.private_key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    _write_private_file(path, pem)
    logger.info("Created a new identity %s in %s", identity.peer_id, path)
    return identity


def _load_identity(path: Path) -> Identity:
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        raise IdentityError(
            f"identity key {path} has mode {mode:04o}, readable by others; run 'chmod 600 {path}' "
            "(and consider it leaked if others could read it)"
        )
    try:
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    except (ValueError, TypeError, OSError) as e:
        raise IdentityError(
            f"identity key {path} is corrupt or unreadable ({e}); restore it from a backup, or move it "
            "away to create a new identity (the peer ID will change)"
        ) from None
    if not isinstance(key, Ed25519PrivateKey):
        raise IdentityError(
            f"identity key {path} holds a {type(key).__name__}, not an Ed25519 key; move it away to "
            "create a new identity"
        )
    return Identity(key)


def write_p2pd_identity(identity: Identity, state_dir: Path) -> Path:
    """Write the key in the form p2pd's ``-id`` flag reads; derived from the one key each start."""
    path = state_dir / P2PD_IDENTITY_FILENAME
    _write_private_file(path, identity.p2pd_identity_bytes())
    return path


def _write_private_file(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` with mode 0600, atomically: a crash leaves the old file or the new."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
