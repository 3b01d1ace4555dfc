"""daemon/node/request_gate.py: members may ask anything; strangers only pull weights, and only
from a run whose checkpoints are public."""

from __future__ import annotations

import pytest

from swarmd.node.request_gate import RunAdmission
from swarmd.peers.wire.errors import NotMember
from swarmd.peers.wire.messages import Contribute, Forward, Probe, Pull, PullFromHead, ReplicaFetch

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
