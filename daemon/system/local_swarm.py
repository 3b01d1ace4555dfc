"""Daemons started as subprocesses on this machine: for ``swarmd demo`` and the integration tests.

Each daemon listens on 127.0.0.1 with port 0 (the OS picks), and its address is read back
through its control socket, so nothing depends on fixed ports. Waits are on conditions with
deadlines, never fixed sleeps. Every daemon is started in its own session so that a test's
SIGKILL reaches it alone (and a terminal's Ctrl-C reaches the demo, which stops them in order),
and ``stop`` escalates SIGTERM to SIGKILL after a bound. A daemon started ``tied`` gets SIGTERM
from the kernel when the process that started it dies, however it dies (Linux's
PR_SET_PDEATHSIG): a demo killed or whose terminal closed leaves no daemon behind.
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, TypeVar

from swarmd.errors import ControlError, SwarmdError
from swarmd.system.control import SOCKET_FILENAME, call

T = TypeVar("T")

# Flags that keep a local swarm off the machine's real network: no multicast, no UPnP.
LOOPBACK_FLAGS = ["--host-maddrs", "/ip4/127.0.0.1/tcp/0", "--no-mdns", "--no-nat-port-map"]


def wait_for(condition: Callable[[], T | None], timeout: float, what: str, poll_s: float = 0.25) -> T:
    """Poll ``condition`` until it returns a truthy value; raise TimeoutError naming ``what``.

    A condition mostly reads daemons' status, which costs each daemon asked 1.5 ms of CPU or
    more (a training daemon's is larger); a daemon's state moves in seconds, so four polls a
    second see it soon enough without taking the CPU the daemons run on."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(poll_s)


def create_run(state_dir: Path, spec_path: Path, env: dict[str, str] | None = None) -> str:
    """``swarmd run create`` in a subprocess; returns the run ID it printed."""
    out = subprocess.run(
        [sys.executable, "-m", "swarmd", "run", "create", "--spec", str(spec_path), "--state-dir", str(state_dir)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    if out.returncode != 0:
        raise SwarmdError(f"swarmd run create failed: {out.stderr.strip()}")
    return out.stdout.strip().splitlines()[0]


class DaemonProcess(Protocol):
    """What a ``LocalDaemon`` uses of its process: ``subprocess.Popen``'s names and meanings."""

    pid: int
    returncode: int | Any

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def send_signal(self, sig: int) -> None: ...


class Launcher(Protocol):
    """How ``swarmd`` processes start. ``FreshInterpreter`` runs ``python -m swarmd``; the tests
    fork them from an interpreter that has swarmd's modules imported already
    (``tests/integration/fork_launcher.py``)."""

    def start(self, args: list[str], log_path: Path) -> DaemonProcess:
        """``swarmd`` with ``args`` (``["run", ...]``) in a session of its own, a child of this
        process, its output appended to ``log_path``."""
        ...

    def run(self, args: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
        """``swarmd`` with ``args`` run to its end (at most ``timeout``), its output captured."""
        ...


class FreshInterpreter:
    """A new interpreter per process (``Launcher``), after an optional command prefix (e.g.
    ``["ip", "netns", "exec", NS]`` for a test's network namespace); ``tied``: each daemon
    started is sent SIGTERM when this process dies (the module doc)."""

    def __init__(self, command_prefix: list[str] | None = None, tied: bool = False) -> None:
        self.command_prefix, self.tied = command_prefix or [], tied

    def start(self, args: list[str], log_path: Path) -> DaemonProcess:
        with open(log_path, "ab") as log:
            return subprocess.Popen(
                [*self.command_prefix, sys.executable, "-m", "swarmd", *args],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=functools.partial(_terminated_with_parent, os.getpid()) if self.tied else None,
            )

    def run(self, args: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
        command = [*self.command_prefix, sys.executable, "-m", "swarmd", *args]
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout)


class LocalDaemon:
    def __init__(
        self,
        state_dir: Path,
        run_id: str,
        extra_args: list[str] | None = None,
        *,
        network_args: list[str] | None = None,
        command_prefix: list[str] | None = None,
        tied: bool = False,
        launcher: Launcher | None = None,
    ) -> None:
        """``tied``: the daemon is sent SIGTERM when this process dies (the module doc); only
        for a caller that starts it from its main thread and lives as long as it wants it.
        ``launcher``: how its processes start (default ``FreshInterpreter``, with
        ``command_prefix`` and ``tied``, which another launcher does not take)."""
        if launcher is not None and (command_prefix or tied):
            raise ValueError("a launcher starts the daemon itself: no command prefix, not tied")
        self.launcher = launcher or FreshInterpreter(command_prefix, tied)
        self.state_dir = state_dir
        self.run_id = run_id
        self.extra_args = extra_args or []
        self.network_args = LOOPBACK_FLAGS if network_args is None else network_args
        self.log_path = state_dir.parent / f"{state_dir.name}.log"
        self.proc: DaemonProcess | None = None

    @property
    def socket(self) -> Path:
        return self.state_dir / SOCKET_FILENAME

    def start(self, initial_peers: list[str] | None = None) -> LocalDaemon:
        args = ["run", "--run-id", self.run_id, "--state-dir", str(self.state_dir), *self.network_args]
        args += self.extra_args
        if initial_peers:
            args += ["--initial-peers", *initial_peers]
        self.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.proc = self.launcher.start(args, self.log_path)
        return self

    def terminate(self) -> None:
        """SIGTERM, without waiting: ``stop_all`` stops many at once."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def status(self) -> dict[str, Any] | None:
        """The daemon's status, or None while it cannot answer yet."""
        try:
            return call(self.socket, "status", timeout=2)
        except ControlError:
            return None

    def wait_running(self, timeout: float = 90) -> dict[str, Any]:
        def running() -> dict[str, Any] | None:
            if self.proc is not None and self.proc.poll() is not None:
                raise SwarmdError(f"daemon exited with {self.proc.returncode}; log:\n{self.log_tail()}")
            status = self.status()
            return status if status and status["state"] == "running" and status["addrs"] else None

        return wait_for(running, timeout, f"daemon in {self.state_dir} to run")

    def seen_peers(self) -> set[str]:
        status = self.status()
        return {p["peer_id"] for p in status["peers"]} if status else set()

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self, timeout: float = 40) -> int | None:
        """SIGTERM, wait up to ``timeout``, then SIGKILL. Returns the exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.proc.returncode

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def export(self, out: Path, timeout: float = 180) -> str:
        """``swarmd export`` of the run's model into ``out`` through this (running) daemon;
        returns what it printed. Raises ``SwarmdError`` with its error output when it fails."""
        command = ["export", "--run-id", self.run_id, str(out), "--state-dir", str(self.state_dir)]
        result = self.launcher.run(command, timeout)
        if result.returncode != 0:
            raise SwarmdError(f"swarmd export exited with {result.returncode}: {result.stderr[-2000:]}")
        return result.stdout


def stop_all(daemons: list[LocalDaemon], timeout: float) -> list[int | None]:
    """SIGTERM every daemon at once, wait up to ``timeout`` for all of them together, then
    SIGKILL those still running. Returns the exit codes."""
    for daemon in daemons:
        daemon.terminate()
    deadline = time.monotonic() + timeout
    for daemon in daemons:
        if daemon.proc is not None:
            try:
                daemon.proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                daemon.kill()
    return [None if d.proc is None else d.proc.returncode for d in daemons]


def _terminated_with_parent(parent: int) -> None:
    """In the forked child, before exec: ask the kernel for SIGTERM when ``parent`` dies (and
    end now if it died before we asked)."""
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:
            os._exit(1)


def start_swarm(daemons: list[LocalDaemon]) -> None:
    """Start the first daemon, the others joining through its addresses; wait until all run."""
    addrs = daemons[0].start().wait_running()["addrs"]
    for daemon in daemons[1:]:
        daemon.start(addrs)
    for daemon in daemons:
        daemon.wait_running()
