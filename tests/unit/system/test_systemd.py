"""sd_notify over a real AF_UNIX datagram socket, and the watchdog interval from the environment."""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from swarmd.system import systemd


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    # The test runner itself may run under systemd; never notify the real manager.
    for name in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def notify_socket(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[socket.socket]:
    path = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    # A datagram that was sent is already queued; the timeout only bounds a failing test.
    sock.settimeout(2.0)
    monkeypatch.setenv("NOTIFY_SOCKET", str(path))
    yield sock
    sock.close()


def _receive(sock: socket.socket) -> str:
    return sock.recv(4096).decode()


@pytest.mark.timeout(10)
def test_unset_socket_returns_false() -> None:
    assert systemd.sd_notify("READY=1") is False
    assert systemd.notify_ready("up") is False
    assert systemd.notify_watchdog() is False


@pytest.mark.timeout(10)
def test_ready_reaches_socket(notify_socket: socket.socket) -> None:
    assert systemd.notify_ready() is True
    assert _receive(notify_socket) == "READY=1"


@pytest.mark.timeout(10)
def test_ready_with_status(notify_socket: socket.socket) -> None:
    assert systemd.notify_ready("joined run\nabc") is True
    # The newline in the status must not become a second assignment.
    assert _receive(notify_socket) == "READY=1\nSTATUS=joined run abc"


@pytest.mark.timeout(10)
def test_helpers_send_their_states(notify_socket: socket.socket) -> None:
    assert systemd.notify_watchdog()
    assert _receive(notify_socket) == "WATCHDOG=1"
    assert systemd.notify_stopping()
    assert _receive(notify_socket) == "STOPPING=1"
    assert systemd.notify_status("stage 2 of 4")
    assert _receive(notify_socket) == "STATUS=stage 2 of 4"


@pytest.mark.timeout(10)
def test_abstract_socket(monkeypatch: pytest.MonkeyPatch) -> None:
    name = f"swarmd-test-{uuid.uuid4().hex}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(b"\0" + name.encode())
        sock.settimeout(2.0)
        monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
        assert systemd.sd_notify("READY=1") is True
        assert _receive(sock) == "READY=1"


@pytest.mark.timeout(10)
def test_send_failure_returns_false(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "nobody-listens.sock"))
    assert systemd.sd_notify("READY=1") is False


@pytest.mark.timeout(10)
def test_relative_socket_name_ignored(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NOTIFY_SOCKET", "relative.sock")
    assert systemd.sd_notify("READY=1") is False


@pytest.mark.timeout(10)
def test_watchdog_unset() -> None:
    assert systemd.watchdog_interval_s() is None


@pytest.mark.timeout(10)
def test_watchdog_is_half_the_period(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WATCHDOG_USEC", "120000000")
    assert systemd.watchdog_interval_s() == pytest.approx(60.0)


@pytest.mark.timeout(10)
def test_watchdog_for_this_pid(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WATCHDOG_USEC", "3000000")
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    assert systemd.watchdog_interval_s() == pytest.approx(1.5)


@pytest.mark.timeout(10)
def test_watchdog_for_another_pid(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WATCHDOG_USEC", "3000000")
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid() + 1))
    assert systemd.watchdog_interval_s() is None


@pytest.mark.timeout(10)
@pytest.mark.parametrize(("usec", "pid"), [("abc", None), ("0", None), ("-5", None), ("1000", "x")])
def test_watchdog_malformed(monkeypatch: pytest.MonkeyPatch, usec: str, pid: str | None) -> None:
    monkeypatch.setenv("WATCHDOG_USEC", usec)
    if pid is not None:
        monkeypatch.setenv("WATCHDOG_PID", pid)
    assert systemd.watchdog_interval_s() is None
