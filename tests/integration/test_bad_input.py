"""Bad input gives a one-line error naming the problem and the fix, a non-zero exit, no
traceback, and leaves what is on disk as it was.
Each command is forked from the worker's launcher (the ``swarmd`` fixture)."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from swarmd.peers.records.identity import Identity
from swarmd.system.local_swarm import LOOPBACK_FLAGS
from tests.integration.conftest import Swarmd

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

RUN_ID = "tiny-bytes.aaaaaaaaaaaaaaaaaaaaaaaa"


def assert_one_line_error(out: subprocess.CompletedProcess[str], *fragments: str) -> str:
    assert out.returncode != 0
    assert "Traceback" not in out.stderr
    errors = [line for line in out.stderr.splitlines() if line.startswith("swarmd: error:")]
    assert len(errors) == 1, out.stderr
    for fragment in fragments:
        assert fragment in errors[0], errors[0]
    return errors[0]


def test_corrupt_key_is_reported_and_left_untouched(workdir: Path, swarmd: Swarmd) -> None:
    state = workdir / "s"
    state.mkdir(mode=0o700)
    key = state / "identity.key"
    key.write_bytes(b"-----BEGIN PRIVATE KEY-----\ngarbage\n-----END PRIVATE KEY-----\n")
    key.chmod(0o600)
    before = key.read_bytes()
    out = swarmd("run", "--run-id", RUN_ID, "--state-dir", str(state), *LOOPBACK_FLAGS)
    assert_one_line_error(out, str(key), "corrupt", "move it away")
    assert key.read_bytes() == before


def test_malformed_config(workdir: Path, swarmd: Swarmd) -> None:
    config = workdir / "config.toml"
    config.write_text('[swarm]\njoin_timeout_s = "soon"\n')
    out = swarmd("run", "--run-id", RUN_ID, "--config", str(config))
    assert out.returncode == 2
    assert_one_line_error(out, "join_timeout_s", "'soon'", "float")
    config.write_text("[swarm\n")
    assert_one_line_error(swarmd("status", "--config", str(config)), "not valid TOML")


def run_alone(run_id: str, state_dir: Path, join_timeout_s: int) -> list[str]:
    """``swarmd run`` of a daemon on loopback that gives up joining after ``join_timeout_s``."""
    return [
        "run",
        "--run-id",
        run_id,
        "--state-dir",
        str(state_dir),
        *LOOPBACK_FLAGS,
        "--no-benchmark",
        "--join-timeout",
        str(join_timeout_s),
    ]


def test_malformed_run_id_and_multiaddr(workdir: Path, swarmd: Swarmd) -> None:
    out = swarmd("run", "--run-id", "no spaces allowed", "--state-dir", str(workdir / "s"))
    assert_one_line_error(out, "malformed", "swarmd run create")
    out = swarmd("run", "--run-id", RUN_ID, "--state-dir", str(workdir / "s"), "--initial-peers", "1.2.3.4:5")
    assert_one_line_error(out, "initial_peers", "1.2.3.4:5", "not a valid multiaddr")


def test_unreachable_initial_peer_gives_up_after_the_join_timeout(workdir: Path, swarmd: Swarmd) -> None:
    nobody = Identity.generate().peer_id
    out = swarmd(
        *run_alone(RUN_ID, workdir / "s", join_timeout_s=3), "--initial-peers", f"/ip4/127.0.0.1/tcp/1/p2p/{nobody}"
    )
    assert_one_line_error(out, RUN_ID, "within 3 s", "none of the initial peers answered", "/tcp/1/")
    assert "retrying in" in out.stderr
    assert not (workdir / "s" / "control.sock").exists()


def test_run_nobody_serves(workdir: Path, swarmd: Swarmd) -> None:
    out = swarmd(*run_alone(RUN_ID, workdir / "s", join_timeout_s=2))
    assert_one_line_error(out, "not served", "no --initial-peers")


def test_tampered_cached_spec_is_not_trusted(workdir: Path, make_run: Callable[..., str], swarmd: Swarmd) -> None:
    state = workdir / "s"
    run_id = make_run(state)
    cached = state / "runs" / f"{run_id}.spec"
    cached.write_bytes(cached.read_bytes().replace(b"adamw", b"sgd\x20\x20"))
    out = swarmd(*run_alone(run_id, state, join_timeout_s=2))
    assert "Ignoring the cached spec" in out.stderr and "bad signature" in out.stderr
    assert_one_line_error(out, "not served")


def test_bad_spec_file(workdir: Path, swarmd: Swarmd) -> None:
    spec = workdir / "spec.toml"
    spec.write_text('name = "Bad Name"\n')
    assert_one_line_error(swarmd("run", "create", "--spec", str(spec), "--state-dir", str(workdir / "s")), str(spec))


def test_status_without_daemon(workdir: Path, swarmd: Swarmd) -> None:
    assert_one_line_error(swarmd("status", "--state-dir", str(workdir / "s")), "no daemon is running")
