"""``swarmd run token`` and ``--join-token``: the creator admits a peer; a wrong token stops a joiner early."""

from __future__ import annotations

import copy
import json
import time
from pathlib import Path

import pytest

from swarmd.cli.main import main
from swarmd.models.presets import DEFAULT_RUN
from swarmd.peers.records.identity import Identity, load_or_create_identity
from swarmd.peers.records.join_token import DEFAULT_TOKEN_DAYS, parse_join_token
from swarmd.system.control import SOCKET_FILENAME
from swarmd.system.state_dir import prepare_state_dir

pytestmark = pytest.mark.timeout(60)

DAY = 86400.0


def create_run(tmp_path: Path, capsys: pytest.CaptureFixture[str], membership: str = "token") -> tuple[str, Path]:
    """A run created in ``tmp_path/creator``: (its run ID, the creator's state directory)."""
    spec = copy.deepcopy(DEFAULT_RUN)
    spec["access"] = {"membership": membership}
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(json.dumps(spec))
    state = tmp_path / "creator"
    assert main(["run", "create", "--spec", str(spec_file), "--state-dir", str(state)]) == 0
    return capsys.readouterr().out.strip(), state


def peer_of(state: Path) -> Identity:
    return load_or_create_identity(prepare_state_dir(state))


def test_creator_signs_a_token_the_joiner_can_use(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_id, creator = create_run(tmp_path, capsys)
    joiner = peer_of(tmp_path / "joiner")
    argv = ["run", "token", "--run-id", run_id, "--peer", joiner.peer_id, "--state-dir", str(creator)]
    assert main([*argv, "--days", "2"]) == 0
    out, err = capsys.readouterr()
    token = parse_join_token(out.strip(), run_id=run_id, peer_id=joiner.peer_id, now=time.time())
    assert token.creator == peer_of(creator).peer_id
    assert token.expires_at - token.issued_at == pytest.approx(2 * DAY)
    assert f"--run-id {run_id} --join-token TOKEN" in err and "changes nothing" not in err
    assert main(argv) == 0  # without --days: the default lifetime
    token = parse_join_token(capsys.readouterr().out.strip(), run_id=run_id, now=None)
    assert token.expires_at - token.issued_at == pytest.approx(DEFAULT_TOKEN_DAYS * DAY)
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    assert f"(default {DEFAULT_TOKEN_DAYS})" in " ".join(capsys.readouterr().out.split())


def test_open_run_token_is_signed_with_a_note(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_id, creator = create_run(tmp_path, capsys, membership="open")
    joiner = peer_of(tmp_path / "joiner")
    assert main(["run", "token", "--run-id", run_id, "--peer", joiner.peer_id, "--state-dir", str(creator)]) == 0
    assert "admits by 'open' membership, so this token changes nothing" in capsys.readouterr().err


def test_only_the_creator_signs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_id, _ = create_run(tmp_path, capsys)
    other = tmp_path / "other"
    joiner = peer_of(tmp_path / "joiner")
    assert main(["run", "token", "--run-id", run_id, "--peer", joiner.peer_id, "--state-dir", str(other)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert f"this peer ({peer_of(other).peer_id}) did not create run {run_id}" in err


@pytest.mark.parametrize(
    "extra, match",
    [
        (["--peer", "12D3KooWnope"], "peer ID '12D3KooWnope' is malformed"),
        (["--peer", "PEER", "--days", "0"], "--days 0.0: a join token lives more than 0"),
        ([], "needs --peer PEER_ID"),
    ],
)
def test_bad_token_requests(tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], match: str) -> None:
    run_id, creator = create_run(tmp_path, capsys)
    extra = [peer_of(tmp_path / "j").peer_id if a == "PEER" else a for a in extra]
    assert main(["run", "token", "--run-id", run_id, "--state-dir", str(creator), *extra]) == 2
    assert match in capsys.readouterr().err


def test_token_needs_a_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "token", "--peer", "x", "--state-dir", str(tmp_path / "s")]) == 2
    assert "needs the run: pass --run-id ID" in capsys.readouterr().err


def test_peer_flag_outside_token_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_id = "tiny-bytes." + "a" * 24
    assert main(["run", "--run-id", run_id, "--peer", "p", "--state-dir", str(tmp_path / "s")]) == 2
    assert "--peer and --days go with 'swarmd run token'" in capsys.readouterr().err


def test_joiner_with_a_wrong_token_stops_before_starting(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_id, creator = create_run(tmp_path, capsys)
    someone, joiner_dir = peer_of(tmp_path / "someone"), tmp_path / "joiner"
    joiner = peer_of(joiner_dir)
    tokens = ["run", "token", "--run-id", run_id, "--state-dir", str(creator), "--peer"]
    assert main([*tokens, someone.peer_id]) == 0
    theirs = capsys.readouterr().out.strip()
    # Someone else's token: refused here, in one line naming what to ask for (no daemon started).
    assert main(["run", "--run-id", run_id, "--join-token", theirs, "--state-dir", str(joiner_dir)]) == 1
    err = capsys.readouterr().err
    assert f"admits peer {someone.peer_id}, not {joiner.peer_id}" in err
    assert f"swarmd run token --run-id {run_id} --peer {joiner.peer_id}" in err
    assert not (joiner_dir / SOCKET_FILENAME).exists()
    # Not a token at all: the config's own check, a usage error.
    assert main(["run", "--run-id", run_id, "--join-token", "not a token", "--state-dir", str(joiner_dir)]) == 2
    assert "[swarm] join_token is not a join token" in capsys.readouterr().err
