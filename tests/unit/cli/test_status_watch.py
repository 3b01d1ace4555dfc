"""daemon/cli/status_watch.py: ``swarmd status --watch`` against a control socket: the view,
refreshed; a daemon that stops answering is said so and asked again."""

from __future__ import annotations

import asyncio
import io
import shutil
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from swarmd.cli.status_watch import watch_status
from swarmd.system.control import ControlServer

pytestmark = pytest.mark.timeout(30)

ANSWERS: list[int] = []


def status(request: dict[str, Any]) -> dict[str, Any]:
    ANSWERS.append(1)
    return {
        "peer_id": "12D3KooWtest",
        "version": "0.1.0",
        "state": "running",
        "paused": None,
        "uptime_s": 65.0 + len(ANSWERS),
        "run_id": "tiny-bytes." + "a" * 24,
        "run": None,
        "roles": ["worker"],
        "device": {"kind": "cpu", "name": "test", "memory_bytes": 2**30},
        "throughput_gflops": 1.0,
        "addrs": [],
        "peers": [],
        "training": None,
        "swarm": None,
    }


@pytest.fixture
def socket_path() -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix="swd-", dir="/tmp"))  # tmp_path can outgrow sun_path
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    server = ControlServer(folder / "c.sock", {"status": status})
    asyncio.run_coroutine_threadsafe(server.start(), loop).result(10)
    try:
        yield folder / "c.sock"
    finally:
        asyncio.run_coroutine_threadsafe(server.stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.parametrize("terminal", [False, True])
def test_the_view_is_refreshed_count_times(socket_path: Path, terminal: bool) -> None:
    ANSWERS.clear()
    out = io.StringIO()
    console = Console(file=out, force_terminal=terminal, width=120)
    assert watch_status(socket_path, 0.2, count=3, console=console) == 0
    assert len(ANSWERS) == 3
    assert "peer      12D3KooWtest" in out.getvalue() and "refreshed; Ctrl-C to leave" in out.getvalue()


def test_a_daemon_that_is_gone_is_said_so(tmp_path: Path) -> None:
    out = io.StringIO()
    watch_status(tmp_path / "nothing.sock", 0.2, count=1, console=Console(file=out, force_terminal=False))
    assert "no daemon is running with control socket" in out.getvalue() and "(asking again)" in out.getvalue()
