"""daemon/node/request_gate.py: members may ask anything; strangers only pull weights, and only
from a run whose checkpoints are public (an open run's by default, a private run's never unless
its spec says so)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from swarmd.models.presets import DEFAULT_RUN
from swarmd.node.request_gate import RunAdmission
from swarmd.peers.records.run_spec import parse_spec_body
from swarmd.peers.wire.errors import NotMember
from swarmd.peers.wire.file_messages import FileFetch, InitSlice
from swarmd.peers.wire.messages import Contribute, Forward, Probe, Pull, PullFromHead, ReplicaFetch
from swarmd.peers.wire.protocol import Request

pytestmark = pytest.mark.timeout(10)


def test_members_and_this_peer_are_members_and_may_ask_anything() -> None:
    admission = RunAdmission("me", {"w"}.__contains__, "members")
    assert admission.member("w") and admission.member("me") and not admission.member("x")
    for request_type in (Contribute, Forward, Probe, Pull, ReplicaFetch):
        admission.check("w", request_type)
        admission.check("me", request_type)


def test_a_stranger_may_only_pull_weights_and_only_where_checkpoints_are_public() -> None:
    public = RunAdmission("me", {"w"}.__contains__, "public")
    public.check("x", Pull)
    for request_type in (PullFromHead, ReplicaFetch, Contribute, Forward, Probe):
        with pytest.raises(NotMember, match=r"may not make .*; strangers may make only \['shard.pull'\]"):
            public.check("x", request_type)
    private = RunAdmission("me", {"w"}.__contains__, "members")
    with pytest.raises(NotMember, match="x... is not a live member of this run") as refused:
        private.check("x", Pull)
    assert "strangers may" not in str(refused.value)


def test_an_unknown_access_is_refused() -> None:
    with pytest.raises(ValueError, match="'everyone' is not one of public, members"):
        RunAdmission("me", lambda peer: False, "everyone")


def every_request_type() -> list[type[Request[Any]]]:
    """Every request the wire knows (``messages`` and ``file_messages`` declare them all, both
    imported above)."""
    found, todo = [], list(Request.__subclasses__())
    while todo:
        kind = todo.pop()
        todo += kind.__subclasses__()
        if "METHOD" in kind.__dict__:
            found.append(kind)
    return sorted(found, key=lambda kind: kind.METHOD)


@pytest.mark.parametrize(
    "access", [{"membership": "token"}, {"membership": "allowlist", "allowlist": ["w"]}], ids=["token", "allowlist"]
)
def test_a_private_run_by_default_serves_a_stranger_nothing(access: dict[str, Any]) -> None:
    spec = parse_spec_body({**copy.deepcopy(DEFAULT_RUN), "access": access})
    admission = RunAdmission("me", {"w"}.__contains__, spec.checkpoint_access)
    kinds = every_request_type()
    assert {Pull, PullFromHead, ReplicaFetch, FileFetch, InitSlice} <= set(kinds)
    for request_type in kinds:
        with pytest.raises(NotMember):
            admission.check("x", request_type)
        admission.check("w", request_type)


def test_an_open_run_by_default_lets_a_stranger_pull_weights_and_nothing_else() -> None:
    spec = parse_spec_body(copy.deepcopy(DEFAULT_RUN))
    admission = RunAdmission("me", {"w"}.__contains__, spec.checkpoint_access)
    for request_type in every_request_type():
        if request_type is Pull:
            admission.check("x", request_type)
        else:
            with pytest.raises(NotMember):
                admission.check("x", request_type)
