"""A running daemon's ``[limits]`` changed live: ``swarmd config set`` and ``reload``, and
SIGHUP; a change elsewhere is named as needing a restart, and a broken file changes nothing."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from swarmd.system.local_swarm import LocalDaemon, wait_for
from tests.integration.conftest import Swarmd

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


def test_limits_change_live_and_a_broken_file_changes_nothing(
    workdir: Path, make_run: Callable[..., str], daemon_factory: Callable[..., LocalDaemon], swarmd: Swarmd
) -> None:
    state = workdir / "a"
    run_id = make_run(state)
    config = workdir / "config.toml"
    config.write_text("# the owner's notes\n[limits]\ncpu_share = 1.0  # all of it\n")
    daemon = daemon_factory(state, run_id, ["--config", str(config)]).start()
    status = daemon.wait_running()
    assert status["limits"]["cpu_share"] == 1.0 and status["limits"]["applied"]["cpu_share"] == 1.0

    done = swarmd("config", "set", "limits.cpu_share", "0.5", "--config", str(config), "--state-dir", str(state))
    assert done.returncode == 0, done.stderr
    assert "applied live: [limits] cpu_share: 1.0 -> 0.5" in done.stdout
    assert config.read_text() == "# the owner's notes\n[limits]\ncpu_share = 0.5  # all of it\n"
    limits: dict[str, Any] = (daemon.status() or {})["limits"]
    assert limits["cpu_share"] == 0.5 and limits["applied"]["cpu_share"] == 0.5

    done = swarmd("config", "set", "node.log_level", '"debug"', "--config", str(config), "--state-dir", str(state))
    assert done.returncode == 0, done.stderr
    assert "needs a restart: node.log_level" in done.stdout

    config.write_text("[limits]\ncpu_share = 7\n")  # the owner's editor, not swarmd config set
    done = swarmd("config", "reload", "--config", str(config), "--state-dir", str(state))
    assert done.returncode == 2, done.stderr
    assert "cpu_share = 7.0 must be in (0, 1]" in done.stderr and "the running daemon keeps" in done.stderr
    os.kill(daemon.pid, signal.SIGHUP)
    wait_for(lambda: "Reload refused" in daemon.log_tail(200) or None, 30, "the SIGHUP's refusal in the log")
    assert (daemon.status() or {})["limits"]["applied"]["cpu_share"] == 0.5

    config.write_text("[limits]\ncpu_share = 0.25\n")
    os.kill(daemon.pid, signal.SIGHUP)

    def applied() -> bool | None:
        status = daemon.status()
        return status is not None and status["limits"]["applied"]["cpu_share"] == 0.25 or None

    wait_for(applied, 30, "cpu_share 0.25 applied after SIGHUP")
    assert "Applied [limits] cpu_share: 0.5 -> 0.25" in daemon.log_tail(200)
    assert daemon.proc is not None and daemon.proc.poll() is None
