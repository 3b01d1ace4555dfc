"""peers/wire/messages.py: the data path's messages, their bounds, and that the largest of each
still fits the wire (a relayed header inside another, every header under the RPC limit)."""

from __future__ import annotations

import inspect
import json
from typing import Any

import pytest

from swarmd.peers.wire import messages as m
from swarmd.peers.wire import rpc
from swarmd.peers.wire.errors import SchemaError
from swarmd.peers.wire.protocol import Answer, Message, Request, request_type, schema_of

pytestmark = pytest.mark.timeout(60)

RUN = "swarm-7.abcdefghijklmnopqrstuvwx"
MESSAGES: list[type[Message]] = [
    cls
    for cls in vars(m).values()
    if inspect.isclass(cls)
    and issubclass(cls, Message)
    and cls.__module__ == m.__name__
    and not cls.__name__.startswith("_")
]
REQUESTS: list[type[Request[Any]]] = [cls for cls in MESSAGES if issubclass(cls, Request)]


def largest(cls: type[Message], **overrides: Any) -> Any:
    """The instance of ``cls`` whose header is longest: every bound at its limit (the fields
    that depend on each other set by ``overrides``)."""
    fields: dict[str, Any] = {}
    for rule in schema_of(cls).rules:
        if rule.kind in ("int", "float"):
            value: Any = rule.max_value if rule.kind == "float" else int(rule.max_value or 0)
        elif rule.kind == "bool":
            value = False
        elif rule.kind == "str":
            value = max(rule.choices, key=len) if rule.choices else '"' * (rule.max_len or 0)
        elif rule.kind == "list[str]":
            value = ["x" * (rule.max_len or 0)] * (rule.max_items or 0)
        else:
            top = int(rule.max_value or 0)
            items = [top - i for i in range(rule.max_items or 0)]
            value = [[x] * (rule.inner_items or 0) for x in items] if rule.kind == "list[list[int]]" else items
        fields[rule.field] = value
    fields.update(run_id=RUN, **overrides) if issubclass(cls, Request) else fields.update(overrides)
    return cls(**fields)


ADJUST: dict[str, dict[str, Any]] = {
    "Contribute": {"shard": m.MAX_SHARDS - 1},
    "Reduce": {"shard": m.MAX_SHARDS - 1},
    "PullFromHead": {"shard": m.MAX_SHARDS - 1},
    "Pull": {"shard": m.MAX_SHARDS - 1},
    "Pulled": {"kind": "deltas", "unknown": [], "versions": list(range(m.MAX_INDEX - 63, m.MAX_INDEX + 1))},
    "Fetched": {"kind": "log", "versions": list(range(m.MAX_INDEX - 63, m.MAX_INDEX + 1))},
    "CellForward": {"epoch": "e" * m.MAX_EPOCH_CHARS},
    "CellBackward": {"epoch": "e" * m.MAX_EPOCH_CHARS},
    "Forward": {"to": "p" * m.MAX_PEER_ID_CHARS},
    "Relayed": {"on_behalf_of": "p" * m.MAX_PEER_ID_CHARS},
    "DialedBack": {"reached": [1] * m.MAX_DIAL_ADDRS},
}


def test_every_message_builds_its_schema_and_every_request_is_registered() -> None:
    assert len(REQUESTS) == 16
    for cls in MESSAGES:
        schema_of(cls)
    for cls in REQUESTS:
        assert request_type(cls.METHOD) is cls and issubclass(cls.ANSWER, Answer)


@pytest.mark.parametrize("cls", MESSAGES, ids=lambda c: c.__name__)
def test_the_largest_message_round_trips(cls: type[Message]) -> None:
    message = largest(cls, **ADJUST.get(cls.__name__, {}))
    blobs = [b"x"] * _blobs(message)
    header, _ = message.encode(blobs)  # type: ignore[attr-defined]
    assert type(message).decode(json.loads(json.dumps(header)), blobs) == message  # type: ignore[attr-defined]


def _blobs(message: Message) -> int:
    want = message.expected_blobs()
    return want if isinstance(want, int) else want[1]


@pytest.mark.parametrize("cls", MESSAGES, ids=lambda c: c.__name__)
def test_the_largest_header_of_every_message_fits_the_rpc_limit(cls: type[Message]) -> None:
    message = largest(cls, **ADJUST.get(cls.__name__, {}))  # strings of quotes: the worst escaping
    header, _ = message.encode([b"x"] * _blobs(message))  # type: ignore[attr-defined]
    assert len(json.dumps(header, separators=(",", ":")).encode()) <= rpc.MAX_HEADER_BYTES


@pytest.mark.parametrize("cls", [c for c in REQUESTS if c.RELAYABLE], ids=lambda c: c.__name__)
def test_every_relayable_request_fits_a_relayed_header(cls: type[Request[Any]]) -> None:
    header, _ = largest(cls, **ADJUST.get(cls.__name__, {})).encode([b"x"] * _blobs(largest(cls)))
    text = json.dumps(header, separators=(",", ":"))
    assert len(text) <= m.MAX_FORWARDED_CHARS, (cls.__name__, len(text))


