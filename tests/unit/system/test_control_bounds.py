"""daemon/system/control.py: the bounds that keep the control socket answering under a local
flood (connections held, the oldest idle one closed first, the client's retries) and the
request checks that run before the JSON parser."""

from __future__ import annotations

import asyncio
import json
import resource
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from swarmd.errors import ControlError
from swarmd.system import control
from swarmd.system.control import MAX_REQUEST_BYTES, ControlServer, call, nesting_depth, parse_request

pytestmark = pytest.mark.timeout(60)

COMMANDS = {"status": {}, "echo": {"limit": int}}


def _status(request: dict[str, Any]) -> dict[str, Any]:
    return {"state": "running"}


@pytest.fixture
def short_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="swd-", dir="/tmp"))  # tmp_path can be longer than sun_path allows
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


async def _until(condition: Callable[[], bool], what: str, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.01)


@pytest.mark.parametrize(
    ("data", "depth"),
    [
        (b"", 0),
        (b'{"command": "status"}', 1),
        (b"[[], [[]]]", 3),
        (b'{"a": "[[[[{{{{"}', 1),
        (b'{"a": "\\"[[[", "b": [1]}', 2),  # an escaped quote does not end the string
        (b'{"a": "\\\\", "b": [[1]]}', 3),  # an escaped backslash does not escape the quote after it
        (b"]]]][[", 2),
    ],
)
def test_nesting_depth(data: bytes, depth: int) -> None:
    assert nesting_depth(data) == depth


def test_parse_request_bounds() -> None:
    assert parse_request(b'{"command": "echo", "limit": 2}\n', COMMANDS) == ("echo", {"command": "echo", "limit": 2})
    line = b'{"command": "status", "x": "' + b"y" * MAX_REQUEST_BYTES + b'"}\n'
    with pytest.raises(ControlError, match=f"request is {len(line)} bytes, over {MAX_REQUEST_BYTES}"):
        parse_request(line, COMMANDS)
    with pytest.raises(ControlError, match="nests 3 levels deep, over the limit of 2"):
        parse_request(b'{"command": "echo", "limit": [[1]]}\n', COMMANDS)


def test_oldest_idle_connection_is_closed_for_a_new_one(short_dir: Path) -> None:
    async def main() -> None:
        srv = ControlServer(short_dir / "b.sock", {"status": _status}, max_connections=4)
        await srv.start()
        idle = []
        try:
            for _ in range(4):
                idle.append(await asyncio.open_unix_connection(str(srv.path)))
            await _until(lambda: srv.open_connections == 4, "4 idle connections held")
            assert await asyncio.to_thread(call, srv.path, "status") == {"state": "running"}
            oldest = json.loads(await asyncio.wait_for(idle[0][0].readline(), 5))
            assert oldest["ok"] is False and oldest["busy"] is True
            assert "the bound is 4" in oldest["error"] and "oldest idle" in oldest["error"]
            assert await asyncio.wait_for(idle[0][0].read(), 5) == b""  # then closed
            assert srv.evicted == 1
            await _until(lambda: srv.open_connections == 3, "the status connection closed")
        finally:
            for _, writer in idle:
                writer.close()
            await srv.stop()

    asyncio.run(main())


def test_busy_answer_is_retried_until_a_slot_frees(short_dir: Path) -> None:
    async def main() -> None:
        entered, release = asyncio.Event(), asyncio.Event()

        async def hold(request: dict[str, Any]) -> dict[str, Any]:
            entered.set()
            await release.wait()
            return {"held": True}

        srv = ControlServer(short_dir / "h.sock", {"status": _status, "hold": hold}, max_connections=1)
        await srv.start()
        try:
            holding = asyncio.create_task(asyncio.to_thread(call, srv.path, "hold"))
            await asyncio.wait_for(entered.wait(), 10)
            # The one slot is being answered: a short call gives up, naming its attempts (and the
            # last one's reason, which depends on where in the exchange the deadline fell: a try
            # cut short by the deadline after a busy answer is still busy).
            with pytest.raises(ControlError, match=r"stayed busy for 1 s over \d+ attempts \("):
                await asyncio.to_thread(call, srv.path, "status", timeout=1.0)
            refused = srv.evicted
            waiting = asyncio.create_task(asyncio.to_thread(call, srv.path, "status", timeout=20))
            await _until(lambda: srv.evicted > refused, "the status call to be turned away once")
            release.set()
            assert await asyncio.wait_for(holding, 10) == {"held": True}
            assert await asyncio.wait_for(waiting, 20) == {"state": "running"}
        finally:
            release.set()
            await srv.stop()

    asyncio.run(main())


def test_status_answers_during_a_burst_of_idle_connections(short_dir: Path) -> None:
    async def main() -> None:
        srv = ControlServer(short_dir / "f.sock", {"status": _status}, max_connections=8)
        await srv.start()
        flood: list[socket.socket] = []

        def open_idle() -> None:
            for _ in range(64):
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sock.connect(str(srv.path))  # blocking: waits for room in the backlog
                flood.append(sock)

        try:
            burst = asyncio.create_task(asyncio.to_thread(open_idle))
            answers = [await asyncio.to_thread(call, srv.path, "status", timeout=20) for _ in range(5)]
            await asyncio.wait_for(burst, 20)
            answers.append(await asyncio.to_thread(call, srv.path, "status", timeout=20))
            assert answers == [{"state": "running"}] * 6
            assert srv.open_connections <= 8
            assert srv.evicted >= 64 - 8
        finally:
            for sock in flood:
                sock.close()
            await srv.stop()

    asyncio.run(main())


def test_connect_refused_for_a_full_backlog_is_retried(short_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = short_dir / "q.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(0)  # nobody accepts yet: the queue fills after a connection or two
    fillers = []
    try:
        for _ in range(16):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.setblocking(False)
            try:
                sock.connect(str(path))
            except BlockingIOError:
                sock.close()
                break
            fillers.append(sock)
        else:
            pytest.fail("the listen queue never filled")
        with pytest.raises(ControlError, match=r"stayed busy for 0.2 s over \d+ attempts \(its listen backlog is full"):
            call(path, "status", timeout=0.2)

        refused = threading.Event()
        uniform = control.random.uniform

        def noting_uniform(a: float, b: float) -> float:
            refused.set()  # the client backs off: its connect was refused
            return uniform(a, b)

        monkeypatch.setattr(control.random, "uniform", noting_uniform)
        results: list[Any] = []
        client = threading.Thread(target=lambda: results.append(call(path, "status", timeout=20)))
        client.start()
        assert refused.wait(10)
        for sock in fillers:
            sock.close()
        listener.settimeout(10)
        while True:  # drain the queue (the fillers, now closed) until the client's retry arrives
            conn, _ = listener.accept()
            with conn:
                conn.settimeout(10)
                if conn.recv(4096):
                    conn.sendall(b'{"ok": true, "result": {"state": "running"}}\n')
                    break
        client.join(10)
        assert results == [{"state": "running"}]
    finally:
        for sock in fillers:
            sock.close()
        listener.close()


def test_raise_open_files_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1024:
        pytest.skip(f"hard open-files limit {hard} leaves no room to lower and raise")
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
        assert control.raise_open_files_limit(wanted=1024) == 1024
        assert resource.getrlimit(resource.RLIMIT_NOFILE) == (1024, hard)
        assert control.raise_open_files_limit(wanted=512) == 1024  # never lowered
        if hard != resource.RLIM_INFINITY:  # never past the hard limit
            assert control.raise_open_files_limit(wanted=hard + 1) == hard
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
