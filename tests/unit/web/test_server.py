"""daemon/web/server.py: the dashboard's HTTP server on 127.0.0.1, spoken to over raw sockets:
its routes, the DNS-rebinding guard, the bounds on a request, and a port already taken."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from swarmd.config import DashboardConfig
from swarmd.web.server import MAX_HEAD_BYTES, DashboardServer, loopback_host, parse_head

pytestmark = pytest.mark.timeout(30)


def status() -> dict[str, Any]:
    training = {"updates": 7, "loss": 3.5, "tokens_per_s": 900.0}
    own = {"peer_id": "12D3KooWown", "version": "0.1.0", "state": "running", "run_id": "r", "roles": ["worker"]}
    return {**own, "paused": None, "training": training, "peers": [], "limits": {"cpu_share": 0.5}}


def serve(test: Callable[[DashboardServer], Awaitable[None]], **kwargs: Any) -> None:
    async def main() -> None:
        server = DashboardServer(DashboardConfig(listen="127.0.0.1:0"), status, **kwargs)
        assert await server.start() == server.url
        try:
            await asyncio.wait_for(test(server), 20)
        finally:
            await server.stop()

    asyncio.run(main())


async def exchange(url: str | None, request: bytes) -> tuple[int, dict[str, str], bytes]:
    assert url is not None
    port = int(url.rsplit(":", 1)[1].strip("/"))
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request)
    await writer.drain()
    raw = await reader.read()
    writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return int(lines[0].split(" ")[1]), headers, body


async def until(condition: Callable[[], bool], what: str, timeout_s: float = 10.0) -> None:
    """Wait for ``condition`` on the server's own loop, at most ``timeout_s``."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, f"{what} not within {timeout_s:.0f} s"
        await asyncio.sleep(0.01)  # sync-ok: polling a condition within a deadline


def get(path: str, host: str = "127.0.0.1:9470", method: str = "GET") -> bytes:
    return f"{method} {path} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: test\r\n\r\n".encode()


def test_the_page_metrics_status_and_history_are_served() -> None:
    async def test(server: DashboardServer) -> None:
        code, headers, body = await exchange(server.url, get("/"))
        assert code == 200 and headers["content-type"].startswith("text/html") and b'id="chart-loss"' in body
        assert "script-src 'self'" in headers["content-security-policy"] and headers["connection"] == "close"
        code, _, body = await exchange(server.url, get("/dashboard.js"))
        assert code == 200 and b"data-points" in body
        code, headers, body = await exchange(server.url, get("/metrics?x=1"))
        families = {f.name: f for f in text_string_to_metric_families(body.decode())}
        assert code == 200 and headers["content-type"].startswith("text/plain")
        assert families["swarmd_loss"].samples[0].value == 3.5
        assert "python_gc_objects_collected" not in families  # a registry of its own, not the global one
        code, _, body = await exchange(server.url, get("/api/status", host="localhost"))
        answer = json.loads(body)
        assert code == 200 and answer["peer_id"] == "12D3KooWown" and answer["limits"]["cpu_share"] == 0.5

        await until(lambda: len(server.history) >= 2, "two history samples")
        code, _, body = await exchange(server.url, get("/api/history", host="[::1]:8080"))
        history = json.loads(body)
        assert code == 200 and history["interval_s"] == 0.05 and history["samples"][0]["loss"] == 3.5

    serve(test, sample_s=0.05)


def test_a_host_that_is_not_this_machine_is_refused_as_dns_rebinding() -> None:
    async def test(server: DashboardServer) -> None:
        code, _, body = await exchange(server.url, get("/api/status", host="attacker.example:9470"))
        assert code == 403 and b"attacker.example" in body and b"12D3KooWown" not in body
        code, _, _ = await exchange(server.url, b"GET /metrics HTTP/1.1\r\nUser-Agent: test\r\n\r\n")
        assert code == 400  # no Host at all

    serve(test)


