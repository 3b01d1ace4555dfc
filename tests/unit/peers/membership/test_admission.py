"""peers/membership/admission.py and its gate in members.py: who a private run lets in."""

from __future__ import annotations

import copy
import dataclasses

import pytest

from swarmd.errors import JoinError
from swarmd.models.presets import DEFAULT_RUN
from swarmd.peers.membership import admission
from swarmd.peers.membership.admission import Refusal, admit, check_own_admission, read_token
from swarmd.peers.membership.members import Membership
from swarmd.peers.records.heartbeat import DeviceInfo, Heartbeat
from swarmd.peers.records.identity import Identity
from swarmd.peers.records.join_token import JoinToken, sign_join_token
from swarmd.peers.records.run_spec import SignedRunSpec, parse_spec_body, sign_run_spec

pytestmark = pytest.mark.timeout(30)

T0 = 1_700_000_000.0
DAY = 86400.0
CREATOR, MEMBER, STRANGER = Identity.generate(), Identity.generate(), Identity.generate()


def spec(membership: str, allowlist: tuple[str, ...] = ()) -> SignedRunSpec:
    base = parse_spec_body(copy.deepcopy(DEFAULT_RUN))
    return sign_run_spec(CREATOR, dataclasses.replace(base, membership=membership, allowlist=allowlist))


TOKEN_RUN = spec("token")


def token(peer: Identity, days: float = 1.0, run: SignedRunSpec = TOKEN_RUN, signer: Identity = CREATOR) -> str:
    return sign_join_token(signer, run.run_id, peer.peer_id, now=T0, days=days).text


def hb(peer: Identity, issued_at: float = T0, join_token: str = "", run: SignedRunSpec = TOKEN_RUN) -> Heartbeat:
    return Heartbeat(
        run_id=run.run_id,
        peer_id=peer.peer_id,
        issued_at=issued_at,
        expires_at=issued_at + 60,
        addrs=[],
        device=DeviceInfo(kind="cpu", name="CPU", memory_bytes=2**30, cpus=2),
        throughput_gflops=1.0,
        version="0.1.0",
        roles=["worker"],
        uptime_s=1.0,
        join_token=join_token,
    )


def reason(refusal: Refusal | None) -> str | None:
    return None if refusal is None else refusal.reason


def test_open_run_admits_anyone() -> None:
    assert admit(spec("open"), hb(STRANGER), T0) is None


def test_allowlist_run() -> None:
    run = spec("allowlist", (MEMBER.peer_id,))
    assert admit(run, hb(MEMBER, run=run), T0) is None
    assert admit(run, hb(CREATOR, run=run), T0) is None  # the creator needs no entry
    # A token is no way around an allowlist, even one the creator signed.
    assert reason(admit(run, hb(STRANGER, join_token=token(STRANGER, run=run), run=run), T0)) == "not-on-allowlist"


def test_token_run() -> None:
    assert admit(TOKEN_RUN, hb(MEMBER, join_token=token(MEMBER)), T0) is None
    assert admit(TOKEN_RUN, hb(CREATOR), T0) is None
    assert reason(admit(TOKEN_RUN, hb(STRANGER), T0)) == "no-token"
    # Another peer's token, a token the stranger signed itself, garbage: all refused.
    assert reason(admit(TOKEN_RUN, hb(STRANGER, join_token=token(MEMBER)), T0)) == "bad-token"
    assert reason(admit(TOKEN_RUN, hb(STRANGER, join_token="QUJD"), T0)) == "bad-token"
    own_run = sign_run_spec(STRANGER, parse_spec_body(copy.deepcopy(DEFAULT_RUN)))
    forged = token(STRANGER, run=own_run, signer=STRANGER)  # valid, but for the stranger's own run
    assert reason(admit(TOKEN_RUN, hb(STRANGER, join_token=forged), T0)) == "bad-token"
    assert reason(admit(TOKEN_RUN, hb(MEMBER, join_token=token(MEMBER, days=1)), T0 + 2 * DAY)) == "expired-token"


def test_allowlisted_peer_needs_no_token_in_a_token_run() -> None:
    run = spec("token", (MEMBER.peer_id,))
    assert admit(run, hb(MEMBER, run=run), T0) is None


