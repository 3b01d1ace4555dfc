"""Fixtures for tests that start real daemons as subprocesses on 127.0.0.1.

Every daemon a test starts is registered and torn down afterwards (SIGTERM, then SIGKILL);
a session fixture kills any process group a daemon left behind. State directories live under
/tmp because a Unix socket path must fit in 107 bytes.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from swarmd.system.local_swarm import LocalDaemon, create_run
from tests.integration.fork_launcher import ForkLauncher
from tests.integration.procfs import descendants
from tests.integration.small_run import SMALL_RUN

# Short heartbeats so that a killed daemon is dropped within seconds.
FAST_HEARTBEAT = ["--heartbeat-interval", "1", "--heartbeat-ttl", "8", "--no-benchmark", "--no-train"]
# The same for daemons that train, one torch thread each: several share this machine's cores.
TRAINING = ["--heartbeat-interval", "1", "--heartbeat-ttl", "6", "--no-benchmark", "--threads", "1"]
BACKGROUND_SHARE = Path(__file__).with_name("background_training.toml")
"""``[limits] cpu_share`` for daemons whose training only has to go on while a test watches
something else: unthrottled, a daemon on one thread uses about 0.8 cores (its compute, RPC,
DHT process and p2pd), so two of them took the whole machine from the suite's other worker. At
0.3 of its one thread's core, all of that counted, two use 0.6 cores and make about 2 updates a
second on the small run."""
BACKGROUND_TRAINING = [*TRAINING, "--config", str(BACKGROUND_SHARE)]

_started: list[LocalDaemon] = []


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2] != "Z"


@pytest.fixture
def workdir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="swd-", dir="/tmp"))
    yield path
    if os.environ.get("SWARMD_KEEP_TEST_DIRS"):  # to read the daemons' logs after a failure
        print(f"kept {path}")
        return
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def make_run(workdir: Path) -> Callable[..., str]:
    """Create a run of ``spec`` (signed by the identity in ``state_dir``) and return its run ID."""

    def make(state_dir: Path, name: str = "tiny-bytes", spec: dict[str, Any] = SMALL_RUN) -> str:
        spec_path = workdir / f"{name}.json"
        spec_path.write_text(json.dumps({**spec, "name": name}))
        return create_run(state_dir, spec_path)

    return make


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Keep each phase's report on the test item, for fixtures that report on a failure."""
    report = yield
    setattr(item, f"report_{report.when}", report)
    return report


FAILURE_LOG_LINES = 30
"""Lines of each daemon's log printed when a test fails: CI keeps no state directory."""


@pytest.fixture(scope="session")
def launcher() -> Iterator[ForkLauncher]:
    """Daemons forked from an interpreter with swarmd imported (``fork_launcher``'s doc)."""
    forks = ForkLauncher()
    yield forks
    forks.close()


Swarmd = Callable[..., subprocess.CompletedProcess[str]]
"""``swarmd(*args, timeout=120)``: the ``swarmd`` command run to its end, its output captured."""


@pytest.fixture
def swarmd(launcher: ForkLauncher) -> Swarmd:
    """``swarmd ARGS`` as a user runs it (stdin from /dev/null), forked from the worker's launcher:
    ``python -m swarmd``'s same main, arguments, output and exit code, without a fresh
    interpreter's 3 s of imports per command (the demo's and the packaging tests still start
    ``swarmd`` afresh)."""

    def run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return launcher.run(list(args), timeout)

    return run


@pytest.fixture
def daemon_factory(request: pytest.FixtureRequest, launcher: ForkLauncher) -> Iterator[Callable[..., LocalDaemon]]:
    mine: list[LocalDaemon] = []

    def make(
        state_dir: Path, run_id: str, extra_args: list[str] | None = None, train: bool = False, full_speed: bool = False
    ) -> LocalDaemon:
        """A daemon that trains (``train``: in the background, at ``BACKGROUND_SHARE``, unless
        ``full_speed``, for a test that counts updates) or only joins."""
        args = (TRAINING if full_speed else BACKGROUND_TRAINING) if train else FAST_HEARTBEAT
        daemon = LocalDaemon(state_dir, run_id, args + (extra_args or []), launcher=launcher)
        mine.append(daemon)
        _started.append(daemon)
        return daemon

    yield make
    report = getattr(request.node, "report_call", None)
    if report is not None and report.failed:
        for daemon in mine:
            print(f"--- {daemon.log_path} (last {FAILURE_LOG_LINES} lines) ---\n{daemon.log_tail(FAILURE_LOG_LINES)}")
    for daemon in mine:
        daemon.stop(timeout=20)


@pytest.fixture(scope="session", autouse=True)
def reap_strays() -> Iterator[None]:
    yield
    for daemon in _started:
        daemon.kill()
        for pid in descendants(daemon.pid) if daemon.proc else ():
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
