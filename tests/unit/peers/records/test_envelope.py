"""peers/records/envelope.py: the signed envelope, its hostile-input checks, and the Fields reader."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from swarmd.errors import RecordError
from swarmd.peers.records.envelope import (
    MAX_RECORD_BYTES,
    RECORD_VERSION,
    Fields,
    canonical_json,
    open_record,
    sign_record,
)
from swarmd.peers.records.identity import Identity

pytestmark = pytest.mark.timeout(30)

KIND = "test-kind"
BODY = {"b": [1, 2, 3], "a": "ünïcode", "n": 1.5, "t": True, "z": None}


@pytest.fixture(scope="module")
def identity() -> Identity:
    return Identity.generate()


def _envelope(raw: bytes) -> dict[str, Any]:
    envelope: dict[str, Any] = json.loads(raw)
    return envelope


def _rewrap(envelope: dict[str, Any]) -> bytes:
    return canonical_json(envelope)


def test_round_trip(identity: Identity) -> None:
    raw = sign_record(identity, KIND, BODY)
    assert isinstance(raw, bytes)
    record = open_record(raw, KIND)
    assert record.kind == KIND
    assert record.body == BODY
    assert record.public_key == identity.public_key
    assert record.signer == identity.peer_id
    assert record.raw == raw
    # bytearray is accepted too.
    assert open_record(bytearray(raw), KIND).body == BODY


def test_envelope_shape(identity: Identity) -> None:
    envelope = _envelope(sign_record(identity, KIND, BODY))
    assert set(envelope) == {"v", "kind", "body", "pk", "sig"}
    assert envelope["v"] == RECORD_VERSION
    assert envelope["kind"] == KIND
    assert envelope["body"] == canonical_json(BODY).decode()
    assert base64.b64decode(envelope["pk"]) == identity.public_key
    assert len(base64.b64decode(envelope["sig"])) == 64


def test_tampered_body_rejected(identity: Identity) -> None:
    envelope = _envelope(sign_record(identity, KIND, {"x": 1}))
    envelope["body"] = canonical_json({"x": 2}).decode()
    with pytest.raises(RecordError, match="bad signature"):
        open_record(_rewrap(envelope), KIND)


def test_tampered_kind_rejected(identity: Identity) -> None:
    # A signature made for one kind is never valid for another (domain separation).
    envelope = _envelope(sign_record(identity, "other-kind", BODY))
    envelope["kind"] = KIND
    with pytest.raises(RecordError, match="bad signature"):
        open_record(_rewrap(envelope), KIND)


def test_tampered_pk_rejected(identity: Identity) -> None:
    envelope = _envelope(sign_record(identity, KIND, BODY))
    envelope["pk"] = base64.b64encode(Identity.generate().public_key).decode()
    with pytest.raises(RecordError, match="bad signature"):
        open_record(_rewrap(envelope), KIND)


def test_tampered_sig_rejected(identity: Identity) -> None:
    envelope = _envelope(sign_record(identity, KIND, BODY))
    sig = bytearray(base64.b64decode(envelope["sig"]))
    sig[10] ^= 0x40
    envelope["sig"] = base64.b64encode(bytes(sig)).decode()
    with pytest.raises(RecordError, match="bad signature"):
        open_record(_rewrap(envelope), KIND)


def test_short_sig_and_pk_rejected(identity: Identity) -> None:
    envelope = _envelope(sign_record(identity, KIND, BODY))
    for field, value in (("sig", b"\x00" * 10), ("pk", b"\x00" * 10)):
        bad = dict(envelope, **{field: base64.b64encode(value).decode()})
        with pytest.raises(RecordError, match="bad signature"):
            open_record(_rewrap(bad), KIND)


def test_wrong_kind_rejected(identity: Identity) -> None:
    raw = sign_record(identity, "other-kind", BODY)
    with pytest.raises(RecordError, match="expected a test-kind record"):
        open_record(raw, KIND)


def test_oversized_rejected(identity: Identity) -> None:
    raw = sign_record(identity, KIND, {"pad": "x" * 1000})
    with pytest.raises(RecordError, match="over the 500-byte limit"):
        open_record(raw, KIND, max_bytes=500)
    with pytest.raises(RecordError, match="limit"):
        open_record(b" " * (MAX_RECORD_BYTES + 1), KIND)


def test_sign_refuses_oversized_body(identity: Identity) -> None:
    with pytest.raises(RecordError, match="limit"):
        sign_record(identity, KIND, {"pad": "x" * MAX_RECORD_BYTES})


@pytest.mark.parametrize("raw", ["a string", None, 42, {"v": 1}, memoryview(b"{}")])
def test_non_bytes_rejected(raw: object) -> None:
    with pytest.raises(RecordError, match="must be bytes"):
        open_record(raw, KIND)


@pytest.mark.parametrize("raw", [b"", b"{", b"not json", b"\xff\xfe\x00garbage", b'{"v": 1,}'])
def test_non_json_rejected(raw: bytes) -> None:
    with pytest.raises(RecordError, match="not valid JSON"):
        open_record(raw, KIND)


@pytest.mark.parametrize("raw", [b"[]", b"1", b'"x"', b"null", b"{}"])
def test_non_object_envelope_rejected(raw: bytes) -> None:
    with pytest.raises(RecordError, match="envelope fields"):
        open_record(raw, KIND)


def test_extra_or_missing_envelope_fields_rejected(identity: Identity) -> None:
    envelope = _envelope(sign_record(identity, KIND, BODY))
    with pytest.raises(RecordError, match="envelope fields"):
        open_record(_rewrap(dict(envelope, extra=1)), KIND)
    missing = dict(envelope)
    del missing["sig"]
    with pytest.raises(RecordError, match="envelope fields"):
        open_record(_rewrap(missing), KIND)


@pytest.mark.parametrize("version", [0, 2, "1", None])
def test_wrong_version_rejected(identity: Identity, version: object) -> None:
    envelope = _envelope(sign_record(identity, KIND, BODY))
    envelope["v"] = version
    with pytest.raises(RecordError, match="version"):
        open_record(_rewrap(envelope), KIND)


@pytest.mark.parametrize("version", [True, 1.0])
def test_version_must_be_the_integer_1(identity: Identity, version: object) -> None:
    envelope = _envelope(sign_record(identity, KIND, BODY))
    envelope["v"] = version
    with pytest.raises(RecordError, match="version"):
        open_record(_rewrap(envelope), KIND)


@pytest.mark.parametrize("field", ["pk", "sig"])
@pytest.mark.parametrize("garbage", ["!!!not-base64!!!", "abc", "YWJj\n", "YW=Jj"])
def test_base64_garbage_rejected(identity: Identity, field: str, garbage: str) -> None:
    envelope = _envelope(sign_record(identity, KIND, BODY))
    envelope[field] = garbage
    with pytest.raises(RecordError, match="malformed key or signature encoding"):
        open_record(_rewrap(envelope), KIND)


@pytest.mark.parametrize("field", ["body", "pk", "sig"])
def test_non_string_fields_rejected(identity: Identity, field: str) -> None:
    envelope = _envelope(sign_record(identity, KIND, BODY))
    envelope[field] = 123
    with pytest.raises(RecordError, match="must be strings"):
        open_record(_rewrap(envelope), KIND)


@pytest.mark.parametrize("body", [[1, 2], "text", 3, None])
def test_signed_non_object_body_rejected(identity: Identity, body: object) -> None:
    # A validly signed body that is not a JSON object is still refused.
    raw = sign_record(identity, KIND, body)  # type: ignore[arg-type]
    with pytest.raises(RecordError, match="must be a JSON object"):
        open_record(raw, KIND)


def test_signed_body_not_json_rejected(identity: Identity) -> None:
    from swarmd.peers.records import envelope as records

    body_bytes = b"{not json"
    envelope = {
        "v": RECORD_VERSION,
        "kind": KIND,
        "body": body_bytes.decode(),
        "pk": base64.b64encode(identity.public_key).decode(),
        "sig": base64.b64encode(identity.sign(records._signed_message(KIND, body_bytes))).decode(),
    }
    with pytest.raises(RecordError, match="body is not valid JSON"):
        open_record(_rewrap(envelope), KIND)


def test_deeply_nested_json_is_a_record_error() -> None:
    raw = b"[" * 4000 + b"]" * 4000  # 8000 bytes: within the heartbeat's size bound
    with pytest.raises(RecordError):
        open_record(raw, KIND, max_bytes=8 * 1024)


def test_huge_integer_is_a_record_error() -> None:
    raw = b'{"v": ' + b"1" * 5000 + b"}"
    with pytest.raises(RecordError):
        open_record(raw, KIND)


def test_canonical_json_is_deterministic() -> None:
    a = {"b": 1, "a": [1, {"y": 2, "x": 1}], "c": "é"}
    b = {"c": "é", "a": [1, {"x": 1, "y": 2}], "b": 1}
    assert canonical_json(a) == canonical_json(b)
    assert canonical_json(a) == '{"a":[1,{"x":1,"y":2}],"b":1,"c":"é"}'.encode()
    assert canonical_json(a) == canonical_json(json.loads(canonical_json(a)))


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_canonical_json_refuses_nan(value: float) -> None:
    with pytest.raises(ValueError):
        canonical_json({"x": value})


# --- Fields ---------------------------------------------------------------------------------


def test_fields_reads_valid_values() -> None:
    f = Fields({"s": "abc", "n": 2, "f": 2.5, "i": 7, "b": False, "l": ["x", "y"], "o": {"k": "v"}}, "thing")
    assert f.string("s", 3) == "abc"
    assert f.number("n", 0, 10) == 2.0
    assert isinstance(f.number("n", 0, 10), float)
    assert f.number("f", 2.5, 2.5) == 2.5
    assert f.integer("i", 7, 7) == 7
    assert f.boolean("b") is False
    assert f.strings("l", 2, 1) == ["x", "y"]
    assert f.object("o").string("k") == "v"
    f.only({"s", "n", "f", "i", "b", "l", "o"})


@pytest.mark.parametrize("value", [True, False])
def test_fields_bool_is_not_a_number(value: bool) -> None:
    f = Fields({"x": value}, "thing")
    with pytest.raises(RecordError, match="must not be a boolean"):
        f.number("x", 0, 10)
    with pytest.raises(RecordError, match="must not be a boolean"):
        f.integer("x", 0, 10)
    with pytest.raises(RecordError):
        f.string("x")


def test_fields_type_errors_name_the_field() -> None:
    f = Fields({"x": "1", "y": 1.5, "z": 1, "w": "s", "o": [1]}, "thing")
    with pytest.raises(RecordError, match="thing: field 'x' has type str"):
        f.number("x", 0, 10)
    with pytest.raises(RecordError, match="'y' has type float"):
        f.integer("y", 0, 10)
    with pytest.raises(RecordError, match="'z' has type int"):
        f.boolean("z")
    with pytest.raises(RecordError, match="'w' has type str"):
        f.strings("w", 5)
    with pytest.raises(RecordError, match="'o' has type list"):
        f.object("o")
    with pytest.raises(RecordError, match="missing field 'missing'"):
        f.string("missing")


def test_fields_ranges() -> None:
    f = Fields({"n": 11, "m": -0.5, "i": 0, "s": "abcd"}, "thing")
    with pytest.raises(RecordError, match=r"'n' = 11.0 is outside \[0, 10\]"):
        f.number("n", 0, 10)
    with pytest.raises(RecordError, match="outside"):
        f.number("m", 0, 10)
    with pytest.raises(RecordError, match="outside"):
        f.integer("i", 1, 10)
    with pytest.raises(RecordError, match="4 characters, over 3"):
        f.string("s", 3)


def test_fields_nan_and_infinity_out_of_range() -> None:
    # json.loads accepts NaN and Infinity: a range check must still refuse them.
    f = Fields(json.loads('{"a": NaN, "b": Infinity, "c": -Infinity}'), "thing")
    for name in "abc":
        with pytest.raises(RecordError, match="outside"):
            f.number(name, -1e9, 1e9)


def test_fields_huge_integer_is_a_record_error() -> None:
    with pytest.raises(RecordError):
        Fields({"x": 10**400}, "thing").number("x", 0, 10)


def test_fields_strings_limits() -> None:
    f = Fields({"l": ["a", "b", "c"], "m": ["a", 1], "n": ["abcd"]}, "thing")
    with pytest.raises(RecordError, match="3 items, over 2"):
        f.strings("l", 2)
    with pytest.raises(RecordError, match="must hold strings"):
        f.strings("m", 5)
    with pytest.raises(RecordError, match="at most 3 characters"):
        f.strings("n", 5, 3)


def test_fields_only_rejects_unknown_fields() -> None:
    f = Fields({"a": 1, "b": 2, "zz": 3}, "thing")
    with pytest.raises(RecordError, match=r"thing: unknown fields \['b', 'zz'\]"):
        f.only({"a"})


def test_fields_object_names_the_path() -> None:
    f = Fields({"outer": {"inner": True}}, "thing")
    with pytest.raises(RecordError, match=r"thing\.outer: field 'inner' must not be a boolean"):
        f.object("outer").integer("inner", 0, 1)


def test_lone_surrogate_body_is_a_record_error(identity: Identity) -> None:
    # JSON may spell a lone surrogate ("\ud800"), which has no UTF-8 form: a hostile LAN hello
    # used this to escape as UnicodeEncodeError before the signature check.
    envelope = _envelope(sign_record(identity, "thing", {"a": 1}))
    envelope["body"] = "\ud800"
    with pytest.raises(RecordError, match="not valid Unicode"):
        open_record(json.dumps(envelope).encode(), "thing")  # ASCII-escaped, as a peer would send it


@pytest.mark.parametrize("text", ["evil\x1b[31m", "two\nlines", "tab\there", "\ud800"])
def test_strings_with_control_characters_rejected(text: str) -> None:
    with pytest.raises(RecordError, match="control characters"):
        Fields({"s": text}, "t").string("s")
    with pytest.raises(RecordError):
        Fields({"s": [text]}, "t").strings("s", 4)
