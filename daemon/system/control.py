"""The local control API: a Unix socket (mode 0600) in the state directory.

One request per connection: a JSON object on one line, answered by one JSON line. Only the
daemon's owner can connect (the socket's mode and the state directory's), but a buggy or
hostile local script must still not stall or crash it, so every request is bounded before it
is believed: its size, how deep it nests (checked before the parser recurses), its schema
(a string ``command`` the daemon knows, and only that command's arguments, of their types),
and how long it may take to arrive. A malformed request gets one error line saying what was
wrong and the limit, and is logged at DEBUG only: client error is never a traceback.

The server holds a bounded number of connections; past the bound it closes the oldest one
that has not yet sent its request, with a ``busy`` error line, so a flood of idle connections
cannot starve a real one. The listen backlog is large so that a burst of connects queues in
the kernel instead of failing, and the client (``call``) retries a connect the kernel refuses
for a full backlog, and a ``busy`` answer, with jittered backoff within its deadline.

Handlers only read state the node keeps up to date, so an answer never waits on the network
or on compute: ``swarmd status`` answers within a second while busy.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import logging
import os
import random
import resource
import socket
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from swarmd.errors import ControlError

logger = logging.getLogger(__name__)

SOCKET_FILENAME = "control.sock"
MAX_REQUEST_BYTES = 4096
MAX_RESPONSE_BYTES = 4 * 1024 * 1024
# The kernel limits sun_path to 108 bytes.
MAX_SOCKET_PATH = 107
# A request is a flat object (depth 1); one more level is the most any argument could need.
# Checked before parsing: Python's JSON parser recurses once per level and 4 KB of '[' would
# otherwise reach the interpreter's recursion limit.
MAX_REQUEST_DEPTH = 2
READ_DEADLINE_S = 5.0  # to send the whole request line after connecting
WRITE_DEADLINE_S = 5.0  # for the client to take the answer
ASYNC_HANDLER_TIMEOUT_S = 120.0
# Connections held at once. Larger than the connections one accept round can bring in (the
# accept batch, a few rounds of it) so that a real request is read before a flood makes it the
# oldest idle one; a quarter of the open-files limit at most, leaving the rest to the swarm.
MAX_CONNECTIONS = 512
ACCEPT_BATCH = 64  # connections asyncio accepts per readiness event
LISTEN_BACKLOG = 4096  # the kernel caps it at net.core.somaxconn
# The daemon raises its soft open-files limit toward this (never past the hard limit).
OPEN_FILES_WANTED = 65536
BUSY_WARNING_INTERVAL_S = 60.0
# The client's retry of a connect refused for a full backlog, or of a "busy" answer.
RETRY_FIRST_S = 0.01
RETRY_MAX_S = 0.5
EXAMPLE_REQUEST = '{"command": "status"}'

Handler = Callable[[dict[str, Any]], dict[str, Any] | Awaitable[dict[str, Any]]]
# For each command that takes arguments: each argument's name and type (str, int, float or bool).
Arguments = Mapping[str, Mapping[str, type]]


def nesting_depth(data: bytes) -> int:
    """How deep the arrays and objects in ``data`` nest, brackets inside JSON strings aside."""
    depth = deepest = 0
    in_string = escaped = False
    for byte in data:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:  # quote
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):  # [ {
            depth += 1
            deepest = max(deepest, depth)
        elif byte in (0x5D, 0x7D) and depth > 0:  # ] }; a stray closer cannot hide later openers
            depth -= 1
    return deepest


def _json_type(value: Any) -> str:
    names = {dict: "object", list: "array", str: "string", bool: "boolean", int: "number", float: "number"}
    return "null" if value is None else names.get(type(value), type(value).__name__)


def _fits(value: Any, expected: type) -> bool:
    if isinstance(value, bool) or expected is bool:  # bool is an int to Python, not to JSON
        return isinstance(value, bool) and expected is bool
    if expected is float:
        return isinstance(value, int | float)
    return isinstance(value, expected)


def parse_request(line: bytes, commands: Arguments) -> tuple[str, dict[str, Any]]:
    """The command and the whole request from one request line, checked against ``commands``
    (each known command and its arguments' types). Raises ``ControlError`` saying what is wrong."""
    if len(line) > MAX_REQUEST_BYTES:
        raise ControlError(f"request is {len(line)} bytes, over {MAX_REQUEST_BYTES}; send a shorter request")
    depth = nesting_depth(line)
    if depth > MAX_REQUEST_DEPTH:
        raise ControlError(
            f"request nests {depth} levels deep, over the limit of {MAX_REQUEST_DEPTH}; "
            f"send a flat JSON object such as {EXAMPLE_REQUEST}"
        )
    try:
        request = json.loads(line)
    except UnicodeDecodeError:
        raise ControlError(f"request is not UTF-8 text; send a JSON object such as {EXAMPLE_REQUEST}") from None
    except ValueError as e:  # JSONDecodeError, or an integer past Python's digit limit
        raise ControlError(
            f"request is not JSON ({e}); send one object on one line, such as {EXAMPLE_REQUEST}"
        ) from None
    if not isinstance(request, dict):
        raise ControlError(f"request is a JSON {_json_type(request)}, not an object; send {EXAMPLE_REQUEST}")
    known = sorted(commands)
    if "command" not in request:
        raise ControlError(f"request has no 'command'; known commands: {known}")
    command = request["command"]
    if not isinstance(command, str):
        raise ControlError(f"'command' is a JSON {_json_type(command)}, not a string; known commands: {known}")
    if command not in commands:
        raise ControlError(f"unknown command {command[:40]!r}; known: {known}")
    takes = commands[command]
    for name, value in request.items():
        if name == "command":
            continue
        if name not in takes:
            raise ControlError(f"{command} takes no argument {name[:40]!r}; its arguments: {sorted(takes) or 'none'}")
        if not _fits(value, takes[name]):
            raise ControlError(
                f"{command}'s argument {name!r} must be {takes[name].__name__}, not a JSON {_json_type(value)}"
            )
    return command, request


def raise_open_files_limit(wanted: int = OPEN_FILES_WANTED) -> int:
    """Raise this process's soft RLIMIT_NOFILE toward ``wanted``, never past the hard limit
    (the common soft default of 1,024 is less than the connections the daemon holds); returns
    the soft limit in force. Children started afterwards inherit it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft == resource.RLIM_INFINITY or soft >= target:
        return wanted if soft == resource.RLIM_INFINITY else soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError) as e:
        logger.warning("Could not raise the open-files limit from %d to %d (%s); keeping %d", soft, target, e, soft)
        return soft
    logger.info("Raised the open-files limit from %d to %d (hard limit %s)", soft, target, hard)
    return target


@dataclass(eq=False)
class _ControlConnection:
    writer: asyncio.StreamWriter
    opened: float = field(default_factory=time.monotonic)
    reading: bool = True  # still waiting for the request line: evictable
    evicted: bool = False


class ControlServer:
    def __init__(
        self,
        path: Path,
        handlers: dict[str, Handler],
        arguments: Arguments | None = None,
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        if len(str(path)) > MAX_SOCKET_PATH:
            raise ControlError(
                f"control socket path {path} is {len(str(path))} bytes, over the kernel's {MAX_SOCKET_PATH}; "
                "use a shorter state_dir"
            )
        arguments = arguments or {}
        if unknown := set(arguments) - set(handlers):
            raise ValueError(f"arguments given for commands without a handler: {sorted(unknown)}")
        self.path = path
        self.handlers = handlers
        self.commands: dict[str, Mapping[str, type]] = {name: arguments.get(name, {}) for name in handlers}
        self.max_connections = max_connections
        self.evicted = 0  # idle connections closed to make room, since start
        self._connections: dict[_ControlConnection, None] = {}  # oldest first
        self._server: asyncio.Server | None = None
        self._next_busy_warning = 0.0

    @property
    def open_connections(self) -> int:
        return len(self._connections)

    async def start(self) -> None:
        open_files = raise_open_files_limit()
        self.max_connections = min(self.max_connections, max(1, open_files // 4))
        self.path.unlink(missing_ok=True)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        # Create the socket with mode 0600 from the start: no window where others can connect.
        old_umask = os.umask(0o177)
        try:
            sock.bind(str(self.path))
        except OSError:
            sock.close()
            raise
        finally:
            os.umask(old_umask)
        try:
            self._server = await asyncio.start_unix_server(
                self._serve, sock=sock, backlog=ACCEPT_BATCH, limit=MAX_REQUEST_BYTES
            )
        except BaseException:
            sock.close()
            raise
        # asyncio uses one number for the kernel's backlog and its accept batch: listen again
        # for a deep kernel queue while each accept round stays small.
        sock.listen(LISTEN_BACKLOG)

    def fds(self) -> list[int]:
        """The listening sockets' descriptors (a forked child closes its copies)."""
        return [s.fileno() for s in self._server.sockets] if self._server is not None else []

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            for conn in list(self._connections):
                conn.writer.close()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._server.wait_closed(), 2)
        self.path.unlink(missing_ok=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = _ControlConnection(writer)
        try:
            if not self._admit(conn):
                return
            response = await self._answer(reader, conn)
            conn.reading = False  # answered from here on: no longer the one to close for room
            if conn.evicted:  # closed with its busy line while it was still reading
                return
            writer.write(self._encode(response))
            await asyncio.wait_for(writer.drain(), WRITE_DEADLINE_S)
        except (TimeoutError, ConnectionError):
            pass  # the client left or stopped reading: there is nobody to answer
        finally:
            self._connections.pop(conn, None)
            writer.close()

    def _admit(self, conn: _ControlConnection) -> bool:
        """Hold ``conn``, making room by closing the oldest connection still reading its request;
        False (``conn`` closed with a busy line) when every connection held is being answered."""
        if len(self._connections) >= self.max_connections:
            victim = next((c for c in self._connections if c.reading), conn)
            age = time.monotonic() - victim.opened
            self._busy(
                victim,
                f"control socket busy: {len(self._connections)} connections open, the bound is "
                f"{self.max_connections}; this one sent no request in {age:.1f} s and was the oldest idle, "
                "so it was closed; retry, sending the request as soon as you connect"
                if victim is not conn
                else f"control socket busy: all {self.max_connections} connections are being answered; retry shortly",
            )
            if victim is conn:
                return False
            del self._connections[victim]
        self._connections[conn] = None
        return True

    def _busy(self, conn: _ControlConnection, error: str) -> None:
        conn.evicted = True
        conn.writer.write(self._encode({"ok": False, "busy": True, "error": error}))
        conn.writer.close()
        self.evicted += 1
        logger.debug("Control connection closed: %s", error)
        now = time.monotonic()
        if now >= self._next_busy_warning:
            self._next_busy_warning = now + BUSY_WARNING_INTERVAL_S
            logger.warning(
                "Control socket at its bound of %d connections: closing the oldest idle one for each new one "
                "(%d so far); a local process may be opening connections without sending requests",
                self.max_connections,
                self.evicted,
            )

    async def _answer(self, reader: asyncio.StreamReader, conn: _ControlConnection) -> dict[str, Any]:
        try:
            line = await asyncio.wait_for(reader.readuntil(b"\n"), READ_DEADLINE_S)
        except asyncio.LimitOverrunError:
            return self._refuse(
                f"request is over {MAX_REQUEST_BYTES} bytes without its newline; "
                f"send one JSON object of at most {MAX_REQUEST_BYTES} bytes and a newline"
            )
        except TimeoutError:
            return self._refuse(
                f"incomplete request: no newline within the {READ_DEADLINE_S:.0f} s read deadline; "
                "send one JSON object and a newline as soon as you connect"
            )
        except asyncio.IncompleteReadError as e:
            return self._refuse(
                f"incomplete request: the connection closed after {len(e.partial)} bytes without a newline; "
                "end the request with a newline"
            )
        conn.reading = False
        try:
            command, request = parse_request(line, self.commands)
        except ControlError as e:
            return self._refuse(str(e))
        try:
            result = self.handlers[command](request)
            if inspect.isawaitable(result):  # work that talks to peers (gathering checkpoints)
                result = await asyncio.wait_for(result, ASYNC_HANDLER_TIMEOUT_S)
            return {"ok": True, "result": result}
        except Exception as e:
            logger.exception("Control command %s failed", command)
            return {"ok": False, "error": f"{command} failed: {e}"}

    @staticmethod
    def _refuse(error: str) -> dict[str, Any]:
        logger.debug("Control request refused: %s", error)
        return {"ok": False, "error": error}

    @staticmethod
    def _encode(response: dict[str, Any]) -> bytes:
        try:
            data = json.dumps(response).encode() + b"\n"
        except (TypeError, ValueError) as e:  # a handler's bug, not the client's
            logger.exception("Control answer cannot be encoded")
            return json.dumps({"ok": False, "error": f"answer cannot be encoded as JSON: {e}"}).encode() + b"\n"
        if len(data) > MAX_RESPONSE_BYTES:
            error = f"answer is {len(data)} bytes, over {MAX_RESPONSE_BYTES}"
            logger.error("Control %s", error)
            return json.dumps({"ok": False, "error": error}).encode() + b"\n"
        return data


class _Transient(Exception):
    """The daemon could not take this request now (full backlog, busy): worth retrying."""


class _TimedOut(ControlError):
    """The call's deadline fell before the daemon answered."""


def call(path: Path, command: str, timeout: float = 5.0, **args: Any) -> Any:
    """Send one command to the daemon whose control socket is ``path``; return its result.

    ``timeout`` bounds the whole call, retries included: a connect refused for a full listen
    backlog, and a ``busy`` answer, are retried with jittered exponential backoff until then.
    """
    try:
        present = path.exists()  # raises where a folder on the way is closed to this user
    except PermissionError:
        raise ControlError(_no_permission(path)) from None
    if not present:
        raise ControlError(f"no daemon is running with control socket {path}; start one with 'swarmd run'")
    request = json.dumps({"command": command, **args}).encode() + b"\n"
    deadline = time.monotonic() + timeout
    backoff, attempts = RETRY_FIRST_S, 0
    while True:
        attempts += 1
        try:
            response = _exchange(path, request, deadline, timeout)
            break
        except _TimedOut as e:
            if attempts == 1:
                raise
            # Turned away before: the deadline fell in the last try, and busy is what it was.
            raise _busy(path, timeout, attempts, e) from None
        except _Transient as e:
            # Full jitter: clients turned away together do not all come back together.
            pause = random.uniform(0, backoff)
            if time.monotonic() + pause >= deadline:
                raise _busy(path, timeout, attempts, e) from None
            time.sleep(pause)
            backoff = min(2 * backoff, RETRY_MAX_S)
    if not response.get("ok"):
        raise ControlError(f"daemon refused {command}: {response.get('error')}")
    return response.get("result")


def _busy(path: Path, timeout: float, attempts: int, last: Exception) -> ControlError:
    return ControlError(
        f"daemon on {path} stayed busy for {timeout:g} s over {attempts} attempts ({last}); "
        "try again, and look for a local process holding many connections to it"
    )


def _no_permission(path: Path) -> str:
    return f"permission denied on {path}; run as the daemon's user (e.g. sudo -u swarmd swarmd status)"


def _exchange(path: Path, request: bytes, deadline: float, timeout: float) -> dict[str, Any]:
    """One connection: send ``request``, return the answer line as a dict."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        try:
            sock.settimeout(_remaining(deadline))
            try:
                sock.connect(str(path))
            except BlockingIOError:  # with a timeout the socket is non-blocking: a full backlog fails at once
                raise _Transient("its listen backlog is full") from None
            sock.sendall(request)
            data = _read_answer(sock, deadline)
        except PermissionError:
            raise ControlError(_no_permission(path)) from None
        except (ConnectionRefusedError, FileNotFoundError):
            raise ControlError(f"no daemon answers on {path}; it may have stopped (stale socket)") from None
        except (BrokenPipeError, ConnectionResetError):
            raise _Transient("it closed the connection before answering") from None
        except TimeoutError:
            raise _TimedOut(f"daemon did not answer on {path} within {timeout:g} s") from None
    if not data:
        raise ControlError(f"daemon closed the connection on {path} without answering; see its log")
    try:
        response = json.loads(data)
    except ValueError:
        raise ControlError(f"daemon's answer on {path} is not JSON: {data[:200]!r}") from None
    if not isinstance(response, dict):
        raise ControlError(f"daemon's answer on {path} is a JSON {_json_type(response)}, not an object")
    if response.get("busy"):
        raise _Transient(str(response.get("error")))
    return response


def _read_answer(sock: socket.socket, deadline: float) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while not (chunks and chunks[-1].endswith(b"\n")):
        sock.settimeout(_remaining(deadline))
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            # The daemon closed with our request unread (after a size error, or to make room):
            # what it wrote before closing has been read already.
            if chunks:
                break
            raise
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
        if size > MAX_RESPONSE_BYTES:
            raise ControlError(f"daemon's answer is over {MAX_RESPONSE_BYTES} bytes")
    return b"".join(chunks)


def _remaining(deadline: float) -> float:
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise TimeoutError
    return remaining
