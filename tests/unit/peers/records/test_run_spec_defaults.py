"""peers/records/run_spec.py: the defaults that follow membership (who may pull the weights, the
aggregation rule), what specs signed before them mean, and how each is written in the body."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from swarmd.models.presets import DEFAULT_RUN
from swarmd.peers.records.envelope import sign_record
from swarmd.peers.records.identity import Identity
from swarmd.peers.records.run_id import derive_run_id
from swarmd.peers.records.run_spec import (
    KIND,
    default_aggregation,
    default_checkpoint_access,
    parse_spec_body,
    sign_run_spec,
    verify_run_spec,
)

pytestmark = pytest.mark.timeout(30)

TOKEN = {"membership": "token"}
ALLOWLIST = {"membership": "allowlist", "allowlist": ["12D3KooWabc"]}


def body_with(access: dict[str, Any] | None = None, aggregation: str | None = None) -> dict[str, Any]:
    body = copy.deepcopy(DEFAULT_RUN)
    if access is not None:
        body["access"] = access
    if aggregation is not None:
        body["exchange"] = {**body["exchange"], "aggregation": aggregation}
    return body


def signed_before(identity: Identity, body: dict[str, Any]) -> bytes:
    """A spec as an earlier version signed it: the body as given, whatever ``to_body`` would write now."""
    return sign_record(identity, KIND, body)


def test_the_defaults_follow_membership() -> None:
    assert (default_checkpoint_access("open"), default_aggregation("open")) == ("public", "centred-clip")
    for membership in ("token", "allowlist"):
        assert (default_checkpoint_access(membership), default_aggregation(membership)) == ("members", "mean")


@pytest.mark.parametrize("access", [TOKEN, ALLOWLIST], ids=["token", "allowlist"])
def test_a_private_runs_weights_are_its_members_unless_it_says_public(access: dict[str, Any]) -> None:
    spec = parse_spec_body(body_with(access))
    assert (spec.checkpoint_access, spec.aggregation) == ("members", "mean")
    body = spec.to_body()
    # Written out, so that a peer of a version that read a missing one as public reads it right.
    assert body["access"]["checkpoints"] == "members"
    assert "aggregation" not in body["exchange"]
    assert parse_spec_body(body) == spec

    public = parse_spec_body(body_with({**access, "checkpoints": "public"}))
    assert public.checkpoint_access == "public"
    assert public.to_body()["access"]["checkpoints"] == "public"
    assert parse_spec_body(public.to_body()) == public


def test_an_open_run_signs_as_before_with_public_weights_and_centred_clipping() -> None:
    spec = parse_spec_body(copy.deepcopy(DEFAULT_RUN))
    assert (spec.membership, spec.checkpoint_access, spec.aggregation) == ("open", "public", "centred-clip")
    assert spec.to_body() == DEFAULT_RUN


def test_an_open_run_may_keep_the_mean_and_says_so() -> None:
    spec = parse_spec_body(body_with(aggregation="mean"))
    assert spec.aggregation == "mean"
    assert spec.to_body()["exchange"]["aggregation"] == "mean"  # missing reads as centred clipping
    assert parse_spec_body(spec.to_body()) == spec


def test_an_open_spec_signed_before_the_robust_default_is_read_with_it() -> None:
    creator = Identity.generate()
    raw = signed_before(creator, copy.deepcopy(DEFAULT_RUN))
    signed = verify_run_spec(raw, derive_run_id(DEFAULT_RUN["name"], creator.public_key))
    assert signed.raw == raw and signed.spec.aggregation == "centred-clip"


def test_an_open_run_with_private_weights_says_so() -> None:
    closed = parse_spec_body(body_with({"checkpoints": "members"}))
    assert (closed.membership, closed.checkpoint_access) == ("open", "members")
    assert closed.to_body()["access"] == {"checkpoints": "members"}


def test_a_private_run_may_ask_for_centred_clipping() -> None:
    spec = parse_spec_body(body_with(TOKEN, aggregation="centred-clip"))
    assert spec.aggregation == "centred-clip"
    assert spec.to_body()["exchange"]["aggregation"] == "centred-clip"
    assert parse_spec_body(spec.to_body()) == spec


def test_a_private_spec_signed_before_the_default_now_keeps_its_weights_to_members() -> None:
    # An earlier version wrote no checkpoints for a private run's default, which meant public;
    # read now, the spec still verifies and its weights are the members' (the safe reading).
    creator = Identity.generate()
    raw = signed_before(creator, body_with(TOKEN))
    signed = verify_run_spec(raw, derive_run_id(DEFAULT_RUN["name"], creator.public_key))
    assert signed.raw == raw  # republished as signed
    assert (signed.spec.membership, signed.spec.checkpoint_access, signed.spec.aggregation) == (
        "token",
        "members",
        "mean",
    )
    # One that said public explicitly still means it.
    raw = signed_before(creator, body_with({**TOKEN, "checkpoints": "public"}))
    assert verify_run_spec(raw, signed.run_id).spec.checkpoint_access == "public"


def test_a_spec_made_in_code_fills_in_the_defaults_of_its_membership() -> None:
    base = parse_spec_body(copy.deepcopy(DEFAULT_RUN))
    fields = {name: getattr(base, name) for name in base.__dataclass_fields__}
    private = type(base)(**{**fields, "membership": "token", "checkpoint_access": "", "aggregation": ""})
    assert (private.checkpoint_access, private.aggregation) == ("members", "mean")
    signed = sign_run_spec(Identity.generate(), private)
    assert verify_run_spec(signed.raw, signed.run_id).spec == private


@pytest.mark.parametrize(
    ("access", "words"),
    [
        ({}, "open to anyone with the run ID; weights and checkpoints to anyone"),
        (TOKEN, "private: join-token holders; weights and checkpoints to members only"),
        (ALLOWLIST, "private: its allowlist (1 peer); weights and checkpoints to members only"),
    ],
)
def test_the_access_summary_says_who_gets_what(access: dict[str, Any], words: str) -> None:
    summary = parse_spec_body(body_with(access or None)).access_summary()
    assert summary.startswith(words)
    assert "data to members only" in summary
