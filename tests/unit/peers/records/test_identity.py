"""peers/records/identity.py: the key on disk, the peer ID it gives, and signature checks."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from swarmd.errors import IdentityError
from swarmd.peers.records.identity import (
    KEY_FILENAME,
    P2PD_IDENTITY_FILENAME,
    Identity,
    load_or_create_identity,
    peer_id_from_public_key,
    verify_signature,
    write_p2pd_identity,
)

pytestmark = pytest.mark.timeout(30)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_key_created_0600_and_reused(tmp_path: Path) -> None:
    first = load_or_create_identity(tmp_path)
    key_path = tmp_path / KEY_FILENAME
    assert key_path.is_file()
    assert _mode(key_path) == 0o600
    content = key_path.read_bytes()

    second = load_or_create_identity(tmp_path)
    assert second.peer_id == first.peer_id
    assert second.seed == first.seed
    assert key_path.read_bytes() == content
    # No temporary files left behind by the atomic write.
    assert sorted(p.name for p in tmp_path.iterdir()) == [KEY_FILENAME]


def test_peer_id_matches_py_libp2p() -> None:
    # Imported here: py-libp2p and hivemind register clashing protobuf symbols, so keep the
    # import out of module scope (see test_swarm_dht_validator.py).
    from libp2p.crypto.ed25519 import create_new_key_pair
    from libp2p.peer.id import ID

    for _ in range(3):
        identity = Identity.generate()
        expected = ID.from_pubkey(create_new_key_pair(identity.seed).public_key).to_base58()
        assert identity.peer_id == expected
        assert identity.peer_id.startswith("12D3KooW")


def test_peer_id_from_public_key_rejects_wrong_length() -> None:
    with pytest.raises(IdentityError, match="32 bytes"):
        peer_id_from_public_key(b"\x00" * 31)


def test_corrupt_key_is_refused_and_left_untouched(tmp_path: Path) -> None:
    key_path = tmp_path / KEY_FILENAME
    garbage = b"-----BEGIN PRIVATE KEY-----\nnot base64 at all\n-----END PRIVATE KEY-----\n\x00\xff"
    fd = os.open(key_path, os.O_WRONLY | os.O_CREAT, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(garbage)
    with pytest.raises(IdentityError) as info:
        load_or_create_identity(tmp_path)
    assert str(key_path) in str(info.value)
    assert "corrupt" in str(info.value)
    assert key_path.read_bytes() == garbage
    assert _mode(key_path) == 0o600


def test_empty_key_file_is_refused(tmp_path: Path) -> None:
    key_path = tmp_path / KEY_FILENAME
    key_path.touch(mode=0o600)
    with pytest.raises(IdentityError, match=str(key_path)):
        load_or_create_identity(tmp_path)
    assert key_path.read_bytes() == b""


def test_key_readable_by_others_is_refused(tmp_path: Path) -> None:
    load_or_create_identity(tmp_path)
    key_path = tmp_path / KEY_FILENAME
    content = key_path.read_bytes()
    key_path.chmod(0o644)
    with pytest.raises(IdentityError) as info:
        load_or_create_identity(tmp_path)
    assert "0644" in str(info.value)
    assert "chmod 600" in str(info.value)
    assert key_path.read_bytes() == content


def test_non_ed25519_key_is_refused(tmp_path: Path) -> None:
    key_path = tmp_path / KEY_FILENAME
    pem = ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    fd = os.open(key_path, os.O_WRONLY | os.O_CREAT, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    with pytest.raises(IdentityError, match="not an Ed25519 key") as info:
        load_or_create_identity(tmp_path)
    assert str(key_path) in str(info.value)
    assert key_path.read_bytes() == pem


def test_p2pd_identity_bytes() -> None:
    identity = Identity.generate()
    data = identity.p2pd_identity_bytes()
    assert data[:4] == bytes([0x08, 0x01, 0x12, 0x40])
    assert len(data) == 4 + 64
    assert data[4:36] == identity.seed
    assert data[36:] == identity.public_key


def test_write_p2pd_identity(tmp_path: Path) -> None:
    identity = Identity.generate()
    path = write_p2pd_identity(identity, tmp_path)
    assert path == tmp_path / P2PD_IDENTITY_FILENAME
    assert path.read_bytes() == identity.p2pd_identity_bytes()
    assert _mode(path) == 0o600
    # Rewritten on each start: the second write replaces the first.
    write_p2pd_identity(identity, tmp_path)
    assert path.read_bytes() == identity.p2pd_identity_bytes()


def test_verify_signature() -> None:
    identity = Identity.generate()
    message = b"hello swarm"
    signature = identity.sign(message)
    assert verify_signature(identity.public_key, signature, message)

    assert not verify_signature(identity.public_key, signature, message + b"!")
    assert not verify_signature(identity.public_key, signature, b"hello swarN")
    tampered = bytes([signature[0] ^ 1]) + signature[1:]
    assert not verify_signature(identity.public_key, tampered, message)
    assert not verify_signature(Identity.generate().public_key, signature, message)


@pytest.mark.parametrize(("pk_len", "sig_len"), [(31, 64), (33, 64), (0, 64), (32, 63), (32, 65), (32, 0)])
def test_verify_signature_rejects_wrong_lengths(pk_len: int, sig_len: int) -> None:
    identity = Identity.generate()
    message = b"m"
    signature = identity.sign(message)
    public_key = (identity.public_key + b"\x00")[:pk_len]
    signature = (signature + b"\x00")[:sig_len]
    assert not verify_signature(public_key, signature, message)
