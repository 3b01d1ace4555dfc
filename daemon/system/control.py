"""The local control API: a Unix socket (mode 0600) in the state directory.

One request per connection: a JSON object on one line, answered by one JSON line. Only the
daemon's owner can connect (the socket's mode and the state directory's), and requests are
size-bounded anyway. Handlers only read state the node keeps up to date, so an answer never
waits on the network or on compute: ``swarmd status`` answers within a second while busy.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import logging
import os
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from swarmd.errors import ControlError

logger = logging.getLogger(__name__)

SOCKET_FILENAME = "control.sock"
MAX_REQUEST_BYTES = 4096
MAX_RESPONSE_BYTES = 4 * 1024 * 1024
# The kernel limits sun_path to 108 bytes.
MAX_SOCKET_PATH = 107

Handler = Callable[[dict[str, Any]], dict[str, Any] | Awaitable[dict[str, Any]]]
ASYNC_HANDLER_TIMEOUT_S = 120.0


class ControlServer:
    def __init__(self, path: Path, handlers: dict[str, Handler]) -> None:
        if len(str(path)) > MAX_SOCKET_PATH:
            raise ControlError(
                f"control socket path {path} is {len(str(path))} bytes, over the kernel's {MAX_SOCKET_PATH}; "
                "use a shorter state_dir"
            )
        self.path = path
        self.handlers = handlers
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self.path.unlink(missing_ok=True)
        # Create the socket with mode 0600 from the start: no window where others can connect.
        old_umask = os.umask(0o177)
        try:
            self._server = await asyncio.start_unix_server(self._serve, path=str(self.path), limit=MAX_REQUEST_BYTES)
        finally:
            os.umask(old_umask)

    def fds(self) -> list[int]:
        """The listening sockets' descriptors (a forked child closes its copies)."""
        return [s.fileno() for s in self._server.sockets] if self._server is not None else []

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._server.wait_closed(), 2)
        self.path.unlink(missing_ok=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            response = await self._answer(reader)
            writer.write(json.dumps(response).encode() + b"\n")
            await asyncio.wait_for(writer.drain(), 5)
        except (TimeoutError, ConnectionError):
            pass
        finally:
            writer.close()

    async def _answer(self, reader: asyncio.StreamReader) -> dict[str, Any]:
        try:
            line = await asyncio.wait_for(reader.readuntil(b"\n"), 5)
        except asyncio.LimitOverrunError:
            return {"ok": False, "error": f"request over {MAX_REQUEST_BYTES} bytes"}
        except (TimeoutError, asyncio.IncompleteReadError):
            return {"ok": False, "error": "incomplete request"}
        if len(line) > MAX_REQUEST_BYTES:
            return {"ok": False, "error": f"request is {len(line)} bytes, over {MAX_REQUEST_BYTES}"}
        try:
            request = json.loads(line)
        except json.JSONDecodeError:
            return {"ok": False, "error": "request is not JSON"}
        command = request.get("command") if isinstance(request, dict) else None
        handler = self.handlers.get(command) if isinstance(command, str) else None
        if handler is None:
            return {
                "ok": False,
                "error": f"unknown command {str(command)[:40]!r}; known: {sorted(self.handlers)}",
            }
        try:
            result = handler(request)
            if inspect.isawaitable(result):  # work that talks to peers (gathering checkpoints)
                result = await asyncio.wait_for(result, ASYNC_HANDLER_TIMEOUT_S)
            return {"ok": True, "result": result}
        except Exception as e:
            logger.exception("Control command %s failed", command)
            return {"ok": False, "error": f"{command} failed: {e}"}


def call(path: Path, command: str, timeout: float = 5.0, **args: Any) -> Any:
    """Send one command to the daemon whose control socket is ``path``; return its result."""
    if not path.exists():
        raise ControlError(f"no daemon is running with control socket {path}; start one with 'swarmd run'")
    request = json.dumps({"command": command, **args}).encode() + b"\n"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        try:
            sock.connect(str(path))
            sock.sendall(request)
            chunks: list[bytes] = []
            size = 0
            while not (chunks and chunks[-1].endswith(b"\n")):
                chunk = sock.recv(65536)
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
                if size > MAX_RESPONSE_BYTES:
                    raise ControlError(f"daemon's answer is over {MAX_RESPONSE_BYTES} bytes")
        except PermissionError:
            raise ControlError(f"permission denied on {path}; run as the daemon's user (e.g. sudo -u swarmd)") from None
        except (ConnectionRefusedError, FileNotFoundError):
            raise ControlError(f"no daemon answers on {path}; it may have stopped (stale socket)") from None
        except TimeoutError:
            raise ControlError(f"daemon did not answer on {path} within {timeout:.0f} s") from None
    try:
        response = json.loads(b"".join(chunks))
    except json.JSONDecodeError:
        raise ControlError(f"daemon's answer on {path} is not JSON") from None
    if not isinstance(response, dict) or not response.get("ok"):
        raise ControlError(
            f"daemon refused {command}: {response.get('error') if isinstance(response, dict) else response}"
        )
    return response.get("result")
