"""The dashboard's HTTP server: a small HTTP/1.1 server on the node's loop, on a loopback address.

Opt-in (``[dashboard] listen``, ``swarmd run --dashboard``) and for this machine only: the
config accepts loopback hosts alone, and a request whose ``Host`` header names anything but a
loopback host (read strictly: ``host[:port]``, sent once) is refused, so that a web page the
owner visits cannot reach it through DNS rebinding (a name of the page's own that resolves to
127.0.0.1). It only reads: GET and HEAD, one request per connection (``Connection: close``),
its head at most ``MAX_HEAD_BYTES`` and read within ``READ_TIMEOUT_S``, at most
``MAX_CONNECTIONS`` at once (past that the oldest one still sending its head is dropped), so a
stuck or hostile local client costs little.

Routes: ``/`` the page (``dashboard.html``, ``dashboard.js``), ``/metrics`` Prometheus's text
format from a registry of its own (``swarmd.web.metrics``), ``/api/status`` the status answer
``swarmd status --json`` prints, ``/api/history`` the curves' samples (``swarmd.web.history``),
which a task of the server takes every ``SAMPLE_S``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from swarmd.config import LOOPBACK_HOSTS, DashboardConfig
from swarmd.web.history import CAPACITY, SAMPLE_S, History
from swarmd.web.metrics import StatusCollector

logger = logging.getLogger(__name__)

SINGLE_HEADERS = frozenset({"host", "content-length"})
"""Headers a request may carry once at most."""
MAX_HEAD_BYTES = 8192
"""The request line and headers together."""
READ_TIMEOUT_S = 5.0
"""How long a client may take to send its request's head."""
WRITE_TIMEOUT_S = 10.0
"""How long a client may take to read the answer."""
MAX_CONNECTIONS = 32
STOP_TIMEOUT_S = 2.0

REASONS = {200: "OK", 400: "Bad Request", 403: "Forbidden", 404: "Not Found", 405: "Method Not Allowed"}
REASONS |= {413: "Request Header Fields Too Large", 500: "Internal Server Error", 503: "Service Unavailable"}
# The page loads nothing but its own script and its own API, and may not be framed by another site.
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'unsafe-inline'; "
    "connect-src 'self'; img-src 'self'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
STATIC = {"/": ("dashboard.html", "text/html; charset=utf-8"), "/dashboard.js": ("dashboard.js", "text/javascript")}


@dataclass
class Reply:
    status: int
    content_type: str = "text/plain; charset=utf-8"
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)

    def encode(self, with_body: bool) -> bytes:
        head = [f"HTTP/1.1 {self.status} {REASONS.get(self.status, 'Error')}", f"Content-Type: {self.content_type}"]
        head += [f"Content-Length: {len(self.body)}", "Connection: close"]
        head += [f"{k}: {v}" for k, v in {**SECURITY_HEADERS, **self.headers}.items()]
        return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + (self.body if with_body else b"")


def error(status: int, message: str, **headers: str) -> Reply:
    return Reply(status, body=(message + "\n").encode(), headers=headers)


def parse_head(head: bytes) -> tuple[str, str, dict[str, str]]:
    """(method, path without its query, headers by lower-case name); ValueError says what is malformed."""
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise ValueError(f"request line {lines[0][:80]!r} is not 'METHOD PATH HTTP/1.x'")
    headers = {}
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            raise ValueError(f"header line {line[:80]!r} is not 'Name: value'")
        if name.lower() in SINGLE_HEADERS and name.lower() in headers:
            # Two Hosts: which one a check reads and which one a proxy acts on may differ.
            raise ValueError(f"header {name[:40]!r} sent twice; a request has one")
        headers[name.lower()] = value.strip()
    return parts[0], parts[1].split("?", 1)[0], headers


def loopback_host(host: str) -> bool:
    """Whether a ``Host`` header names this machine (any port: an SSH tunnel may pick its own).

    Read strictly as ``name[:port]`` or ``[v6][:port]``, the port digits only: anything else
    (``localhost:80@evil``, a userinfo, a path, spaces) is no host a browser sends, and what a
    lax reading takes for the name may not be what something behind it acts on."""
    port: str | None = None
    if host.startswith("["):
        name, _, rest = host[1:].partition("]")
        if rest:
            if not rest.startswith(":"):
                return False
            port = rest[1:]
    else:
        name, sep, after = host.partition(":")
        port = after if sep else None
    if port is not None and not (port.isascii() and port.isdigit() and 0 < int(port) < 65536):
        return False
    return name.lower() in LOOPBACK_HOSTS


