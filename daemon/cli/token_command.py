"""``swarmd run token``: the creator of a private run admits one peer; and the joiner's check.

The creator signs, with the key in its state directory, a token naming the run and the peer
(``swarmd.peers.records.join_token``) and prints it; the joiner passes it with
``swarmd run --join-token TOKEN`` (or ``[swarm] join_token``) and carries it in each heartbeat.
Only the creator's key can sign a token that verifies, so the command refuses any other key
before printing something that would admit nobody.
"""

from __future__ import annotations

import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from swarmd.errors import ConfigError, JoinError, RecordError
from swarmd.peers.records.identity import load_or_create_identity
from swarmd.peers.records.join_token import DEFAULT_TOKEN_DAYS, MAX_TOKEN_DAYS, parse_join_token, sign_join_token
from swarmd.peers.records.run_id import check_run_id
from swarmd.system.state_dir import load_cached_spec, prepare_state_dir


def run_token(state_path: Path, run_id: str, peer_id: str, days: float | None) -> int:
    """Sign and print (alone on stdout, to pipe or copy) a join token for ``peer_id``."""
    days = DEFAULT_TOKEN_DAYS if days is None else days
    if not run_id:
        raise ConfigError("'swarmd run token' needs the run: pass --run-id ID (or set [swarm] run_id)")
    if not peer_id:
        raise ConfigError("'swarmd run token' needs --peer PEER_ID: the peer ID of the daemon to admit")
    if not 0 < days <= MAX_TOKEN_DAYS:
        raise ConfigError(f"--days {days}: a join token lives more than 0 and at most {MAX_TOKEN_DAYS} days")
    check_run_id(run_id)
    state_dir = prepare_state_dir(state_path)
    identity = load_or_create_identity(state_dir)
    try:
        token = sign_join_token(identity, run_id, peer_id, now=time.time(), days=days)
    except RecordError as e:
        raise ConfigError(str(e)) from None
    print(token.text)
    until = datetime.fromtimestamp(token.expires_at, UTC).strftime("%Y-%m-%d %H:%M UTC")
    spec = load_cached_spec(state_dir, run_id)
    note = ""
    if spec is not None and spec.spec.membership != "token":
        # Signed anyway: the creator may be about to make a token run of the same name and key.
        note = f"\nNote: run {run_id} admits by '{spec.spec.membership}' membership, so this token changes nothing."
    print(
        f"Admits {peer_id} to run {run_id} until {until}. The peer joins with:\n"
        f'  swarmd run --run-id {run_id} --join-token TOKEN   (or [swarm] join_token = "TOKEN"){note}',
        file=sys.stderr,
    )
    return 0


def check_join_token(state_path: Path, run_id: str, token_text: str) -> None:
    """Before joining, check that the token given is for this run and this peer and unexpired:
    a wrong one would otherwise be found out only by the creator's daemon ignoring us."""
    identity = load_or_create_identity(prepare_state_dir(state_path))
    try:
        parse_join_token(token_text, run_id=run_id, peer_id=identity.peer_id, now=time.time())
    except RecordError as e:
        raise JoinError(
            f"the join token given for run {run_id} does not admit this peer: {e}; ask the run's creator for "
            f"a token for this peer: swarmd run token --run-id {run_id} --peer {identity.peer_id}"
        ) from None
