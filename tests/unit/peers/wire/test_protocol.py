"""peers/wire/protocol.py: the schema a message's annotations imply, and how it is enforced."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import pytest

from swarmd.peers.wire.errors import SchemaError
from swarmd.peers.wire.protocol import Ack, Answer, Request, bound, request_type

pytestmark = pytest.mark.timeout(30)

RUN = "demo.abcdefghijklmnopqrstuvwx"


@dataclass(frozen=True, kw_only=True)
class Echoed(Answer):
    BLOBS = (0, 2)

    seen: int = bound(min_value=0, max_value=10)


@dataclass(frozen=True, kw_only=True)
class Echo(Request[Echoed]):
    METHOD = "test.echo"
    BLOBS = (1, 2)

    count: int = bound(min_value=0, max_value=100)
    scale: float = bound(min_value=-1.0, max_value=1.0)
    name: str = bound(min_len=1, max_len=8)
    flag: bool
    ids: list[int] = bound(max_items=3, min_value=0, max_value=9)
    tags: list[str] = bound(max_items=2, max_len=4)
    pairs: list[list[int]] = bound(max_items=2, inner_items=2, min_value=0, max_value=5)
    mode: str = bound(choices=("a", "b"))
    note: str | None = bound(max_len=4, default=None)
    extra: int = bound(min_value=0, max_value=5, default=3)


def echo(**changes: Any) -> Echo:
    fields: dict[str, Any] = {
        "run_id": RUN,
        "count": 5,
        "scale": 0.5,
        "name": "n",
        "flag": True,
        "ids": [1, 2],
        "tags": ["x"],
        "pairs": [[1, 2]],
        "mode": "a",
    }
    fields.update(changes)
    return Echo(**fields)


def test_a_request_round_trips_and_names_its_answer() -> None:
    request = echo(note="hi")
    header, blobs = request.encode([b"x"])
    assert header["method"] == "test.echo" and header["note"] == "hi" and blobs == [b"x"]
    assert Echo.decode(header, [b"x"]) == request
    assert Echo.ANSWER is Echoed and request_type("test.echo") is Echo
    answer_header, _ = Echoed(seen=4).encode()
    assert answer_header == {"ok": True, "seen": 4} and Echoed.decode(answer_header, []) == Echoed(seen=4)


def test_optional_fields_take_their_defaults_when_left_out() -> None:
    header, _ = echo().encode([b"x"])
    del header["note"], header["extra"]
    decoded = Echo.decode(header, [b"x"])
    assert decoded.note is None and decoded.extra == 3


def test_an_int_given_for_a_float_becomes_a_float() -> None:
    assert type(echo(scale=1).scale) is float


@pytest.mark.parametrize(
    ("changes", "field", "rule"),
    [
        ({"count": True}, "Echo.count", "must be an integer"),
        ({"count": 5.0}, "Echo.count", "must be an integer"),
        ({"count": "5"}, "Echo.count", "must be an integer"),
        ({"count": 101}, "Echo.count", r"must be in \[0, 100\]"),
        ({"count": -1}, "Echo.count", r"must be in \[0, 100\]"),
        ({"count": None}, "Echo.count", "not null"),
        ({"scale": math.nan}, "Echo.scale", "must be finite"),
        ({"scale": math.inf}, "Echo.scale", "must be finite"),
        ({"scale": False}, "Echo.scale", "must be a number"),
        ({"scale": 1.5}, "Echo.scale", r"must be in \[-1, 1\]"),
        ({"name": ""}, "Echo.name", "1 to 8 characters"),
        ({"name": "x" * 9}, "Echo.name", "1 to 8 characters"),
        ({"name": "tab\there"[:8]}, "Echo.name", "printable ASCII"),
        ({"name": "café"}, "Echo.name", "printable ASCII"),
        ({"name": 5}, "Echo.name", "must be a string"),
        ({"flag": 1}, "Echo.flag", "true or false"),
        ({"ids": [1, 2, 3, 4]}, "Echo.ids", "at most 3 items"),
        ({"ids": [1, True]}, "Echo.ids", "items must be integers"),
        ({"ids": [1, 10]}, "Echo.ids", r"items must be in \[0, 9\]"),
        ({"ids": (1, 2)}, "Echo.ids", "must be a list"),
        ({"tags": ["toolong"]}, r"Echo.tags\[0\]", "characters"),
        ({"pairs": [[1, 2, 3]]}, r"Echo.pairs\[0\]", "list of 2 integers"),
        ({"pairs": [[1, 9]]}, "Echo.pairs", r"items must be in \[0, 5\]"),
        ({"mode": "c"}, "Echo.mode", "one of a, b"),
        ({"note": "toolong"}, "Echo.note", "characters"),
        ({"run_id": "not a run"}, "Echo.run_id", "malformed"),
    ],
)
def test_a_value_that_breaks_its_rule_is_named_with_the_rule(changes: dict[str, Any], field: str, rule: str) -> None:
    with pytest.raises(SchemaError, match=f"^{field} = .*{rule}"):
        echo(**changes)
    header, _ = echo().encode([b"x"])  # a peer's header is held to the same rules
    with pytest.raises(SchemaError, match=rule):
        Echo.decode({**header, **changes}, [b"x"])


def test_unknown_and_missing_fields_and_a_wrong_method_are_refused() -> None:
    header, _ = echo().encode([b"x"])
    with pytest.raises(SchemaError, match="Echo.surprise = 1: unknown field; Echo has count"):
        Echo.decode({**header, "surprise": 1}, [b"x"])
    with pytest.raises(SchemaError, match="Echo.count = None: missing"):
        Echo.decode({k: v for k, v in header.items() if k != "count"}, [b"x"])
    with pytest.raises(SchemaError, match="Echo.method = 'other'"):
        Echo.decode({**header, "method": "other"}, [b"x"])
    with pytest.raises(SchemaError, match="Echoed.ok"):
        Echoed.decode({"ok": False, "seen": 1}, [])


def test_blob_counts_are_checked_both_ways() -> None:
    header, _ = echo().encode([b"x"])
    for count in (0, 3):
        with pytest.raises(SchemaError, match="Echo blobs = .*: must be 1 to 2"):
            Echo.decode(header, [b"x"] * count)
        with pytest.raises(SchemaError, match="must be 1 to 2"):
            echo().encode([b"x"] * count)
    with pytest.raises(SchemaError, match="Ack blobs = 1: must be exactly 0"):
        Ack().encode([b"x"])


def test_a_message_without_bounds_or_with_an_unsupported_type_cannot_be_made() -> None:
    @dataclass(frozen=True, kw_only=True)
    class Unbounded(Answer):
        n: int = 0

    with pytest.raises(TypeError, match=r"Unbounded.n: a int field needs bound\(min_value, max_value"):
        Unbounded()

    @dataclass(frozen=True, kw_only=True)
    class Nested(Answer):
        d: dict[str, int] = bound(max_items=2)

    with pytest.raises(TypeError, match="is not one a message can carry"):
        Nested(d={})


def test_a_request_must_name_its_answer_and_its_own_method() -> None:
    with pytest.raises(TypeError, match="declare its answer"):

        class NoAnswer(Request):  # type: ignore[type-arg]
            METHOD = "test.no-answer"

    with pytest.raises(TypeError, match="'test.echo' is Echo's already"):

        class Again(Request[Ack]):
            METHOD = "test.echo"


def test_a_field_may_not_take_a_name_the_framing_uses() -> None:
    @dataclass(frozen=True, kw_only=True)
    class Clash(Answer):
        ok: bool

    with pytest.raises(TypeError, match="the wire uses 'ok' itself"):
        Clash(ok=True)


def test_a_subclass_left_without_its_dataclass_decorator_is_caught() -> None:
    class Forgotten(Echoed):
        more: int

    with pytest.raises(TypeError, match=r"\['more'\] are annotated but not fields"):
        Forgotten(seen=1)