class DashboardServer:
    """The server and its history sampler; ``start`` binds, ``stop`` ends both (bounded)."""

    def __init__(
        self,
        config: DashboardConfig,
        status: Callable[[], dict[str, Any]],
        *,
        sample_s: float = SAMPLE_S,
        read_timeout_s: float = READ_TIMEOUT_S,
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        self.config = config
        self._status = status
        self.sample_s, self.read_timeout_s, self.max_connections = sample_s, read_timeout_s, max_connections
        self.history = History(CAPACITY)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(StatusCollector(status))
        package = resources.files("swarmd.web")
        self._static = {path: (package.joinpath(name).read_bytes(), kind) for path, (name, kind) in STATIC.items()}
        self._server: asyncio.Server | None = None
        self._sampler: asyncio.Task[None] | None = None
        self._connections: dict[asyncio.StreamWriter, bool] = {}  # -> whether its head has arrived
        self.url: str | None = None

    @property
    def open_connections(self) -> int:
        return len(self._connections)

    async def start(self) -> str | None:
        """Listen, when ``[dashboard] listen`` is set; returns the page's URL. The dashboard is an
        extra: when its port is taken, this logs a warning naming the fix and returns None, and the
        daemon goes on without it."""
        if not self.config.listen:
            return None
        host, port = self.config.address
        # "localhost" may resolve to two addresses, which port 0 would bind on two ports.
        host = "127.0.0.1" if host == "localhost" else host
        try:
            self._server = await asyncio.start_server(self._serve, host, port, limit=MAX_HEAD_BYTES)
        except OSError as e:
            logger.warning(
                "Dashboard: cannot listen on %s:%d (%s); set another port in [dashboard] listen or --dashboard "
                "(0: any free port); going on without it",
                host,
                port,
                e.strerror or e,
            )
            return None
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://{f'[{host}]' if ':' in host else host}:{port}/"
        self._sampler = asyncio.create_task(self._sample(), name="dashboard history")
        logger.info("Dashboard and metrics at %s (metrics: %smetrics)", self.url, self.url)
        return self.url

    async def stop(self) -> None:
        if self._sampler is not None:
            self._sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sampler
        if self._server is not None:
            self._server.close()
            for writer in list(self._connections):
                writer.close()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._server.wait_closed(), STOP_TIMEOUT_S)
        self.url = None

    async def _sample(self) -> None:
        while True:
            try:
                self.history.record(self._status(), time.time())
            except Exception as e:  # a status that fails once must not end the curves
                logger.warning("Dashboard: could not sample the status (%s); retrying in %.0f s", e, self.sample_s)
            await asyncio.sleep(self.sample_s)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not self._admit(writer):
            writer.write(error(503, f"busy: {self.max_connections} connections open; retry").encode(True))
            writer.close()
            return
        try:
            reply, method = await self._read(reader, writer)
            writer.write(reply.encode(with_body=method != "HEAD"))
            await asyncio.wait_for(writer.drain(), WRITE_TIMEOUT_S)
        except (ConnectionError, TimeoutError) as e:
            logger.debug("Dashboard: client went away or was too slow: %s", e)
        finally:
            self._connections.pop(writer, None)
            writer.close()

    def _admit(self, writer: asyncio.StreamWriter) -> bool:
        if len(self._connections) >= self.max_connections:
            idle = next((w for w, arrived in self._connections.items() if not arrived), None)
            if idle is None:
                return False
            idle.close()  # its read ends at once; a real request arriving now is served instead
            self._connections.pop(idle)
        self._connections[writer] = False
        return True

    async def _read(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> tuple[Reply, str]:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), self.read_timeout_s)
        except asyncio.LimitOverrunError:
            return error(413, f"request head over {MAX_HEAD_BYTES} bytes"), "GET"
        except TimeoutError:
            return error(400, f"request head not received within {self.read_timeout_s:.0f} s"), "GET"
        except asyncio.IncompleteReadError as e:
            raise ConnectionError("closed before its request head ended") from e
        if writer in self._connections:
            self._connections[writer] = True
        try:
            method, path, headers = parse_head(head)
        except ValueError as e:
            return error(400, str(e)), "GET"
        return self.answer(method, path, headers), method

    def answer(self, method: str, path: str, headers: dict[str, str]) -> Reply:
        """The reply to one parsed request."""
        if method not in ("GET", "HEAD"):
            return error(405, f"method {method[:16]!r} not allowed: this server only reads", Allow="GET, HEAD")
        host = headers.get("host")
        if host is None:
            return error(400, "no Host header")
        if not loopback_host(host):
            return error(403, f"Host {host[:80]!r} is not this machine: open the dashboard at {self.url}")
        try:
            if path in self._static:
                body, kind = self._static[path]
                return Reply(200, kind, body)
            if path == "/metrics":
                return Reply(200, CONTENT_TYPE_LATEST, generate_latest(self.registry))
            if path == "/api/status":
                return _json(self._status())
            if path == "/api/history":
                return _json({"interval_s": self.sample_s, "samples": self.history.samples()})
        except Exception as e:
            logger.warning("Dashboard: %s failed: %s", path, e)
            return error(500, f"{path} failed: {e}")
        return error(404, f"no page {path[:80]!r}; see / or /metrics")


def _json(value: object) -> Reply:
    return Reply(200, "application/json", json.dumps(value, default=str).encode())
