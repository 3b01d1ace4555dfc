"""Who the run's spec lets in: the gate between a valid heartbeat and a live member.

An open run admits every peer with a valid heartbeat. A private run admits its creator, the
peers its spec's ``allowlist`` names and, when its ``membership`` is ``token``, the holders of
a join token the creator signed for them (``swarmd.peers.records.join_token``). The check runs where
heartbeats become members (``swarmd.peers.membership.members``): a peer refused there is never
a live member, so no task, lease, role or checkpoint is handed to it (every data-plane handler
and lease reader trusts live members only).

The daemon applies the same rule to itself on joining (``check_own_admission``): a peer the run
would refuse stops with a message saying what to ask the creator for, instead of running
uselessly beside a swarm that ignores it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from swarmd.errors import JoinError, RecordError
from swarmd.peers.records.heartbeat import Heartbeat
from swarmd.peers.records.join_token import JoinToken, parse_join_token
from swarmd.peers.records.run_spec import SignedRunSpec

REASONS = ("not-on-allowlist", "no-token", "bad-token", "expired-token")
"""Why a heartbeat was refused, as ``swarmd status`` counts them."""


@dataclass(frozen=True)
class Refusal:
    reason: str
    """One of ``REASONS``."""
    detail: str
    """What exactly failed, for the log."""


def read_token(spec: SignedRunSpec, peer_id: str, text: str) -> JoinToken | Refusal:
    """``text`` verified as a token of ``spec``'s creator for ``peer_id`` (clock not checked:
    a caller may keep the result and check ``JoinToken.is_valid`` on each use)."""
    if not text:
        return Refusal("no-token", f"{peer_id} presents no join token")
    try:
        token = parse_join_token(text, run_id=spec.run_id, peer_id=peer_id, now=None)
    except RecordError as e:
        return Refusal("bad-token", f"{peer_id}: {e}")
    if token.creator != spec.creator:  # implied by the run ID; checked again as it costs nothing
        return Refusal("bad-token", f"{peer_id}: join token signed by {token.creator}, not the creator {spec.creator}")
    return token


def admit(
    spec: SignedRunSpec, heartbeat: Heartbeat, now: float, token: JoinToken | Refusal | None = None
) -> Refusal | None:
    """None when ``spec`` admits the peer of ``heartbeat`` at ``now``, else why not.

    ``token``: the heartbeat's token as ``read_token`` gave it, when the caller kept it from an
    earlier scan (verifying a signature per heartbeat per scan would be a Sybil's lever)."""
    peer, rule = heartbeat.peer_id, spec.spec.membership
    if rule == "open" or peer == spec.creator or peer in spec.spec.allowlist:
        return None
    if rule == "allowlist":
        return Refusal("not-on-allowlist", f"{peer} is not on the allowlist of run {spec.run_id}")
    if token is None:
        token = read_token(spec, peer, heartbeat.join_token)
    if isinstance(token, Refusal):
        return token
    if not token.is_valid(now):
        window = f"{token.issued_at:.0f} to {token.expires_at:.0f}"
        return Refusal("expired-token", f"{peer}: join token valid from {window}, not at {now:.0f}")
    return None


def check_own_admission(spec: SignedRunSpec, peer_id: str, token_text: str, now: float | None = None) -> None:
    """Raise JoinError, saying what to do, when ``spec`` would refuse this peer's heartbeats."""
    now = time.time() if now is None else now
    rule, run = spec.spec.membership, spec.run_id
    if rule == "open" or peer_id == spec.creator or peer_id in spec.spec.allowlist:
        return
    if rule == "allowlist":
        raise JoinError(
            f"run {run} is private: its spec admits only the {len(spec.spec.allowlist)} peer(s) on its "
            f"allowlist, and this peer {peer_id} is not one of them; ask the run's creator "
            f"({spec.creator}) to add it"
        )
    if not token_text:
        raise JoinError(
            f"run {run} is private: it admits only holders of a join token, and none was given; ask the "
            f"run's creator ({spec.creator}) for one (swarmd run token --run-id {run} --peer {peer_id}), "
            "then pass it with --join-token TOKEN or [swarm] join_token"
        )
    try:
        parse_join_token(token_text, run_id=run, peer_id=peer_id, now=now)
    except RecordError as e:
        raise JoinError(
            f"cannot join private run {run}: {e}; ask the run's creator ({spec.creator}) for a join token: "
            f"swarmd run token --run-id {run} --peer {peer_id}"
        ) from None
