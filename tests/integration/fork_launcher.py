"""Daemons forked from one interpreter that has swarmd's modules imported already, so that a
test's daemon runs in about half a second instead of three.

A daemon's start (``python -m swarmd run``, to its control socket answering "running") took
3.0 s of wall and 3.1-3.8 s of CPU on this machine, 2.7 s of it importing torch, hivemind,
scipy and swarmd; the suite starts about 60. Each pytest worker here starts one server
(``python -m tests.integration.fork_launcher``) that imports them once and then forks a daemon
per request. What runs in the fork is what ``python -m swarmd`` (or any module) runs, through
``runpy`` with the same arguments, then the interpreter's exit (non-daemon threads joined, ``atexit``
handlers, stdio flushed).

The server forks twice, and the middle process exits at once: the daemon is then re-parented
to the test process, which marks itself a child subreaper (``PR_SET_CHILD_SUBREAPER``) first.
So the daemon is the test's own child, as a ``subprocess.Popen``'s is: waited for with
``waitpid``, its exit code read, its CPU counted in the test's ``RUSAGE_CHILDREN``. Each fork
gets fresh seeds for ``random`` and numpy (forks of one process would draw alike: DHT IDs,
jitter), its own session, the requester's environment, stdin from /dev/null and stdout and
stderr appended to its log.

The demo and the daemons started under a command prefix (a network namespace, the silent
member's wrapper) still start a fresh interpreter, and so do ``swarmd demo``'s daemons in
its test: that path stays tested.
"""

from __future__ import annotations

import atexit
import ctypes
import json
import os
import random
import runpy
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Any

PR_SET_CHILD_SUBREAPER = 36
PRELOADED = ("swarmd.cli.main", "swarmd.cli.run_command", "swarmd.node.node", "swarmd.models.build")
"""What a training daemon imports before it runs (the costly part of its start)."""
POLL_S = 0.02


class ForkedDaemon:
    """A forked daemon as ``LocalDaemon`` uses a ``subprocess.Popen``: this process's child."""

    def __init__(self, pid: int, args: list[str]) -> None:
        self.pid, self.args = pid, args
        self.returncode: int | None = None
        self._lock = threading.Lock()  # a watcher thread polls while the test waits

    def poll(self) -> int | None:
        with self._lock:
            if self.returncode is None:
                try:
                    pid, status = os.waitpid(self.pid, os.WNOHANG)
                except ChildProcessError:  # reaped elsewhere: dead, its code unknown (as Popen says)
                    pid, status = self.pid, 0
                if pid:
                    self.returncode = os.waitstatus_to_exitcode(status)
            return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            time.sleep(POLL_S)  # sync-ok: how Popen.wait with a timeout waits too
        return code

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:  # never a PID that was reaped and may be reused
            os.kill(self.pid, sig)


