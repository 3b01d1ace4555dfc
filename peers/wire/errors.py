"""What can go wrong with a request between peers, as types: refusals by code, transport failures.

A peer that will not serve a request answers a **refusal**: ``{"ok": false, "code": CODE,
"detail": TEXT}``, where ``CODE`` is a ``Code`` and ``TEXT`` is for people (logs, ``swarmd
status``). The caller raises the ``Refused`` subclass of that code (``refusal``), so that code
decides by type, never by reading the text. A handler refuses by raising one of them.

The other failures are the transport's: ``Unreachable`` (no stream opened: a relay may still
reach the peer), ``StreamBroken`` (the stream broke or timed out after the request was sent:
the peer may or may not have acted on it) and ``ProtocolViolation`` (a message was malformed,
oversized or too slow). ``RpcError`` is the base of all of them: catch it for "the request did
not succeed", a subclass to act on why.

``Invalid`` is what a check of untrusted input raises before anything is used: a message that
does not fit its schema (``SchemaError``) or a tensor frame that is not what was expected
(``FrameError``); the server answers either with ``BAD_REQUEST`` naming the rule.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, ClassVar

from swarmd.errors import SwarmdError

MAX_DETAIL_CHARS = 1000
"""A refusal's text is cut to this length on the wire: it is for people, not for code."""


class Code(StrEnum):
    """Why a peer refused a request; the value is what travels."""

    BAD_REQUEST = "BAD_REQUEST"
    """The request broke its schema (a field's type or bound, the blob count, a tensor frame)."""
    WRONG_RUN = "WRONG_RUN"
    """The request names another run than the one this peer serves."""
    NOT_MEMBER = "NOT_MEMBER"
    """The speaker (or a relay's target) is not a live member of the run."""
    NOT_HOLDER = "NOT_HOLDER"
    """This peer does not hold the cell, shard or ledger the request is for (any more)."""
    NOT_RELAY = "NOT_RELAY"
    """Relaying refused: this peer is no relay of the plan in force, or the sender that speaks
    for another peer is none."""
    EPOCH = "EPOCH"
    """The request is for another epoch of the pipeline (its cells changed hands)."""
    STALE = "STALE"
    """The request builds on a version too old to be used."""
    ALREADY_APPLIED = "ALREADY_APPLIED"
    """What the request carries was applied already (a resend after a failure)."""
    BUSY = "BUSY"
    """Too much in flight here right now; retry later (or elsewhere)."""
    QUOTA = "QUOTA"
    """The speaker is over its own share of this peer (requests in flight, bytes, leases)."""
    TOO_LARGE = "TOO_LARGE"
    """The message is over a size limit (the server's, or its method's)."""
    UNKNOWN_METHOD = "UNKNOWN_METHOD"
    """No handler for the request's method here."""
    UNAVAILABLE = "UNAVAILABLE"
    """The service is not up (yet), or a relay could not reach the target; retry later."""
    TIMEOUT = "TIMEOUT"
    """The request did not arrive within the server's deadline."""
    INTERNAL = "INTERNAL"
    """The handler failed on its own account; the peer's log says why."""


class RpcError(SwarmdError):
    """A request failed: refused, or the transport failed. Catch a subclass to act on why."""


class Unreachable(RpcError):
    """No stream to the peer could be opened: it is gone, or cannot be reached from here
    (a relay may still reach it, ``swarmd.peers.wire.routing``)."""


class StreamBroken(RpcError):
    """The stream broke or timed out after the request was written: the peer may have acted
    on it, so only a request that is safe to repeat may be sent again."""


class ProtocolViolation(RpcError):
    """A message was malformed, oversized or too slow; its sender is at fault. ``code`` is what
    a server answers it with (BAD_REQUEST, TOO_LARGE or TIMEOUT)."""

    def __init__(self, message: str, code: Code = Code.BAD_REQUEST) -> None:
        super().__init__(message)
        self.code = code


