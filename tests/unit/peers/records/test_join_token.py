"""peers/records/join_token.py: the creator's token, checked against the run ID alone."""

from __future__ import annotations

import base64
import json

import pytest

from swarmd.errors import RecordError
from swarmd.peers.records.envelope import sign_record
from swarmd.peers.records.identity import Identity
from swarmd.peers.records.join_token import (
    KIND,
    MAX_TOKEN_CHARS,
    MAX_TOKEN_DAYS,
    check_peer_id,
    is_token_text,
    parse_join_token,
    sign_join_token,
)
from swarmd.peers.records.run_spec import derive_run_id

pytestmark = pytest.mark.timeout(30)

NOW = 1_700_000_000.0
DAY = 86400.0


@pytest.fixture(scope="module")
def creator() -> Identity:
    return Identity.generate()


@pytest.fixture(scope="module")
def joiner() -> Identity:
    return Identity.generate()


@pytest.fixture(scope="module")
def run_id(creator: Identity) -> str:
    return derive_run_id("private-run", creator.public_key)


def forge(signer: Identity, **body: object) -> str:
    """A token body signed directly, bypassing sign_join_token's checks."""
    return base64.b64encode(sign_record(signer, KIND, body)).decode()


def test_round_trip(creator: Identity, joiner: Identity, run_id: str) -> None:
    token = sign_join_token(creator, run_id, joiner.peer_id, now=NOW, days=7)
    assert is_token_text(token.text) and len(token.text) <= MAX_TOKEN_CHARS
    read = parse_join_token(token.text, run_id=run_id, peer_id=joiner.peer_id, now=NOW + DAY)
    assert read == token
    assert (read.creator, read.peer_id, read.expires_at) == (creator.peer_id, joiner.peer_id, NOW + 7 * DAY)
    assert read.is_valid(NOW + 6 * DAY) and not read.is_valid(NOW + 7 * DAY)


def test_only_the_creator_can_sign(joiner: Identity, run_id: str) -> None:
    with pytest.raises(RecordError, match=f"did not create run {run_id}"):
        sign_join_token(joiner, run_id, joiner.peer_id, now=NOW, days=7)


def test_token_signed_by_another_key_is_refused(joiner: Identity, run_id: str) -> None:
    # A stranger signs a well-formed token for itself: the run ID does not certify its key.
    text = forge(joiner, run_id=run_id, peer_id=joiner.peer_id, issued_at=NOW, expires_at=NOW + DAY)
    with pytest.raises(RecordError, match="who did not create that run"):
        parse_join_token(text, run_id=run_id, now=NOW)


def test_token_for_another_peer_or_run(creator: Identity, joiner: Identity, run_id: str) -> None:
    token = sign_join_token(creator, run_id, joiner.peer_id, now=NOW, days=7)
    with pytest.raises(RecordError, match=f"admits peer {joiner.peer_id}, not {creator.peer_id}"):
        parse_join_token(token.text, run_id=run_id, peer_id=creator.peer_id, now=NOW)
    other_run = derive_run_id("other-run", creator.public_key)
    with pytest.raises(RecordError, match=f"is for run '{run_id}', not {other_run}"):
        parse_join_token(token.text, run_id=other_run, now=NOW)


def test_clock_checks(creator: Identity, joiner: Identity, run_id: str) -> None:
    token = sign_join_token(creator, run_id, joiner.peer_id, now=NOW, days=1)
    with pytest.raises(RecordError, match="expired 1.0 days ago; ask the run's creator for a new one"):
        parse_join_token(token.text, run_id=run_id, now=NOW + 2 * DAY)
    with pytest.raises(RecordError, match="in the future"):
        parse_join_token(token.text, run_id=run_id, now=NOW - 3600)
    assert parse_join_token(token.text, run_id=run_id, now=None) == token  # clock skipped


@pytest.mark.parametrize("days", [0, -1, MAX_TOKEN_DAYS + 1])
def test_lifetime_bounds_when_signing(creator: Identity, joiner: Identity, run_id: str, days: float) -> None:
    with pytest.raises(RecordError, match=f"0 to {MAX_TOKEN_DAYS} days"):
        sign_join_token(creator, run_id, joiner.peer_id, now=NOW, days=days)


def test_overlong_lifetime_refused_when_read(creator: Identity, joiner: Identity, run_id: str) -> None:
    end = NOW + (MAX_TOKEN_DAYS + 1) * DAY
    text = forge(creator, run_id=run_id, peer_id=joiner.peer_id, issued_at=NOW, expires_at=end)
    with pytest.raises(RecordError, match="expires_at"):
        parse_join_token(text, run_id=run_id, now=NOW)


@pytest.mark.parametrize(
    "changes, match",
    [
        ({"run_id": None}, "missing field 'run_id'"),
        ({"extra": 1}, "unknown fields"),
        ({"issued_at": "soon"}, "'issued_at' has type str"),
        ({"peer_id": "a\nb"}, "control characters"),
    ],
)
def test_schema(creator: Identity, joiner: Identity, run_id: str, changes: dict[str, object], match: str) -> None:
    body: dict[str, object] = {"run_id": run_id, "peer_id": joiner.peer_id, "issued_at": NOW, "expires_at": NOW + 1}
    body.update(changes)
    body = {k: v for k, v in body.items() if v is not None}  # None: the field left out
    with pytest.raises(RecordError, match=match):
        parse_join_token(forge(creator, **body), run_id=run_id, now=NOW)


@pytest.mark.parametrize(
    "text",
    ["", "not base64!", "A" * (MAX_TOKEN_CHARS + 4), 12, None, "QUJD\n"],
)
def test_malformed_text(run_id: str, text: object) -> None:
    with pytest.raises(RecordError, match="join token"):
        parse_join_token(text, run_id=run_id, now=NOW)


def test_wrong_kind_and_tampering(creator: Identity, joiner: Identity, run_id: str) -> None:
    body = {"run_id": run_id, "peer_id": joiner.peer_id, "issued_at": NOW, "expires_at": NOW + DAY}
    as_heartbeat = base64.b64encode(sign_record(creator, "heartbeat", body)).decode()
    with pytest.raises(RecordError, match="expected a join-token record"):
        parse_join_token(as_heartbeat, run_id=run_id, now=NOW)
    token = sign_join_token(creator, run_id, joiner.peer_id, now=NOW, days=1)
    envelope = json.loads(base64.b64decode(token.text))
    envelope["body"] = envelope["body"].replace(joiner.peer_id, creator.peer_id)
    tampered = base64.b64encode(json.dumps(envelope).encode()).decode()
    with pytest.raises(RecordError, match="bad signature"):
        parse_join_token(tampered, run_id=run_id, now=NOW)


def test_check_peer_id(joiner: Identity) -> None:
    assert check_peer_id(joiner.peer_id) == joiner.peer_id
    for bad in ("", "12D3KooW", joiner.peer_id[:-1], joiner.peer_id + "x", "Qm" + "1" * 44, "0OIl" * 13):
        with pytest.raises(RecordError, match="malformed: expected an Ed25519 peer ID"):
            check_peer_id(bad)
