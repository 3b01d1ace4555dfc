"""Typed requests and answers: frozen dataclasses checked against a schema read from their fields.

A request is a ``Request[SomeAnswer]`` subclass with a ``METHOD`` and its fields; its answer a
``Answer`` subclass. Both travel as a JSON header and a list of blobs (``swarmd.peers.wire.rpc``
frames them): a request as ``{"method": METHOD, field: value, ...}``, an answer as ``{"ok":
true, field: value, ...}``, a refusal as ``{"ok": false, "code": ..., "detail": ...}``
(``swarmd.peers.wire.errors``).

The schema comes from the annotations, so that it cannot drift from the code: ``int``,
``float``, ``str``, ``bool``, ``list[int]``, ``list[str]``, ``list[list[int]]``, and any of
them ``| None``; a field with a default may be left out on the wire. Every number has bounds,
every string and list a length, given with ``bound(...)`` (a field without them is a
``TypeError`` when the class is first used). The check runs when an instance is made, so a
message that exists is valid: a peer's (``decode``) and ours alike (a bug shows here, not as
the other end's refusal). It rejects unknown and missing fields, a wrong type, a bool where
a number is wanted, NaN and infinities, strings that are not printable ASCII, and values out
of bounds, naming the field, the value and the rule (``SchemaError``).

Blobs are counted too: ``BLOBS`` is an exact count or an inclusive range, and a message whose
count depends on its fields (deltas, one blob each) says so in ``expected_blobs``.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import MISSING, dataclass
from typing import Any, ClassVar, Generic, Self, TypeVar

from swarmd.errors import SwarmdError
from swarmd.peers.records.run_id import check_run_id
from swarmd.peers.wire.errors import SchemaError

MAX_BLOBS = 64
"""Blobs in one message at most (a pull's deltas, one each, come in answers of this many)."""
_KEYS = ("min_value", "max_value", "min_len", "max_len", "max_items", "inner_items", "choices", "check")


def bound(
    *,
    min_value: float | None = None,
    max_value: float | None = None,
    min_len: int = 0,
    max_len: int | None = None,
    max_items: int | None = None,
    inner_items: int | None = None,
    choices: Sequence[str] | None = None,
    check: Callable[[Any], Any] | None = None,
    default: Any = MISSING,
    default_factory: Any = MISSING,
) -> Any:
    """A field with its rule. ``min_value``/``max_value``: inclusive bounds of a number (of each
    item of a ``list[int]``); ``min_len``/``max_len``: characters of a string (of each item of a
    ``list[str]``); ``max_items``: items of a list; ``inner_items``: the exact length of each
    inner list of a ``list[list[int]]``; ``choices``: the strings allowed; ``check``: a further
    test of the value that raises ``ValueError`` (or a ``SwarmdError``) saying why."""
    rule = {
        "min_value": min_value,
        "max_value": max_value,
        "min_len": min_len,
        "max_len": max_len,
        "max_items": max_items,
        "inner_items": inner_items,
        "choices": tuple(choices) if choices else None,
        "check": check,
    }
    return dataclasses.field(default=default, default_factory=default_factory, metadata={"rule": rule})


@dataclass(frozen=True)
class _Rule:
    field: str
    name: str
    """``Class.field``, as errors name it."""
    kind: str
    """int, float, str, bool, list[int], list[str] or list[list[int]]."""
    optional: bool
    min_value: float | None
    max_value: float | None
    min_len: int
    max_len: int | None
    max_items: int | None
    inner_items: int | None
    choices: tuple[str, ...] | None
    check: Callable[[Any], Any] | None

    def apply(self, value: Any) -> Any:
        """The value as the message keeps it (an int given for a float becomes a float)."""
        if value is None:
            if self.optional:
                return None
            raise SchemaError(self.name, value, f"must be a {self.kind}, not null")
        if self.kind == "float":
            value = self._number(value, float)
        elif self.kind == "int":
            self._number(value, int)
        elif self.kind == "bool":
            if type(value) is not bool:
                raise SchemaError(self.name, value, "must be true or false")
        elif self.kind == "str":
            self._string(value, self.name)
        else:
            self._list(value)
        if self.check is not None:
            try:
                self.check(value)
            except (ValueError, SwarmdError) as e:  # the check's own words name the rule
                raise SchemaError(self.name, value, str(e)) from None
        return value

    def _number(self, value: Any, want: type) -> Any:
        if want is int and type(value) is not int:
            raise SchemaError(self.name, value, "must be an integer")
        if want is float:
            if type(value) not in (int, float):
                raise SchemaError(self.name, value, "must be a number")
            value = float(value)
            if not math.isfinite(value):
                raise SchemaError(self.name, value, "must be finite")
        if (self.min_value is not None and value < self.min_value) or (
            self.max_value is not None and value > self.max_value
        ):
            raise SchemaError(self.name, value, f"must be in {self._range()}")
        return value

    def _string(self, value: Any, name: str) -> None:
        if type(value) is not str:
            raise SchemaError(name, value, "must be a string")
        if self.choices is not None:
            if value not in self.choices:
                raise SchemaError(name, value, f"must be one of {', '.join(self.choices)}")
            return
        assert self.max_len is not None  # _compile requires it
        if not self.min_len <= len(value) <= self.max_len:
            raise SchemaError(name, value, f"must have {self.min_len} to {self.max_len} characters, not {len(value)}")
        if not (value.isascii() and value.isprintable()):
            raise SchemaError(name, value, "must be printable ASCII")

    def _list(self, value: Any) -> None:
        if type(value) is not list:
            raise SchemaError(self.name, value, f"must be a {self.kind}")
        assert self.max_items is not None  # _compile requires it
        if len(value) > self.max_items:
            raise SchemaError(self.name, f"{len(value)} items", f"must have at most {self.max_items} items")
        if self.kind == "list[str]":
            for i, item in enumerate(value):
                self._string(item, f"{self.name}[{i}]")
            return
        rows = value if self.kind == "list[list[int]]" else [value]
        for i, row in enumerate(rows):
            if self.kind == "list[list[int]]" and (type(row) is not list or len(row) != self.inner_items):
                raise SchemaError(f"{self.name}[{i}]", row, f"must be a list of {self.inner_items} integers")
            if not all(type(x) is int for x in row):
                bad = next(x for x in row if type(x) is not int)
                raise SchemaError(self.name, bad, "items must be integers")
            if row and (min(row) < self.min_value or max(row) > self.max_value):  # type: ignore[operator]
                bad = min(row) if min(row) < self.min_value else max(row)  # type: ignore[operator]
                raise SchemaError(self.name, bad, f"items must be in {self._range()}")

    def _range(self) -> str:
        low, high = (_shown(x) for x in (self.min_value, self.max_value))
        return f"[{low}, {high}]"


def _shown(x: float | None) -> str:
    return str(int(x)) if x is not None and float(x).is_integer() else f"{x:g}"


_KINDS: dict[Any, str] = {
    int: "int",
    float: "float",
    str: "str",
    bool: "bool",
    list[int]: "list[int]",
    list[str]: "list[str]",
    list[list[int]]: "list[list[int]]",
}
_NEEDS: dict[str, tuple[str, ...]] = {
    "int": ("min_value", "max_value"),
    "float": ("min_value", "max_value"),
    "bool": (),
    "str": ("max_len",),
    "list[int]": ("max_items", "min_value", "max_value"),
    "list[str]": ("max_items", "max_len"),
    "list[list[int]]": ("max_items", "inner_items", "min_value", "max_value"),
}


_RESERVED = frozenset({"method", "ok"})
"""Header keys of the framing: a request's method, an answer's success."""


@dataclass(frozen=True)
class _Schema:
    rules: tuple[_Rule, ...]
    names: frozenset[str]
    required: frozenset[str]


_SCHEMAS: dict[type, _Schema] = {}


def _compile(cls: type) -> _Schema:
    hints = typing.get_type_hints(cls)
    fields = dataclasses.fields(cls)
    rules = []
    for f in fields:
        if f.name in _RESERVED:
            raise TypeError(f"{cls.__name__}.{f.name}: the wire uses {f.name!r} itself; name the field otherwise")
        hint, optional = hints[f.name], False
        if isinstance(hint, types.UnionType) and type(None) in typing.get_args(hint):
            rest = [a for a in typing.get_args(hint) if a is not type(None)]
            hint, optional = (rest[0] if len(rest) == 1 else hint), True
        kind = _KINDS.get(hint)
        if kind is None:
            kinds = ", ".join(_KINDS.values())
            raise TypeError(f"{cls.__name__}.{f.name}: type {hint} is not one a message can carry ({kinds})")
        rule = dict(f.metadata.get("rule") or {k: None for k in _KEYS})
        rule["min_len"] = rule.get("min_len") or 0
        needs = () if kind == "str" and rule.get("choices") else _NEEDS[kind]
        if missing := [k for k in needs if rule.get(k) is None]:
            raise TypeError(f"{cls.__name__}.{f.name}: a {kind} field needs bound({', '.join(missing)}=...)")
        rules.append(_Rule(field=f.name, name=f"{cls.__name__}.{f.name}", kind=kind, optional=optional, **rule))
    names = frozenset(f.name for f in fields)
    class_vars = {name for name, hint in hints.items() if typing.get_origin(hint) is ClassVar or hint is ClassVar}
    if stray := sorted(set(cls.__dict__.get("__annotations__", {})) - names - class_vars):
        raise TypeError(f"{cls.__name__}: {stray} are annotated but not fields; decorate it with @dataclass")
    required = frozenset(f.name for f in fields if f.default is MISSING and f.default_factory is MISSING)
    return _Schema(tuple(rules), names, required)


def schema_of(cls: type) -> _Schema:
    schema = _SCHEMAS.get(cls)
    if schema is None:
        schema = _SCHEMAS[cls] = _compile(cls)
    return schema


@dataclass(frozen=True, kw_only=True)
class Message:
    """Base of requests and answers (module doc)."""

    BLOBS: ClassVar[int | tuple[int, int]] = 0
    """Blobs the message carries: an exact count, or an inclusive (low, high) range."""

    def __post_init__(self) -> None:
        for rule in schema_of(type(self)).rules:
            value = getattr(self, rule.field)
            kept = rule.apply(value)
            if kept is not value:  # frozen: the dataclass way to normalise a field
                object.__setattr__(self, rule.field, kept)

    def expected_blobs(self) -> int | tuple[int, int]:
        """The blob count this message must carry; ``BLOBS`` unless its fields say more."""
        return self.BLOBS

    def check_blobs(self, count: int) -> None:
        want = self.expected_blobs()
        low, high = (want, want) if isinstance(want, int) else want
        if not low <= count <= high:
            rule = f"exactly {low}" if low == high else f"{low} to {high}"
            raise SchemaError(f"{type(self).__name__} blobs", count, f"must be {rule}")

    def to_fields(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @classmethod
    def from_fields(cls, fields: Mapping[str, Any]) -> Self:
        """The message from a peer's fields, checked (unknown, missing, wrong: ``SchemaError``)."""
        schema = schema_of(cls)
        if unknown := sorted(k for k in fields if k not in schema.names):
            known = ", ".join(sorted(schema.names)) or "none"
            name = f"{cls.__name__}.{str(unknown[0])[:40]}"
            raise SchemaError(name, fields[unknown[0]], f"unknown field; {cls.__name__} has {known}")
        if missing := sorted(schema.required - fields.keys()):
            raise SchemaError(f"{cls.__name__}.{missing[0]}", None, "missing: the field is required")
        return cls(**fields)


A = TypeVar("A", bound="Answer")


@dataclass(frozen=True, kw_only=True)
class Answer(Message):
    """Base of answers; encoded with ``"ok": true``."""

    def encode(self, blobs: Sequence[bytes] = ()) -> tuple[dict[str, Any], list[bytes]]:
        self.check_blobs(len(blobs))
        return {"ok": True, **self.to_fields()}, list(blobs)

    @classmethod
    def decode(cls, header: Mapping[str, Any], blobs: Sequence[bytes]) -> Self:
        """An ok answer's header (``ok`` included) and blobs, checked."""
        if header.get("ok") is not True:
            raise SchemaError(f"{cls.__name__}.ok", header.get("ok"), "must be true in an answer")
        answer = cls.from_fields({k: v for k, v in header.items() if k != "ok"})
        answer.check_blobs(len(blobs))
        return answer


_METHODS: dict[str, type[Request[Any]]] = {}


@dataclass(frozen=True, kw_only=True)
class Request(Message, Generic[A]):
    """Base of requests: ``class Pull(Request[Pulled])`` declares that a Pull is answered by a
    Pulled. Every request names its run, and a server refuses another run's (``WRONG_RUN``)."""

    METHOD: ClassVar[str]
    ANSWER: ClassVar[type[Answer]]
    MAX_BYTES: ClassVar[int | None] = None
    """The largest whole request the server reads for this method (None: the server's own
    limit); a request without blobs gets a small one from ``swarmd.peers.wire.rpc``."""
    RELAYABLE: ClassVar[bool] = False
    """Whether a relay passes it on: the data path's tensors and task records, never probes
    (a relay would distort what they measure) nor replication (it goes to a named standby)."""
    RELAY_FOR_SPEED: ClassVar[bool] = False
    """Whether a relay is taken because the measured path through it is faster, not only
    when the direct path fails: a pipeline link's tensors, for which the plan elects relays.
    The exchange (N cells to K shards) and task records go direct while the direct path
    opens: sent for speed through the few elected relays, the whole swarm's exchange would
    cross their links (``swarmd.peers.wire.routing``)."""

    run_id: str = bound(max_len=80, check=check_run_id)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for base in getattr(cls, "__orig_bases__", ()):
            if typing.get_origin(base) is Request:
                (answer,) = typing.get_args(base)
                if not (isinstance(answer, type) and issubclass(answer, Answer)):
                    raise TypeError(f"{cls.__name__}: Request[{answer}] must name an Answer subclass")
                cls.ANSWER = answer
        method = cls.__dict__.get("METHOD")
        if method is None:
            return  # a base shared by several requests
        if not hasattr(cls, "ANSWER"):
            raise TypeError(f"{cls.__name__}: declare its answer, as in class {cls.__name__}(Request[Ack])")
        other = _METHODS.get(method)
        if other is not None and other.__qualname__ != cls.__qualname__:
            raise TypeError(f"method {method!r} is {other.__qualname__}'s already; {cls.__name__} needs its own")
        _METHODS[method] = cls

    def encode(self, blobs: Sequence[bytes] = ()) -> tuple[dict[str, Any], list[bytes]]:
        self.check_blobs(len(blobs))
        return {"method": self.METHOD, **self.to_fields()}, list(blobs)

    @classmethod
    def decode(cls, header: Mapping[str, Any], blobs: Sequence[bytes]) -> Self:
        """A request's header (``method`` included) and blobs, checked."""
        if header.get("method") != cls.METHOD:
            raise SchemaError(f"{cls.__name__}.method", header.get("method"), f"must be {cls.METHOD!r}")
        request = cls.from_fields({k: v for k, v in header.items() if k != "method"})
        request.check_blobs(len(blobs))
        return request

    def server_wait_s(self) -> float:
        """How long the server may hold this request before it answers (a long poll), which
        the caller adds to its deadline."""
        return 0.0


def request_type(method: str) -> type[Request[Any]] | None:
    """The request class of ``method``, among those imported."""
    return _METHODS.get(method)


@dataclass(frozen=True, kw_only=True)
class Ack(Answer):
    """The answer that says only that the request was taken."""