class ForkLauncher:
    """The server of one pytest worker (started on first use) and the requests to it: a
    ``swarmd.system.local_swarm.Launcher``, and any module run as ``python -m`` would."""

    def __init__(self) -> None:
        self._server: subprocess.Popen[str] | None = None
        self._lock = threading.Lock()

    def start(self, args: list[str], log_path: Path) -> ForkedDaemon:
        return self._fork("swarmd", args, log_path, log_path)

    def start_module(self, module: str, args: list[str], log_path: Path) -> ForkedDaemon:
        """``python -m module args`` left running (as ``start``), its output appended to the log."""
        return self._fork(module, args, log_path, log_path)

    def run(self, args: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
        return self.run_module("swarmd", args, timeout)

    def run_module(
        self, module: str, args: list[str], timeout: float, cwd: Path | None = None
    ) -> subprocess.CompletedProcess[str]:
        """``python -m module args`` to its end, its output captured. Past ``timeout`` it gets
        SIGTERM (to close what it started), then SIGKILL, and ``TimeoutExpired`` is raised."""
        with tempfile.TemporaryDirectory(prefix="swd-run-") as folder:
            out, err = Path(folder) / "out", Path(folder) / "err"
            proc = self._fork(module, args, out, err, cwd)
            try:
                code = proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(20)
                except subprocess.TimeoutExpired:
                    proc.send_signal(signal.SIGKILL)
                    proc.wait()
                raise subprocess.TimeoutExpired(proc.args, timeout, out.read_text(), err.read_text()) from None
            return subprocess.CompletedProcess(proc.args, code, out.read_text(), err.read_text())

    def _fork(self, module: str, args: list[str], out: Path, err: Path, cwd: Path | None = None) -> ForkedDaemon:
        request = {"module": module, "args": args, "out": str(out), "err": str(err)}
        request |= {"env": dict(os.environ), "cwd": str(cwd or os.getcwd())}
        with self._lock:
            server = self._serving()
            assert server.stdin is not None and server.stdout is not None
            server.stdin.write(json.dumps(request) + "\n")
            server.stdin.flush()
            answer = server.stdout.readline()
        if not answer:
            raise RuntimeError(f"the fork server exited with {server.wait()}")
        return ForkedDaemon(int(json.loads(answer)["pid"]), [module, *args])

    def _serving(self) -> subprocess.Popen[str]:
        if self._server is None or self._server.poll() is not None:
            if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
                raise OSError(ctypes.get_errno(), "cannot become a child subreaper")
            root = Path(__file__).resolve().parents[2]
            self._server = subprocess.Popen(
                [sys.executable, "-m", "tests.integration.fork_launcher"],
                cwd=root,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            assert self._server.stdout is not None
            if self._server.stdout.readline().strip() != "ready":
                raise RuntimeError(f"the fork server did not start: exit {self._server.wait()}")
        return self._server

    def close(self) -> None:
        if self._server is not None:
            assert self._server.stdin is not None
            self._server.stdin.close()  # it exits at the end of its input
            self._server.wait(30)
            self._server = None


class WrappedDaemons:
    """A ``Launcher`` whose daemons run under a wrapper module that patches the process first and
    then runs what it is given (``python -m MODULE ARGS python -m swarmd run ...``), forked."""

    def __init__(self, forks: ForkLauncher, module: str, args: list[str]) -> None:
        self.forks, self.module, self.args = forks, module, args

    def start(self, args: list[str], log_path: Path) -> ForkedDaemon:
        return self.forks.start_module(self.module, [*self.args, sys.executable, "-m", "swarmd", *args], log_path)

    def run(self, args: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
        return self.forks.run(args, timeout)


def _serve() -> None:
    for name in PRELOADED:
        __import__(name)
    print("ready", flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        report_r, report_w = os.pipe()
        middle = os.fork()
        if middle == 0:
            os.close(report_r)
            daemon = os.fork()
            if daemon == 0:
                os.close(report_w)
                _run_daemon(request)
            os.write(report_w, str(daemon).encode())
            os._exit(0)  # the daemon is re-parented to the requester (a subreaper)
        os.close(report_w)
        with os.fdopen(report_r, "rb") as report:
            pid = int(report.read())
        os.waitpid(middle, 0)  # gone: the daemon is the requester's child before it hears its PID
        print(json.dumps({"pid": pid}), flush=True)


def _run_daemon(request: dict[str, Any]) -> None:
    """In the fork: what ``python -m module`` does, then exit; never returns."""
    code: int = 1
    try:
        os.setsid()
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT
        out = os.open(request["out"], flags, 0o644)
        err = out if request["err"] == request["out"] else os.open(request["err"], flags, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(out, 1)
        os.dup2(err, 2)
        os.closerange(3, os.sysconf("SC_OPEN_MAX"))
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        random.seed()
        import numpy

        numpy.random.seed()
        sys.argv = [request["module"], *request["args"]]
        runpy.run_module(request["module"], run_name="__main__", alter_sys=True)  # swarmd's raises SystemExit
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            threading._shutdown()  # type: ignore[attr-defined]  # as at an interpreter's exit
            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


if __name__ == "__main__":
    _serve()