def test_only_reads_are_served_and_unknown_paths_are_not_found() -> None:
    async def test(server: DashboardServer) -> None:
        code, headers, _ = await exchange(server.url, get("/api/status", method="POST"))
        assert code == 405 and headers["allow"] == "GET, HEAD"
        code, _, body = await exchange(server.url, get("/etc/passwd"))
        assert code == 404 and b"/metrics" in body
        code, headers, body = await exchange(server.url, get("/metrics", method="HEAD"))
        assert code == 200 and body == b"" and int(headers["content-length"]) > 0
        code, _, _ = await exchange(server.url, b"NONSENSE\r\n\r\n")
        assert code == 400

    serve(test)


def test_an_oversized_or_slow_request_head_is_cut_off() -> None:
    async def test(server: DashboardServer) -> None:
        huge = b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Pad: " + b"a" * MAX_HEAD_BYTES + b"\r\n\r\n"
        code, _, body = await exchange(server.url, huge)
        assert code == 413 and str(MAX_HEAD_BYTES).encode() in body
        code, _, body = await exchange(server.url, b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # never ends
        assert code == 400 and b"within" in body

    serve(test, read_timeout_s=0.3)


def test_past_the_connection_bound_the_oldest_idle_connection_makes_room() -> None:
    async def test(server: DashboardServer) -> None:
        assert server.url is not None
        port = int(server.url.rsplit(":", 1)[1].strip("/"))
        idle = [await asyncio.open_connection("127.0.0.1", port) for _ in range(2)]
        await until(lambda: server.open_connections >= 2, "both idle connections to be open")
        code, _, _ = await exchange(server.url, get("/metrics"))
        assert code == 200
        assert await idle[0][0].read() == b""  # the oldest idle one was closed to make room
        for _, writer in idle:
            writer.close()

    serve(test, max_connections=2)


def test_a_port_already_taken_leaves_the_daemon_without_a_dashboard(caplog: pytest.LogCaptureFixture) -> None:
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]

    async def main() -> None:
        server = DashboardServer(DashboardConfig(listen=f"127.0.0.1:{port}"), status)
        with caplog.at_level(logging.WARNING):
            assert await server.start() is None
        assert server.url is None
        await server.stop()

    try:
        asyncio.run(main())
    finally:
        taken.close()
    assert f"cannot listen on 127.0.0.1:{port}" in caplog.text and "[dashboard] listen" in caplog.text


def test_request_heads_and_hosts_are_parsed_strictly() -> None:
    assert parse_head(b"GET /a?b=1 HTTP/1.1\r\nHost: x\r\nAccept:  */*\r\n\r\n") == (
        "GET",
        "/a",
        {"host": "x", "accept": "*/*"},
    )
    for bad in (b"GET /\r\n\r\n", b"GET / SPDY/3\r\n\r\n", b"GET / HTTP/1.1\r\nno colon\r\n\r\n"):
        with pytest.raises(ValueError):
            parse_head(bad)
    with pytest.raises(ValueError, match="sent twice"):
        parse_head(b"GET / HTTP/1.1\r\nHost: localhost\r\nhost: evil.example\r\n\r\n")
    assert all(loopback_host(h) for h in ("127.0.0.1", "localhost:9470", "LOCALHOST", "[::1]:80", "127.0.0.1:1"))
    assert not any(loopback_host(h) for h in ("127.0.0.1.evil.example", "evil.example:9470", "[::2]:80", ""))
    hostile = ("localhost:80@evil", "localhost@evil", "localhost:", "localhost:0", "localhost:99999", "[::1]x")
    assert not any(loopback_host(h) for h in (*hostile, "localhost:80/x", "127.0.0.1:8 0", "[::1]:", "localhost:٣"))


def test_without_listen_the_server_stays_off() -> None:
    async def main() -> None:
        server = DashboardServer(DashboardConfig(), status)
        assert await server.start() is None
        assert server.url is None and server.open_connections == 0
        await server.stop()

    asyncio.run(main())
