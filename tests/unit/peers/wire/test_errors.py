"""peers/wire/errors.py: one exception per refusal code, and refusals as they travel."""

from __future__ import annotations

import pytest

from swarmd.errors import SwarmdError
from swarmd.peers.wire.errors import (
    MAX_DETAIL_CHARS,
    REFUSALS,
    Code,
    NotHolder,
    ProtocolViolation,
    Refused,
    RpcError,
    Unreachable,
    parse_refusal,
    refusal,
    refusal_header,
)

pytestmark = pytest.mark.timeout(30)


def test_every_code_has_exactly_one_exception() -> None:
    assert set(REFUSALS) == set(Code)
    assert len({cls.__name__ for cls in REFUSALS.values()}) == len(Code)
    for code, cls in REFUSALS.items():
        assert issubclass(cls, Refused) and issubclass(cls, RpcError) and issubclass(cls, SwarmdError)
        assert cls("x").code is code
    assert not issubclass(Unreachable, Refused)


@pytest.mark.parametrize("code", list(Code))
def test_a_refusal_travels_and_comes_back_as_its_own_type(code: Code) -> None:
    sent = REFUSALS[code]("shard (2, 1) is not held here")
    header = refusal_header(sent)
    assert header == {"ok": False, "code": code.value, "detail": "shard (2, 1) is not held here"}
    back = parse_refusal(header, peer_id="12D3KooWpeer", method="shard.pull")
    assert type(back) is type(sent) and back.code is code
    assert back.peer_id == "12D3KooWpeer" and back.method == "shard.pull" and back.detail == sent.detail
    assert str(back) == f"shard.pull refused by 12D3KooWpeer [{code.value}]: shard (2, 1) is not held here"


def test_a_long_detail_is_cut_on_the_wire() -> None:
    header = refusal_header(NotHolder("x" * 5000))
    assert len(header["detail"]) == MAX_DETAIL_CHARS
    assert isinstance(parse_refusal(header, peer_id="p", method="m"), NotHolder)


@pytest.mark.parametrize(
    ("header", "why"),
    [
        ({"ok": False, "code": "NOPE", "detail": "x"}, "unknown code 'NOPE'"),
        ({"ok": False, "code": "BUSY"}, "exactly ok, code and detail"),
        ({"ok": False, "code": "BUSY", "detail": 5}, "exactly ok, code and detail"),
        ({"ok": False, "code": "BUSY", "detail": "x", "more": 1}, "exactly ok, code and detail"),
        ({"ok": False, "code": "BUSY", "detail": "x" * (MAX_DETAIL_CHARS + 1)}, "at most"),
    ],
)
def test_a_malformed_refusal_is_the_peers_protocol_violation(header: dict[str, object], why: str) -> None:
    with pytest.raises(ProtocolViolation, match=why):
        parse_refusal(header, peer_id="p", method="m")


def test_refusal_builds_the_type_of_a_code() -> None:
    error = refusal(Code.EPOCH, "pipeline 3 is at epoch b7", peer_id="p", method="cell.forward")
    assert type(error).__name__ == "WrongEpoch" and "EPOCH" in str(error)