def test_the_largest_answers_of_relayable_requests_fit_a_forwarded_answer() -> None:
    for cls in [c.ANSWER for c in REQUESTS if c.RELAYABLE]:
        answer = largest(cls, **ADJUST.get(cls.__name__, {}))
        text = json.dumps(answer.encode([b"x"] * _blobs(answer))[0], separators=(",", ":"))
        assert len(text) <= m.MAX_FORWARDED_CHARS, (cls.__name__, len(text))


def test_only_the_data_paths_tensors_and_records_are_relayed() -> None:
    relayed = {cls.__name__ for cls in REQUESTS if cls.RELAYABLE}
    assert relayed == {
        "CellForward",
        "CellBackward",
        "Contribute",
        "Reduce",
        "Pull",
        "PullFromHead",
        "LedgerIssue",
        "LedgerComplete",
        "LedgerAbandon",
    }


def pull(**changes: Any) -> m.Pull:
    fields: dict[str, Any] = {
        "run_id": RUN,
        "stage": 1,
        "shard": 0,
        "shards": 2,
        "have_version": -1,
        "pending_share_ids": [],
        "wait_s": 5,
    }
    return m.Pull(**{**fields, **changes})


def test_a_shard_must_be_one_of_the_stages_shards() -> None:
    assert pull(shard=1).shard == 1
    with pytest.raises(SchemaError, match="Pull.shard = 2: must be below shards = 2"):
        pull(shard=2)
    with pytest.raises(SchemaError, match=r"Pull.wait_s = 31.0: must be in \[0, 30\]"):
        pull(wait_s=31)
    assert pull(wait_s=12.5).server_wait_s() == 12.5


def test_share_ids_are_distinct_and_a_contribution_names_some() -> None:
    with pytest.raises(SchemaError, match="must not name an ID twice"):
        pull(pending_share_ids=[3, 3])
    with pytest.raises(SchemaError, match="Contribute.share_ids = \\[\\]: must name at least one"):
        m.Contribute(
            run_id=RUN,
            stage=0,
            shard=0,
            shards=1,
            share_ids=[],
            base_version=0,
            micro_batches=4,
            kind="gradient",
            codec="fp16",
        )
    with pytest.raises(SchemaError, match="Contribute.kind = 'delta': must be one of gradient, pseudo"):
        m.Contribute(
            run_id=RUN,
            stage=0,
            shard=0,
            shards=1,
            share_ids=[1],
            base_version=0,
            micro_batches=4,
            kind="delta",
            codec="fp16",
        )


def test_a_pulls_blobs_follow_its_kind() -> None:
    assert m.Pulled(version=9, kind="none", versions=[], committed=[], unknown=[]).expected_blobs() == 0
    assert m.Pulled(version=9, kind="full", versions=[], committed=[1], unknown=[2]).expected_blobs() == 1
    deltas = m.Pulled(version=9, kind="deltas", versions=[8, 9], committed=[], unknown=[])
    assert deltas.expected_blobs() == 2
    with pytest.raises(SchemaError, match="Pulled blobs = 1: must be exactly 2"):
        m.Pulled.decode(deltas.encode([b"a", b"b"])[0], [b"a"])
    assert m.Pulled(version=9, kind="full", versions=[9], committed=[]).expected_blobs() == 1
    for kind, versions in (("full", [8]), ("deltas", []), ("deltas", [9, 8]), ("deltas", [9, 10]), ("none", [9])):
        with pytest.raises(SchemaError, match="Pulled.versions = .*: must name the version each blob leads to"):
            m.Pulled(version=9, kind=kind, versions=versions, committed=[], unknown=[])
    with pytest.raises(SchemaError, match="at most 4096 IDs"):
        m.Pulled(version=9, kind="none", versions=[], committed=list(range(3000)), unknown=list(range(3000, 6000)))
    assert m.Fetched(version=4, kind="log", versions=[3, 4]).expected_blobs() == 2
    assert m.Fetched(version=-1, kind="none", versions=[]).expected_blobs() == 0


def test_a_cell_message_names_a_micro_batch_of_its_share() -> None:
    fields: dict[str, Any] = {
        "run_id": RUN,
        "pipeline": 2,
        "stage": 1,
        "epoch": "e",
        "share_id": 7,
        "share_first": 56,
        "share_count": 8,
        "round_end": False,
        "attempt": 1,
        "version": 3,
    }
    assert m.CellBackward(**fields, micro_batch=63).micro_batch == 63
    with pytest.raises(SchemaError, match=r"CellForward.micro_batch = 64: must lie in its share \[56, 64\)"):
        m.CellForward(**fields, micro_batch=64)


def test_an_issued_share_is_three_integers() -> None:
    assert m.Issued(shares=[[7, 56, 8]], kept=[3]).shares == [[7, 56, 8]]
    with pytest.raises(SchemaError, match=r"Issued.shares\[0\] = \[7, 56\]: must be a list of 3 integers"):
        m.Issued(shares=[[7, 56]], kept=[])
    with pytest.raises(SchemaError, match=r"LedgerIssue.want = 65: must be in \[0, 64\]"):
        m.LedgerIssue(run_id=RUN, pipeline=0, renew=[], want=65)
