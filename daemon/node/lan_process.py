"""LAN discovery in a child process, and the daemon's handle on it.

hivemind 1.1.12 and py-libp2p 0.8.1 both register the protobuf symbol ``crypto.pb.KeyType``,
so the two cannot be imported into one interpreter. The py-libp2p host (mDNS and the hello
protocol, ``swarmd.peers.lan``) therefore runs in a child: ``python -m swarmd.node.lan_process``.

The link is the child's stdin and stdout, one JSON object a line, each bounded:

- daemon -> child: ``{"hello": "<base64 signed heartbeat>"}``, what the child answers hellos with;
- child -> daemon: ``{"ready": [maddrs]}`` once, then ``{"peer": ID, "hello": "<base64>"}`` per hello.

The child's stdin is also its liveness pipe: end-of-file (the daemon stopped, or was killed)
makes it unregister from mDNS and exit. It reads the identity key from the state directory
itself, so the key never crosses a pipe or shows in a process list.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import binascii
import contextlib
import json
import logging
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

from swarmd.errors import SwarmdError

logger = logging.getLogger(__name__)

MAX_LINE_BYTES = 64 * 1024
START_TIMEOUT_S = 30.0


class LanProcessError(SwarmdError):
    """The LAN-discovery child failed to start or broke the protocol."""


def _line(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj).encode() + b"\n"


class LanDiscoveryProcess:
    """The daemon's side: start the child, feed it our heartbeat, hear whom it met."""

    def __init__(self, state_dir: Path, run_id: str, listen_maddr: str, on_hello: Callable[[str, bytes], None]) -> None:
        self.state_dir = state_dir
        self.run_id = run_id
        self.listen_maddr = listen_maddr
        self.on_hello = on_hello
        self.listen_maddrs: list[str] = []
        self._proc: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task[None] | None = None

    async def start(self, timeout: float = START_TIMEOUT_S) -> None:
        self._proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "swarmd.node.lan_process",
            "--state-dir",
            str(self.state_dir),
            "--run-id",
            self.run_id,
            "--listen",
            self.listen_maddr,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            limit=MAX_LINE_BYTES,
        )
        assert self._proc.stdout is not None
        try:
            line = await asyncio.wait_for(self._proc.stdout.readline(), timeout)
        except TimeoutError:
            await self.stop()
            raise LanProcessError(f"LAN discovery did not start within {timeout:.0f} s") from None
        message = self._parse(line)
        if message is None or not isinstance(message.get("ready"), list):
            await self.stop()
            raise LanProcessError(
                f"LAN discovery failed to start on {self.listen_maddr}"
                + (f": {message['error']}" if message and "error" in message else "; see the log above")
            )
        self.listen_maddrs = [str(m) for m in message["ready"]][:16]
        self._reader = asyncio.create_task(self._read())

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.returncode is None

    async def ended(self) -> None:
        """Return once the child has exited (at once if it never started)."""
        if self._reader is not None:
            await asyncio.wait({self._reader})  # the reader ends when the child does

    def set_hello(self, raw: bytes) -> None:
        if self._proc is None or self._proc.stdin is None or self._proc.stdin.is_closing():
            return
        self._proc.stdin.write(_line({"hello": base64.b64encode(raw).decode()}))

    async def stop(self, timeout: float = 5.0) -> None:
        proc = self._proc
        if proc is None:
            return
        if proc.stdin is not None:
            proc.stdin.close()  # end-of-file: the child unregisters and exits
        try:
            await asyncio.wait_for(proc.wait(), timeout)
        except TimeoutError:
            logger.warning("LAN discovery did not stop in %.0f s; killing it", timeout)
            proc.kill()
            await proc.wait()
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader

    @staticmethod
    def _parse(line: bytes) -> dict[str, Any] | None:
        try:
            message = json.loads(line)
        except ValueError:
            return None
        return message if isinstance(message, dict) else None

    async def _read(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        while True:
            try:
                line = await self._proc.stdout.readline()
            except (ValueError, asyncio.LimitOverrunError):
                logger.warning("LAN discovery sent a line over %d bytes; ignoring it", MAX_LINE_BYTES)
                continue
            if not line:
                code = await self._proc.wait()
                if code != 0:
                    logger.warning("LAN discovery exited with %s; continuing without it (the DHT still works)", code)
                return
            # What the child relays came from unauthenticated LAN peers: one bad line is one bad line.
            try:
                message = self._parse(line)
                peer_id, payload = message["peer"], base64.b64decode(message["hello"], validate=True)  # type: ignore[index]
                if isinstance(peer_id, str) and len(peer_id) <= 128:
                    self.on_hello(peer_id, payload)
            except (TypeError, KeyError, binascii.Error, ValueError):
                logger.debug("Ignoring a malformed line from LAN discovery")
            except Exception:
                logger.exception("Handling a LAN hello failed; carrying on")


# --- the child ---------------------------------------------------------------------------


class AnswerFirst:
    """The child's lines to the daemon, the answer to the start (``ready`` or ``error``) first.

    The daemon reads the first line as that answer. A peer may greet us as soon as the host
    listens, before ``ready`` is written: its hello then waits here and follows the answer
    (written first, it made the daemon take the child for broken and run without LAN
    discovery). Events come from the trio thread, the answer from the main thread."""

    def __init__(self, stream: BinaryIO) -> None:
        self._stream = stream
        self._lock = threading.Lock()
        self._early: list[dict[str, Any]] | None = []

    def answer(self, obj: dict[str, Any]) -> None:
        with self._lock:
            early, self._early = self._early or [], None
            self._stream.write(b"".join(_line(o) for o in [obj, *early]))
            self._stream.flush()

    def event(self, obj: dict[str, Any]) -> None:
        with self._lock:
            if self._early is not None:
                self._early.append(obj)
                return
            self._stream.write(_line(obj))
            self._stream.flush()


def _child_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="swarmd.node.lan_process")
    parser.add_argument("--state-dir", type=Path, required=True)
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--listen", required=True)
    args = parser.parse_args(argv)
    # Ctrl-C in a terminal reaches the whole process group; the daemon decides when we stop
    # (by closing our stdin), so a second traceback-printing KeyboardInterrupt must not happen here.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S"
    )
    for noisy in ("libp2p", "zeroconf", "multiaddr"):
        logging.getLogger(noisy).setLevel(logging.WARNING)

    from swarmd.peers.lan.discovery import LanDiscovery
    from swarmd.peers.records.identity import load_or_create_identity

    out = AnswerFirst(sys.stdout.buffer)

    hello = b""

    def on_hello(peer_id: str, payload: bytes) -> None:
        out.event({"peer": peer_id, "hello": base64.b64encode(payload).decode()})

    try:
        identity = load_or_create_identity(args.state_dir)
        lan = LanDiscovery(identity, args.run_id, args.listen, get_hello=lambda: hello, on_hello=on_hello)
        lan.start()
    except Exception as e:  # reported to the daemon, which logs one line and goes on without us
        out.answer({"error": str(e) if isinstance(e, SwarmdError) else f"{type(e).__name__}: {e}"})
        return 1
    out.answer({"ready": lan.listen_maddrs})
    try:
        for line in sys.stdin.buffer:  # ends at end-of-file: the daemon is gone or stopping
            if len(line) > MAX_LINE_BYTES:
                continue
            with contextlib.suppress(ValueError, KeyError, TypeError, binascii.Error):
                hello = base64.b64decode(json.loads(line)["hello"], validate=True)
    finally:
        lan.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(_child_main())
