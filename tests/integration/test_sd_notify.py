"""Under systemd the daemon says READY once it has joined, pings the watchdog, and says STOPPING."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from swarmd.system.local_swarm import LOOPBACK_FLAGS

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def test_ready_watchdog_stopping(workdir: Path, make_run: Callable[..., str]) -> None:
    run_id = make_run(workdir / "d0")
    notify_path = workdir / "notify.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(notify_path))
        sock.settimeout(1.0)
        env = {**os.environ, "NOTIFY_SOCKET": str(notify_path), "WATCHDOG_USEC": "2000000"}
        args = [sys.executable, "-m", "swarmd", "run", "--run-id", run_id, "--state-dir", str(workdir / "d0")]
        proc = subprocess.Popen(
            args + LOOPBACK_FLAGS + ["--no-benchmark", "--no-train"], env=env, stderr=subprocess.DEVNULL
        )
        try:
            got: list[str] = []

            def receive_until(prefix: str, timeout: float) -> None:
                deadline = time.monotonic() + timeout
                while not any(m.startswith(prefix) for m in got):
                    assert time.monotonic() < deadline, f"no {prefix} within {timeout} s; got {got}"
                    with contextlib.suppress(TimeoutError):
                        got.extend(sock.recv(4096).decode().splitlines())

            receive_until("READY=1", 60)
            assert f"STATUS=joining run {run_id}" in got
            receive_until("WATCHDOG=1", 10)
            proc.terminate()
            receive_until("STOPPING=1", 10)
            assert proc.wait(30) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
