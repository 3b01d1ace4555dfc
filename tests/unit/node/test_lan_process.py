"""daemon/node/lan_process.py: the child's lines to the daemon put the start's answer first.

The daemon reads the child's first line as its answer to the start; a LAN peer that greeted us
before ``ready`` was written made that first line a hello, and the daemon ran without LAN
discovery (seen in tests/integration/test_lan_mdns.py).
"""

from __future__ import annotations

import io
import json

import pytest

from swarmd.node.lan_process import AnswerFirst

pytestmark = pytest.mark.timeout(30)


def lines(stream: io.BytesIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_a_hello_before_the_answer_follows_it() -> None:
    stream = io.BytesIO()
    out = AnswerFirst(stream)
    out.event({"peer": "a", "hello": ""})
    out.event({"peer": "b", "hello": ""})
    assert stream.getvalue() == b""
    out.answer({"ready": ["/ip4/10.0.0.2/tcp/1"]})
    out.event({"peer": "c", "hello": ""})
    assert [next(iter(line)) for line in lines(stream)] == ["ready", "peer", "peer", "peer"]
    assert [line.get("peer") for line in lines(stream)] == [None, "a", "b", "c"]


def test_an_error_answer_is_first_too() -> None:
    stream = io.BytesIO()
    out = AnswerFirst(stream)
    out.answer({"error": "no such interface"})
    assert lines(stream) == [{"error": "no such interface"}]
