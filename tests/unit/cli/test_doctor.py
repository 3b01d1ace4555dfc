"""daemon/cli/doctor.py: each check's outcome and fix, and the exit code that says whether the
daemon can join."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from swarmd.cli.doctor import run_doctor
from swarmd.config import Config, NodeConfig
from swarmd.errors import ConfigError, ControlError
from swarmd.models.presets import DEFAULT_RUN
from swarmd.peers.records.identity import load_or_create_identity
from swarmd.peers.records.run_spec import parse_spec_body, sign_run_spec
from swarmd.system.state_dir import prepare_state_dir, save_spec

pytestmark = pytest.mark.timeout(120)


ADDR = "/ip4/203.0.113.7/tcp/31337/p2p/12D3KooWExample"


def no_daemon(command: str) -> dict[str, Any]:
    raise ControlError("no daemon is running with control socket /x/control.sock; start one with 'swarmd run'")


def a_daemon(offset_s: float, version: str = "0.1.0", answered: int = 12, reached: bool | None = True) -> Any:
    """A running daemon's answers; ``reached``: what the peers' dial-back found (None: they could not try)."""

    def ask(command: str) -> dict[str, Any]:
        if command == "dial_back":
            if reached is None:
                return {"answers": [{"peer": "p0", "error": "UnknownMethod: reach.dial_back"}]}
            detail = "connected: a libp2p host answered" if reached else "no connection within 3 s"
            return {"answers": [{"peer": "p0", "addrs": [{"addr": ADDR, "reached": reached, "detail": detail}]}]}
        peers = [{"peer_id": f"p{i}", "clock_offset_s": offset_s + i * 0.1, "version": version} for i in range(3)]
        return {"state": "running", "peers": peers, "rpc": {"answered": answered}, "routes": {}, "addrs": [ADDR]}

    return ask


@pytest.fixture
def state(tmp_path: Path) -> tuple[Config, str]:
    """A state directory with its identity and a created run's spec (what 'swarmd run create' leaves)."""
    folder = prepare_state_dir(tmp_path / "state")
    signed = sign_run_spec(load_or_create_identity(folder), parse_spec_body(dict(DEFAULT_RUN)))
    save_spec(folder, signed)
    return Config(node=NodeConfig(state_dir=str(folder))), signed.run_id


def test_a_machine_that_can_join_passes_and_tries_a_cell(
    state: tuple[Config, str], capsys: pytest.CaptureFixture[str]
) -> None:
    config, run_id = state
    assert run_doctor(lambda: config, run_id, a_daemon(3.0)) == 0
    out = capsys.readouterr().out
    for name in (
        "config",
        "run ID",
        "state dir",
        "identity",
        "torch",
        "cell memory",
        "compute",
        "clock",
        "reachability",
    ):
        assert any(line.startswith("pass") and f" {name} " in line for line in out.splitlines()), (name, out)
    assert "a cell's share of one micro-batch peaked at" in out and "the memory model predicts" in out
    assert "this machine can join" in out


def test_failures_say_the_fix_and_exit_1(state: tuple[Config, str], capsys: pytest.CaptureFixture[str]) -> None:
    config, run_id = state
    # The peers' clocks are 30 s ahead of ours, and one runs a newer swarmd.
    assert run_doctor(lambda: config, run_id, a_daemon(-30.0, version="9.0.0")) == 1
    out = capsys.readouterr().out
    assert "FAIL  clock" in out and "timedatectl set-ntp true" in out
    assert "WARN  version" in out and "run a newer swarmd (up to 9.0.0" in out
    assert "1 failed (clock)" in out


def test_no_run_and_no_daemon(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = Config(node=NodeConfig(state_dir=str(tmp_path / "fresh")))
    assert run_doctor(lambda: config, None, no_daemon) == 1
    out = capsys.readouterr().out
    assert "FAIL  run ID" in out and "pass --run-id NAME.HASH" in out
    assert "WARN  state dir" in out and "WARN  daemon" in out and "systemctl start swarmd" in out


def test_a_config_that_does_not_load_fails_first(capsys: pytest.CaptureFixture[str]) -> None:
    def broken() -> Config:
        raise ConfigError("config file /etc/swarmd/config.toml is not valid TOML: line 3")

    assert run_doctor(broken, None, no_daemon) == 1
    assert "FAIL  config" in capsys.readouterr().out


def test_reachability_is_what_a_peer_dialling_back_found(
    state: tuple[Config, str], capsys: pytest.CaptureFixture[str]
) -> None:
    config, run_id = state
    assert run_doctor(lambda: config, run_id, a_daemon(1.0, reached=False)) == 0  # a warning: it joins via a relay
    out = capsys.readouterr().out
    assert "WARN  reachability" in out and "no peer could connect" in out and "open TCP port 31337" in out
    run_doctor(lambda: config, run_id, a_daemon(1.0, reached=None, answered=0))
    out = capsys.readouterr().out
    assert "WARN  reachability" in out and "UnknownMethod" in out
    run_doctor(lambda: config, run_id, a_daemon(1.0, reached=True))
    assert f"a peer opened a fresh connection to {ADDR}" in capsys.readouterr().out


def test_a_memory_model_that_misses_the_dry_run_is_reported(
    state: tuple[Config, str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import swarmd.models.cell_memory as cell_memory

    config, run_id = state
    exact = cell_memory.cell_peak_bytes
    monkeypatch.setattr(cell_memory, "cell_peak_bytes", lambda *a, **k: 2 * exact(*a, **k))  # a model 2x off
    assert run_doctor(lambda: config, run_id, a_daemon(3.0)) == 0  # a warning: the machine still joins
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if " cell memory " in x)
    assert line.startswith("WARN") and "past the model's 15%" in line, line
    assert "report this line" in out
