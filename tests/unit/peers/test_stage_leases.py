"""peers/stage_leases.py: signed leases and the one rule that settles concurrent claims."""

from __future__ import annotations

import dataclasses

import pytest

from swarmd.errors import RecordError
from swarmd.peers.identity import Identity
from swarmd.peers.records import sign_record
from swarmd.peers.run_spec import derive_run_id
from swarmd.peers.stage_leases import KIND, MAX_LEASE_TTL_S, StageLease, parse_lease, resolve_holder

pytestmark = pytest.mark.timeout(30)

T0 = 1_800_000_000.0
ALICE, BOB = Identity.generate(), Identity.generate()
RUN = derive_run_id("leases", ALICE.public_key)


def lease(who: Identity, claimed_at: float = T0, **kw: object) -> StageLease:
    fields: dict[str, object] = dict(run_id=RUN, stage=0, peer_id=who.peer_id, claimed_at=claimed_at,
                                     issued_at=T0, expires_at=T0 + 30)  # fmt: skip
    fields.update(kw)
    return StageLease(**fields)  # type: ignore[arg-type]


def test_round_trip() -> None:
    original = lease(ALICE, stage=3)
    assert parse_lease(original.sign(ALICE), run_id=RUN, now=T0, peer_id=ALICE.peer_id) == original


def test_impostor_and_wrong_subkey_and_run_refused() -> None:
    body = dataclasses.asdict(lease(BOB))  # claims Bob's stage, signed by Alice
    with pytest.raises(RecordError, match="signed by"):
        parse_lease(sign_record(ALICE, KIND, body), run_id=RUN, now=T0)
    with pytest.raises(RecordError, match="another peer's key"):
        parse_lease(lease(ALICE).sign(ALICE), run_id=RUN, now=T0, peer_id=BOB.peer_id)
    with pytest.raises(RecordError, match="not"):
        parse_lease(lease(ALICE).sign(ALICE), run_id=derive_run_id("other", ALICE.public_key), now=T0)


@pytest.mark.parametrize(
    "changes, match",
    [
        ({"expires_at": T0 + MAX_LEASE_TTL_S + 1}, "outside"),
        ({"claimed_at": T0 + 5}, "outside"),  # claimed after it was issued
        ({"stage": -1}, "outside"),
        ({"issued_at": T0 + 3600, "claimed_at": T0, "expires_at": T0 + 3630}, "future"),
    ],
)
def test_bad_fields_refused(changes: dict[str, object], match: str) -> None:
    body = {**dataclasses.asdict(lease(ALICE)), **changes}
    with pytest.raises(RecordError, match=match):
        parse_lease(sign_record(ALICE, KIND, body), run_id=RUN, now=T0)


def test_earliest_claim_wins_then_lowest_peer_id() -> None:
    a, b = lease(ALICE, claimed_at=T0 - 5), lease(BOB, claimed_at=T0 - 1)
    assert resolve_holder([b, a], T0) == a
    tie_a, tie_b = lease(ALICE), lease(BOB)
    expected = min(ALICE.peer_id, BOB.peer_id)
    holder = resolve_holder([tie_a, tie_b], T0)
    assert holder is not None and holder.peer_id == expected
    assert resolve_holder([tie_b, tie_a], T0) == holder  # the order read does not matter


def test_renewal_keeps_the_stage_and_released_or_expired_frees_it() -> None:
    holder = lease(ALICE, claimed_at=T0 - 100, issued_at=T0, expires_at=T0 + 30)  # renewed, old claim
    newcomer = lease(BOB, claimed_at=T0, issued_at=T0, expires_at=T0 + 30)
    assert resolve_holder([newcomer, holder], T0) == holder
    released = dataclasses.replace(holder, released=True)
    assert resolve_holder([newcomer, released], T0) == newcomer
    assert resolve_holder([newcomer, holder], T0 + 31) is None  # both expired
    assert resolve_holder([], T0) is None