class Invalid(SwarmdError, ValueError):
    """Untrusted input failed a check before use; a server answers it BAD_REQUEST."""


class SchemaError(Invalid):
    """A message field broke its rule: ``field`` (``Class.name``), the ``value`` and the ``rule``."""

    def __init__(self, field: str, value: Any, rule: str) -> None:
        shown = repr(value)
        if len(shown) > 80:
            shown = shown[:77] + "..."
        super().__init__(f"{field} = {shown}: {rule}")
        self.field, self.value, self.rule = field, value, rule


class FrameError(Invalid):
    """A tensor frame was malformed, or not the codec, shape or size that was expected."""


class Refused(RpcError):
    """A peer refused a request. ``code`` says why (one subclass per ``Code``), ``detail`` is
    the peer's text, ``peer_id`` who refused and ``method`` what (both None while the refusal
    is raised inside a handler, before it travels)."""

    CODE: ClassVar[Code]

    def __init__(self, detail: str, *, peer_id: str | None = None, method: str | None = None) -> None:
        self.code = self.CODE
        self.detail, self.peer_id, self.method = detail, peer_id, method
        where = "" if peer_id is None else f"{method or 'request'} refused by {peer_id} "
        super().__init__(f"{where}[{self.code.value}]: {detail}" if where else f"[{self.code.value}] {detail}")


class BadRequest(Refused):
    CODE = Code.BAD_REQUEST


class WrongRun(Refused):
    CODE = Code.WRONG_RUN


class NotMember(Refused):
    CODE = Code.NOT_MEMBER


class NotHolder(Refused):
    CODE = Code.NOT_HOLDER


class NotRelay(Refused):
    CODE = Code.NOT_RELAY


class WrongEpoch(Refused):
    CODE = Code.EPOCH


class Stale(Refused):
    CODE = Code.STALE


class AlreadyApplied(Refused):
    CODE = Code.ALREADY_APPLIED


class Busy(Refused):
    CODE = Code.BUSY


class OverQuota(Refused):
    CODE = Code.QUOTA


class TooLarge(Refused):
    CODE = Code.TOO_LARGE


class UnknownMethod(Refused):
    CODE = Code.UNKNOWN_METHOD


class Unavailable(Refused):
    CODE = Code.UNAVAILABLE


class TimedOut(Refused):
    CODE = Code.TIMEOUT


class Internal(Refused):
    CODE = Code.INTERNAL


REFUSALS: dict[Code, type[Refused]] = {cls.CODE: cls for cls in Refused.__subclasses__()}
"""The exception of each code (a unit test checks that every code has exactly one)."""


def refusal(code: Code, detail: str, *, peer_id: str | None = None, method: str | None = None) -> Refused:
    """The typed exception for a refusal that came back from ``peer_id``."""
    return REFUSALS[code](detail, peer_id=peer_id, method=method)


def refusal_header(error: Refused) -> dict[str, Any]:
    """A refusal as it travels (the detail cut to ``MAX_DETAIL_CHARS``)."""
    return {"ok": False, "code": error.code.value, "detail": error.detail[:MAX_DETAIL_CHARS]}


def parse_refusal(header: dict[str, Any], *, peer_id: str, method: str) -> Refused:
    """The exception a refusal header stands for; a malformed one is the peer's protocol violation."""
    code, detail = header.get("code"), header.get("detail")
    if set(header) != {"ok", "code", "detail"} or not isinstance(detail, str) or len(detail) > MAX_DETAIL_CHARS:
        raise ProtocolViolation(
            f"{method} to {peer_id}: a refusal must be exactly ok, code and detail (a string of at most "
            f"{MAX_DETAIL_CHARS} characters); got fields {sorted(header)[:8]}"
        )
    try:
        known = Code(str(code))
    except ValueError:
        raise ProtocolViolation(
            f"{method} to {peer_id}: refused with unknown code {str(code)[:40]!r}; known: {', '.join(Code)}"
        ) from None
    return refusal(known, detail, peer_id=peer_id, method=method)
