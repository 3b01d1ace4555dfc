"""The dashboard of a real training daemon (``swarmd run --dashboard 127.0.0.1:0``).

The daemon trains alone (it holds every cell and shard, so it has a loss and a throughput);
once its history has curves, ``/metrics`` must parse with Prometheus's own parser and carry
the families with values a training daemon has, a request naming another host must be refused
(DNS rebinding), and headless Chromium must load the page and draw the loss and throughput
curves from more than one point, and list this peer among the members. A screenshot lands in
the test's directory (``SWARMD_KEEP_TEST_DIRS=1`` keeps it).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import urllib.request
from collections.abc import Callable
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from swarmd.cli.status_view import format_status
from swarmd.system.local_swarm import LocalDaemon, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]

CHROMIUM_TIMEOUT_S = 45


def fetch(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as response:
        body: bytes = response.read()
        return body


def raw_get(url: str, path: str, host: str) -> int:
    """The status code of a GET with the ``Host`` header given (urllib would send the URL's)."""
    port = int(url.rstrip("/").rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
        return int(sock.makefile("rb").readline().split()[1])


def drawn(url: str) -> bool:
    """Whether the history holds at least two samples with a loss, and two with a throughput."""
    samples = json.loads(fetch(url + "api/history"))["samples"]
    return all(sum(s[k] is not None for s in samples) >= 2 for k in ("loss", "tokens_per_s"))


def chromium(args: list[str], profile: Path) -> str:
    """Headless Chromium in a session of its own, killed whole afterwards: its helpers must not
    outlive the test. Returns what it printed on stdout."""
    command = ["chromium", "--headless=new", "--no-sandbox", "--disable-gpu", f"--user-data-dir={profile}", *args]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=CHROMIUM_TIMEOUT_S)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
    assert proc.returncode == 0, f"chromium {' '.join(args)} exited with {proc.returncode}"
    return out.decode(errors="replace")


class Elements(HTMLParser):
    """The attributes of every element of a dumped DOM, by id, and the members' rows."""

    def __init__(self) -> None:
        super().__init__()
        self.by_id: dict[str, dict[str, str]] = {}
        self.members: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = {k: v or "" for k, v in attrs}
        if "id" in values:
            self.by_id[values["id"]] = values
        if tag == "tr" and values.get("class") == "member":
            self.members.append(values.get("data-peer", ""))


def families(text: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    return {
        f.name: {tuple(sorted(s.labels.items())): s.value for s in f.samples}
        for f in text_string_to_metric_families(text)
    }


def test_a_training_daemon_serves_metrics_and_a_dashboard_that_draws_its_curves(
    workdir: Path, make_run: Callable[..., str], daemon_factory: Callable[..., LocalDaemon]
) -> None:
    run_id = make_run(workdir / "d0")
    daemon = daemon_factory(workdir / "d0", run_id, ["--dashboard", "127.0.0.1:0"], train=True).start()
    status: dict[str, Any] = daemon.wait_running()
    url = status["dashboard"]
    assert url.startswith("http://127.0.0.1:") and url.endswith("/")
    assert f"dashboard {url}" in format_status(status)
    wait_for(lambda: drawn(url), 60, "two samples with a loss and a throughput in the dashboard's history")

    metrics = families(fetch(url + "metrics").decode())
    own = daemon.status()
    assert own is not None
    assert metrics["swarmd_info"][(("peer_id", own["peer_id"]), ("run_id", run_id), ("version", own["version"]))] == 1
    assert metrics["swarmd_committed_updates"][()] >= 1
    assert math.isfinite(metrics["swarmd_loss"][()]) and metrics["swarmd_loss"][()] > 0
    assert metrics["swarmd_tokens_per_second"][()] > 0
    assert metrics["swarmd_transferred_bytes"][(("direction", "out"), ("kind", "contributions"))] > 0
    assert metrics["swarmd_role"][(("role", "worker"),)] == 1
    assert metrics["swarmd_role"][(("role", "parameter_server"),)] == 1
    assert metrics["swarmd_paused"][()] == 0
    assert sum(metrics["swarmd_members"].values()) == 1  # alone
    assert metrics["swarmd_limit_torch_threads"][()] == 1  # --threads 1
    assert {dict(k)["stage"] for k in metrics["swarmd_shard_version"]} == {"0", "1"}  # alone, it serves both

    assert raw_get(url, "/metrics", "127.0.0.1") == 200
    assert raw_get(url, "/api/status", "rebound.example:80") == 403

    if shutil.which("chromium") is None:
        pytest.skip("chromium is not installed (.ci/run installs it as root): the page was not loaded in a browser")
    dom = chromium(["--virtual-time-budget=8000", "--dump-dom", url], workdir / "chromium")
    page = Elements()
    page.feed(dom)
    for curve in ("curve-loss", "curve-tokens_per_s"):
        path = page.by_id.get(curve)
        assert path is not None, f"no #{curve} in the page:\n{dom[:2000]}"
        assert int(path["data-points"]) >= 2 and path["d"].count("L") >= 1, path
    assert own["peer_id"] in page.members, page.members
    shot = workdir / "dashboard.png"
    chromium(
        ["--virtual-time-budget=8000", f"--screenshot={shot}", "--window-size=1280,900", url], workdir / "chromium"
    )
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    print(f"screenshot: {shot}")