def test_read_token_result_is_reusable() -> None:
    kept = read_token(TOKEN_RUN, MEMBER.peer_id, token(MEMBER, days=1))
    assert isinstance(kept, JoinToken)
    assert admit(TOKEN_RUN, hb(MEMBER), T0, kept) is None  # the kept one, not the heartbeat's
    assert reason(admit(TOKEN_RUN, hb(MEMBER), T0 + 2 * DAY, kept)) == "expired-token"
    assert reason(read_token(TOKEN_RUN, MEMBER.peer_id, "")) == "no-token"


def test_own_admission_says_what_to_do() -> None:
    check_own_admission(TOKEN_RUN, CREATOR.peer_id, "", T0)
    check_own_admission(TOKEN_RUN, MEMBER.peer_id, token(MEMBER), T0)
    check_own_admission(spec("open"), STRANGER.peer_id, "", T0)
    with pytest.raises(JoinError) as e:
        check_own_admission(TOKEN_RUN, STRANGER.peer_id, "", T0)
    assert f"run {TOKEN_RUN.run_id} is private" in str(e.value)
    assert f"swarmd run token --run-id {TOKEN_RUN.run_id} --peer {STRANGER.peer_id}" in str(e.value)
    with pytest.raises(JoinError, match=f"admits peer {MEMBER.peer_id}, not {STRANGER.peer_id}.*swarmd run token"):
        check_own_admission(TOKEN_RUN, STRANGER.peer_id, token(MEMBER), T0)
    with pytest.raises(JoinError, match="expired 1.0 days ago"):
        check_own_admission(TOKEN_RUN, MEMBER.peer_id, token(MEMBER, days=1), T0 + 2 * DAY)
    run = spec("allowlist", (MEMBER.peer_id,))
    with pytest.raises(JoinError, match=f"only the 1 peer.* on its allowlist.*{STRANGER.peer_id} is not one"):
        check_own_admission(run, STRANGER.peer_id, "", T0)


def test_membership_refuses_before_anyone_is_a_member() -> None:
    m = Membership(CREATOR.peer_id)
    m.follow(TOKEN_RUN)
    joined, _ = m.update([hb(MEMBER, join_token=token(MEMBER)), hb(STRANGER)], [], T0)
    assert joined == [MEMBER.peer_id] and set(m.peers) == {MEMBER.peer_id}
    assert [p["peer_id"] for p in m.snapshot(T0)] == [MEMBER.peer_id]
    assert m.refusals() == {"no-token": 1}
    # The same heartbeat read again by the next scans is one refusal, not one per scan.
    m.update([hb(MEMBER, join_token=token(MEMBER)), hb(STRANGER)], [], T0 + 5)
    assert m.refusals() == {"no-token": 1}
    m.update([hb(STRANGER, T0 + 10, join_token="QUJD")], [], T0 + 10)
    assert m.refusals() == {"bad-token": 1, "no-token": 1}
    assert STRANGER.peer_id not in m.peers


def test_member_whose_token_expires_leaves_at_once() -> None:
    m = Membership(CREATOR.peer_id)
    m.follow(TOKEN_RUN)
    text = token(MEMBER, days=1)
    m.update([hb(MEMBER, join_token=text)], [], T0)
    later = T0 + DAY + 1
    joined, left = m.update([hb(MEMBER, later, join_token=text)], [], later)
    assert (joined, left, m.peers) == ([], [MEMBER.peer_id], {})
    assert m.refusals() == {"expired-token": 1}


def test_token_verified_once_per_token(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    real = admission.parse_join_token

    def counting(text: object, **kw: object) -> JoinToken:
        calls.append(str(text))
        return real(text, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(admission, "parse_join_token", counting)
    m = Membership(CREATOR.peer_id)
    m.follow(TOKEN_RUN)
    first, second = token(MEMBER, days=1), token(MEMBER, days=2)
    for i in range(3):
        m.update([hb(MEMBER, T0 + i, join_token=first)], [], T0 + i)
    assert len(calls) == 1
    m.update([hb(MEMBER, T0 + 5, join_token=second)], [], T0 + 5)  # a renewed token is read anew
    assert len(calls) == 2 and MEMBER.peer_id in m.peers


def test_follow_refuses_this_peer_when_the_spec_would() -> None:
    m = Membership(STRANGER.peer_id)
    with pytest.raises(JoinError, match="ask the run's creator"):
        m.follow(TOKEN_RUN)
    assert m.spec is None
    m.follow(spec("open"))
    assert m.join_token == ""
    member = Membership(MEMBER.peer_id)
    member.follow(TOKEN_RUN, token(MEMBER), now=T0)
    assert member.join_token == token(MEMBER)
