"""daemon/system/control.py: the control socket, served on an asyncio loop in a background thread."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import shutil
import socket
import stat
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from swarmd.errors import ControlError
from swarmd.system.control import MAX_REQUEST_BYTES, MAX_REQUEST_DEPTH, MAX_SOCKET_PATH, ControlServer, call

pytestmark = pytest.mark.timeout(30)


ECHO_ARGUMENTS = {"limit": int, "pad": str, "scale": float, "verbose": bool}


def _status(request: dict[str, Any]) -> dict[str, Any]:
    return {"state": "running", "peers": 3}


def _echo(request: dict[str, Any]) -> dict[str, Any]:
    return {"request": request}


def _boom(request: dict[str, Any]) -> dict[str, Any]:
    raise RuntimeError("disk on fire")


class LoopThread:
    """An asyncio loop in a daemon thread, to serve while the test calls synchronously."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(10)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture
def short_dir() -> Iterator[Path]:
    # tmp_path can be longer than sun_path allows.
    path = Path(tempfile.mkdtemp(prefix="swd-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def server(short_dir: Path) -> Iterator[ControlServer]:
    loop = LoopThread()
    srv = ControlServer(
        short_dir / "c.sock", {"status": _status, "echo": _echo, "boom": _boom}, {"echo": ECHO_ARGUMENTS}
    )
    loop.run(srv.start())
    try:
        yield srv
    finally:
        loop.run(srv.stop())
        loop.close()


def _raw_request(path: Path, data: bytes) -> dict[str, Any]:
    """Send ``data`` as it is; the answer must be exactly one JSON line, then the server closes."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(str(path))
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # refused before all was read
            sock.sendall(data)
        chunks = []
        with contextlib.suppress(ConnectionResetError):  # closed with part of an oversize request unread
            while chunk := sock.recv(65536):
                chunks.append(chunk)
    lines = b"".join(chunks).split(b"\n")
    assert len(lines) == 2 and lines[1] == b"", lines  # one line, newline-terminated
    answer: dict[str, Any] = json.loads(lines[0])
    return answer


def test_socket_mode_0600(server: ControlServer) -> None:
    assert server.path.is_socket()
    assert stat.S_IMODE(server.path.stat().st_mode) == 0o600


def test_status(server: ControlServer) -> None:
    assert call(server.path, "status") == {"state": "running", "peers": 3}


def test_arguments_reach_the_handler(server: ControlServer) -> None:
    assert call(server.path, "echo", limit=5) == {"request": {"command": "echo", "limit": 5}}


def test_many_calls_in_a_row(server: ControlServer) -> None:
    for _ in range(20):
        assert call(server.path, "status")["peers"] == 3


def test_unknown_command(server: ControlServer) -> None:
    with pytest.raises(ControlError, match="unknown command 'nope'") as info:
        call(server.path, "nope")
    assert "status" in str(info.value)  # the known commands are listed


def test_handler_error(server: ControlServer) -> None:
    with pytest.raises(ControlError, match="boom failed: disk on fire"):
        call(server.path, "boom")
    # The server survives a failing handler.
    assert call(server.path, "status")["state"] == "running"


def test_oversized_request(server: ControlServer) -> None:
    with pytest.raises(ControlError, match=f"over {MAX_REQUEST_BYTES} bytes without its newline"):
        call(server.path, "echo", pad="x" * (2 * MAX_REQUEST_BYTES))
    assert call(server.path, "status")["state"] == "running"


def test_oversized_raw_request_answered(server: ControlServer) -> None:
    answer = _raw_request(server.path, b"x" * (MAX_REQUEST_BYTES + 100) + b"\n")
    assert answer["ok"] is False
    assert str(MAX_REQUEST_BYTES) in answer["error"]


DEEP = b"[" * 2000 + b"]" * 2000


@pytest.mark.parametrize(
    ("data", "error"),
    [
        (b"not json\n", "not JSON (Expecting value"),
        (b'{"command": "status"\n', "not JSON"),
        (b'{"command": "\xff\xfe"}\n', "not UTF-8"),
        (DEEP + b"\n", f"nests 2000 levels deep, over the limit of {MAX_REQUEST_DEPTH}"),
        (b'{"command": "status", "a": ' + DEEP[:600] + b"}\n", "nests 601 levels deep"),
        (b'{"command": "status", "a": "[[[[[[[[[[[[[[[[[[[[", "b": 1}\n', "status takes no argument 'a'"),
        (b"[1, 2]\n", "request is a JSON array, not an object"),
        (b'"status"\n', "request is a JSON string, not an object"),
        (b"null\n", "request is a JSON null, not an object"),
        (b'{"command": 5}\n', "'command' is a JSON number, not a string; known commands: ['boom', 'echo', 'status']"),
        (b'{"no_command": 1}\n', "request has no 'command'"),
        (b'{"command": "nope"}\n', "unknown command 'nope'"),
        (b'{"command": "echo", "limit": "5"}\n', "echo's argument 'limit' must be int, not a JSON string"),
        (b'{"command": "echo", "limit": true}\n', "echo's argument 'limit' must be int, not a JSON boolean"),
        (b'{"command": "echo", "verbose": 1}\n', "echo's argument 'verbose' must be bool, not a JSON number"),
        (b'{"command": "echo", "pad": ["x"]}\n', "echo's argument 'pad' must be str, not a JSON array"),
        (b'{"command": "echo", "other": 1}\n', "echo takes no argument 'other'; its arguments: ['limit', 'pad'"),
    ],
)
def test_malformed_requests(server: ControlServer, caplog: pytest.LogCaptureFixture, data: bytes, error: str) -> None:
    caplog.set_level(logging.DEBUG, logger="swarmd.system.control")
    answer = _raw_request(server.path, data)
    assert answer["ok"] is False
    assert error in answer["error"]
    # Client error is logged at DEBUG, never with a traceback, and the server goes on answering.
    assert [r for r in caplog.records if r.exc_info or r.levelno >= logging.WARNING] == []
    assert any(error in r.getMessage() for r in caplog.records)
    assert call(server.path, "status")["state"] == "running"


def test_well_typed_arguments_accepted(server: ControlServer) -> None:
    # A JSON integer is a fine float; the request the handler gets is the one sent.
    request = {"command": "echo", "limit": 3, "pad": "x", "scale": 2, "verbose": False}
    assert call(server.path, "echo", limit=3, pad="x", scale=2, verbose=False) == {"request": request}


def test_incomplete_request(server: ControlServer) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(str(server.path))
        sock.sendall(b'{"command": "status"}')  # no newline
        sock.shutdown(socket.SHUT_WR)
        answer = json.loads(sock.recv(65536))
    assert answer["ok"] is False
    assert "incomplete request: the connection closed after 21 bytes without a newline" in answer["error"]


def test_missing_socket(short_dir: Path) -> None:
    path = short_dir / "absent.sock"
    with pytest.raises(ControlError, match="no daemon is running") as info:
        call(path, "status")
    assert str(path) in str(info.value)


def test_stale_socket(short_dir: Path) -> None:
    path = short_dir / "stale.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))  # bound but never listening: nobody answers
    sock.close()
    with pytest.raises(ControlError, match="stale socket") as info:
        call(path, "status")
    assert str(path) in str(info.value)


def test_stop_removes_socket(short_dir: Path) -> None:
    loop = LoopThread()
    try:
        srv = ControlServer(short_dir / "s.sock", {"status": _status})
        loop.run(srv.start())
        assert srv.path.exists()
        loop.run(srv.stop())
        assert not srv.path.exists()
        with pytest.raises(ControlError, match="no daemon is running"):
            call(srv.path, "status")
    finally:
        loop.close()


def test_start_replaces_leftover_socket_file(short_dir: Path) -> None:
    path = short_dir / "left.sock"
    path.write_text("left behind by a crash")
    loop = LoopThread()
    try:
        srv = ControlServer(path, {"status": _status})
        loop.run(srv.start())
        assert call(path, "status")["peers"] == 3
        loop.run(srv.stop())
    finally:
        loop.close()


def test_socket_path_too_long() -> None:
    path = Path("/tmp") / ("d" * MAX_SOCKET_PATH) / "c.sock"
    with pytest.raises(ControlError, match=f"over the kernel's {MAX_SOCKET_PATH}"):
        ControlServer(path, {})


def test_with_asyncio_to_thread(short_dir: Path) -> None:
    # The same through asyncio in the test itself: the loop serves while call() blocks a worker thread.
    async def main() -> Any:
        srv = ControlServer(short_dir / "a.sock", {"status": _status})
        await srv.start()
        try:
            return await asyncio.to_thread(call, srv.path, "status")
        finally:
            await srv.stop()

    assert asyncio.run(main()) == {"state": "running", "peers": 3}
