"""peers/records/signed.py: the checks every signed record kind gets from the base."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

import pytest

from swarmd.errors import RecordError
from swarmd.peers.records import signed
from swarmd.peers.records.envelope import Fields, sign_record
from swarmd.peers.records.identity import Identity
from swarmd.peers.records.signed import CLOCK_SKEW_S, Head, RecentlyParsed, SignedRecord

pytestmark = pytest.mark.timeout(30)

RUN = "test-run.abcdefghijklmnopqrstuvwx"
T0 = 1_700_000_000.0
A = Identity.generate()
B = Identity.generate()


@dataclass(frozen=True, kw_only=True)
class Note(SignedRecord):
    """The smallest kind: one bounded field of its own."""

    KIND: ClassVar[str] = "test-note"
    MAX_BYTES: ClassVar[int] = 1024
    MAX_TTL_S: ClassVar[float] = 60.0
    text: str

    @classmethod
    def _read_fields(cls, f: Fields, head: Head) -> dict[str, Any]:
        return {"text": f.string("text", 16)}


def note(peer: Identity = A, **change: Any) -> Note:
    return dataclasses.replace(
        Note(run_id=RUN, peer_id=peer.peer_id, issued_at=T0, expires_at=T0 + 30, text="hi"), **change
    )


def test_a_signed_record_parses_back_to_itself() -> None:
    record = note()
    raw = record.sign(A)
    assert Note.parse(raw, run_id=RUN, now=T0 + 1, peer_id=A.peer_id) == record
    assert Note.parse(raw, run_id=None, now=None) == record  # the DHT validator's check


def test_the_body_is_the_dataclass_fields() -> None:
    # What the base signs is what any other writer of the same fields signs: the wire format
    # belongs to the envelope, not to the class.
    record = note()
    assert record.sign(A) == sign_record(A, "test-note", dataclasses.asdict(record))


def test_a_record_signed_by_another_key_is_refused() -> None:
    with pytest.raises(RecordError, match="cannot sign the test note of"):
        note().sign(B)
    forged = sign_record(B, Note.KIND, dataclasses.asdict(note()))  # B claims to speak for A
    with pytest.raises(RecordError, match="but is signed by"):
        Note.parse(forged, run_id=RUN, now=T0)


def test_a_record_stored_under_another_peer_or_run_is_refused() -> None:
    raw = note().sign(A)
    with pytest.raises(RecordError, match="another peer's key"):
        Note.parse(raw, run_id=RUN, now=T0, peer_id=B.peer_id)
    with pytest.raises(RecordError, match="is for run"):
        Note.parse(raw, run_id="other-run.abcdefghijklmnopqrstuvwx", now=T0)


def test_an_expired_or_future_record_is_refused() -> None:
    raw = note().sign(A)
    with pytest.raises(RecordError, match="expired"):
        Note.parse(raw, run_id=RUN, now=T0 + 30)
    Note.parse(raw, run_id=RUN, now=T0 - CLOCK_SKEW_S + 1)
    with pytest.raises(RecordError, match="in the future"):
        Note.parse(raw, run_id=RUN, now=T0 - CLOCK_SKEW_S - 1)


def test_a_kind_that_reads_expired_records_still_refuses_future_ones() -> None:
    @dataclass(frozen=True, kw_only=True)
    class StandingNote(Note):
        READ_EXPIRED: ClassVar[bool] = True

    raw = StandingNote(run_id=RUN, peer_id=A.peer_id, issued_at=T0, expires_at=T0 + 30, text="hi").sign(A)
    assert StandingNote.parse(raw, run_id=RUN, now=T0 + 3600).text == "hi"
    with pytest.raises(RecordError, match="in the future"):
        StandingNote.parse(raw, run_id=RUN, now=T0 - 3600)


def test_a_lifetime_over_the_kinds_limit_is_refused() -> None:
    Note.parse(note(expires_at=T0 + 60).sign(A), run_id=RUN, now=T0)
    with pytest.raises(RecordError, match="expires_at"):
        Note.parse(note(expires_at=T0 + 61).sign(A), run_id=RUN, now=T0)
    with pytest.raises(RecordError, match="expires_at"):
        Note.parse(note(expires_at=T0 - 1).sign(A), run_id=RUN, now=None)


def test_an_unknown_or_missing_field_is_refused() -> None:
    body = dataclasses.asdict(note())
    with pytest.raises(RecordError, match="unknown fields"):
        Note.parse(sign_record(A, Note.KIND, {**body, "extra": 1}), run_id=RUN, now=T0)
    del body["text"]
    with pytest.raises(RecordError, match="missing field 'text'"):
        Note.parse(sign_record(A, Note.KIND, body), run_id=RUN, now=T0)


def test_the_kinds_own_limits_apply() -> None:
    with pytest.raises(RecordError, match="over 16"):
        Note.parse(note(text="x" * 17).sign(A), run_id=RUN, now=T0)
    with pytest.raises(RecordError, match="over the 1024-byte limit"):
        Note.parse(sign_record(A, Note.KIND, {"pad": "x" * 2000}), run_id=RUN, now=T0)
    with pytest.raises(RecordError, match="expected a test-note record"):
        Note.parse(sign_record(A, "other", dataclasses.asdict(note())), run_id=RUN, now=T0)


def test_a_record_read_again_is_not_verified_again_but_its_run_and_clock_are(monkeypatch: pytest.MonkeyPatch) -> None:
    raw = note(text="again").sign(A)
    first = Note.parse(raw, run_id=RUN, now=T0, peer_id=A.peer_id)

    def no_second_check(*args: Any) -> None:
        raise AssertionError("verified twice")

    monkeypatch.setattr(signed, "open_record", no_second_check)
    assert Note.parse(bytearray(raw), run_id=RUN, now=T0 + 1, peer_id=A.peer_id) is first
    with pytest.raises(RecordError, match="is for run"):
        Note.parse(raw, run_id="other-run.abcdefghijklmnopqrstuvwx", now=T0, peer_id=A.peer_id)
    with pytest.raises(RecordError, match="expired"):
        Note.parse(raw, run_id=RUN, now=T0 + 30, peer_id=A.peer_id)
    with pytest.raises(AssertionError, match="verified twice"):  # under another subkey: checked afresh
        Note.parse(raw, run_id=RUN, now=T0, peer_id=B.peer_id)


def test_the_recently_parsed_records_are_bounded_in_count_and_bytes() -> None:
    recent = RecentlyParsed(entries=2, max_bytes=100)
    records = [note(text=str(i)) for i in range(4)]
    recent.put(("a",), records[0], 10)
    recent.put(("b",), records[1], 10)
    assert recent.get(("a",)) is records[0]  # now the most recently used
    recent.put(("c",), records[2], 10)
    assert len(recent) == 2 and recent.get(("b",)) is None and recent.get(("a",)) is records[0]
    recent.put(("d",), records[3], 95)  # over the bytes: everything older goes
    assert len(recent) == 1 and recent.get(("d",)) is records[3]
