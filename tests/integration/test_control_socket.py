"""A real daemon's control socket under hostile local input: 1,000 idle connections held open
while ``swarmd status`` must still answer, and malformed requests that must each get one
error line, with no traceback in the daemon's log."""

from __future__ import annotations

import contextlib
import json
import resource
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from swarmd.system.control import MAX_REQUEST_BYTES, MAX_REQUEST_DEPTH, OPEN_FILES_WANTED, call
from swarmd.system.local_swarm import LocalDaemon

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

IDLE = 1000
COMMON_SOFT_LIMIT = 1024  # the usual default soft RLIMIT_NOFILE

KNOWN = ["dial_back", "gather_weights", "pause", "peers", "reload", "resume", "status"]
MALFORMED = [
    (b"this is not json\n", "request is not JSON"),
    (b"[" * 2000 + b"]" * 2000 + b"\n", f"nests 2000 levels deep, over the limit of {MAX_REQUEST_DEPTH}"),
    (b"x" * (2 * MAX_REQUEST_BYTES) + b"\n", f"over {MAX_REQUEST_BYTES} bytes without its newline"),
    (b"[1, 2, 3]\n", "request is a JSON array, not an object"),
    (
        b'{"command": "reboot"}\n',
        f"unknown command 'reboot'; known: {KNOWN}",
    ),
    (b'{"command": ["status"]}\n', "'command' is a JSON array, not a string"),
    (b'{"command": "status", "verbose": true}\n', "status takes no argument 'verbose'; its arguments: none"),
    (b'{"command": "status"}', "incomplete request: the connection closed after 21 bytes"),
]


@contextlib.contextmanager
def soft_open_files(limit: int) -> Iterator[None]:
    """This process's soft open-files limit set to ``limit`` (within the hard one), then restored."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit if hard == resource.RLIM_INFINITY else min(limit, hard), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def soft_open_files_of(pid: int) -> int:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            soft = line.split()[3]
            return sys.maxsize if soft == "unlimited" else int(soft)
    raise AssertionError(f"no open-files limit in /proc/{pid}/limits")


def send_raw(path: Path, data: bytes, close_write: bool) -> list[bytes]:
    """Send ``data`` on a fresh connection; the lines the daemon answered before closing."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(20)
        sock.connect(str(path))
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # refused before all was read
            sock.sendall(data)
            if close_write:
                sock.shutdown(socket.SHUT_WR)
        return read_until_closed(sock)


def read_until_closed(sock: socket.socket) -> list[bytes]:
    chunks = []
    with contextlib.suppress(ConnectionResetError):  # closed with part of a request unread
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    data = b"".join(chunks)
    assert data.endswith(b"\n"), data[:200]
    return data.splitlines()


def test_control_socket_under_idle_flood_and_malformed_requests(
    workdir: Path, make_run: Callable[..., str], daemon_factory: Callable[..., LocalDaemon]
) -> None:
    state = workdir / "d0"
    run_id = make_run(state)
    daemon = daemon_factory(state, run_id)
    # Start the daemon under the common soft default: it must raise its own limit to hold the flood.
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < IDLE + 512:
        pytest.skip(f"hard open-files limit {hard} cannot hold {IDLE} connections and the daemon")
    with soft_open_files(COMMON_SOFT_LIMIT):
        daemon.start()
    daemon.wait_running()
    wanted = OPEN_FILES_WANTED if hard == resource.RLIM_INFINITY else min(OPEN_FILES_WANTED, hard)
    assert soft_open_files_of(daemon.pid) == wanted

    idle: list[socket.socket] = []
    with soft_open_files(max(resource.getrlimit(resource.RLIMIT_NOFILE)[0], IDLE + 512)):
        try:

            def open_idle() -> None:
                for _ in range(IDLE):
                    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                    sock.connect(str(daemon.socket))  # blocking: waits for room in the backlog
                    idle.append(sock)

            errors: list[Exception] = []

            def status_while(burst: threading.Thread, answered: list[tuple[str, float]]) -> None:
                try:
                    while burst.is_alive() or not answered:  # at least one, retries included
                        started = time.monotonic()
                        run = call(daemon.socket, "status", timeout=30)["run_id"]
                        answered.append((run, time.monotonic() - started))
                except Exception as e:  # reported by the assertion below
                    errors.append(e)

            burst = threading.Thread(target=open_idle)
            answered: list[list[tuple[str, float]]] = [[] for _ in range(4)]
            callers = [threading.Thread(target=status_while, args=(burst, calls)) for calls in answered]
            started = time.monotonic()
            burst.start()
            for caller in callers:
                caller.start()
            burst.join(60)
            burst_s = time.monotonic() - started
            for caller in callers:
                caller.join(60)
            assert errors == []
            assert len(idle) == IDLE
            during = [answer for calls in answered for answer in calls]
            assert {run for run, _ in during} == {run_id} and len(during) >= len(callers)
            print(
                f"{IDLE} idle connections opened in {burst_s:.2f} s; {len(during)} status calls from "
                f"{len(callers)} threads answered meanwhile, slowest {max(s for _, s in during):.2f} s"
            )

            # All 1,000 held open (from our side): the CLI still answers.
            out = subprocess.run(
                [sys.executable, "-m", "swarmd", "status", "--state-dir", str(state), "--json"],
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert out.returncode == 0, out.stderr
            assert json.loads(out.stdout)["run_id"] == run_id

            for data, error in MALFORMED:
                lines = send_raw(daemon.socket, data, close_write=not data.endswith(b"\n"))
                assert len(lines) == 1, (data[:40], lines)
                answer = json.loads(lines[0])
                assert answer["ok"] is False and error in answer["error"], (data[:40], answer)

            # Every idle connection got one error line: closed to make room ("busy"), or at the
            # read deadline.
            kinds = {"busy": 0, "deadline": 0}
            for sock in idle:
                sock.settimeout(20)
                (line,) = read_until_closed(sock)
                answer = json.loads(line)
                assert answer["ok"] is False
                kinds["busy" if answer.get("busy") else "deadline"] += 1
                assert answer.get("busy") or "read deadline" in answer["error"], answer
            print(f"idle connections: {kinds}")
            assert kinds["busy"] > 0  # more idle connections than the bound: the oldest were closed
        finally:
            for sock in idle:
                sock.close()

    assert call(daemon.socket, "status")["state"] == "running"
    log = daemon.log_path.read_text(errors="replace")
    assert "Traceback" not in log
    assert "out of system resource" not in log  # asyncio's accept() on EMFILE
    assert "Control socket at its bound of" in log
