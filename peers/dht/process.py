"""hivemind's DHT process, made safe to talk to: whole requests, pipe writes off the caller's loop.

hivemind's ``DHT`` forks a process and sends it every request (``get``, ``store``,
``run_coroutine``, arguments pickled) down one pipe, written by the caller's thread in
``Connection.send``; answers come back through ``MPFuture``'s own pipe, read by a thread of
the caller's process. ``tests/benchmarks/bench_dht_values.py`` measured what breaks:

- The DHT process watches the pipe with uvloop's ``add_reader``, which makes its read end
  non-blocking. ``Connection.send`` writes a request over 16 KiB as two writes (header, then
  body); when the reader wakes between them, or the body outgrows the 64 KiB pipe, its read
  raises ``BlockingIOError`` mid-message. hivemind logs it and reads on out of step: the next
  read takes body bytes for a header, raises ``EOFError``, and the DHT process dies (from
  16 KiB now and then, from 65 KiB every time). ``_WholeMessages`` makes each read blocking
  for the length of one message once the loop says one has begun, so a request of any size
  arrives whole.
- A dead DHT process left the daemon's own copy of the pipe's read end open, so a write that
  did not fit waited forever, on the event loop's thread: no status, no watchdog, no signal
  handling. Here the caller's copy of the read end is closed once the process runs (a write
  to a dead process fails at once), and every request is written by one thread per process
  (``DhtProcess.call``), never by the loop; the loop awaits the answer with a deadline.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import signal
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

import hivemind

logger = logging.getLogger(__name__)

MAX_REQUEST_BYTES = 64 * 1024
"""The largest value one request may carry into the DHT process. With whole reads the pipe
carries megabytes (the benchmark's figures); this keeps every record the swarm makes far
below both that and p2pd's 4 MiB message limit, which a DHT reply over the network meets."""


class _WholeMessages:
    """The DHT process's end of the request pipe, read one whole message at a time (module doc)."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn

    def fileno(self) -> int:
        return self._conn.fileno()

    def poll(self, timeout: float = 0.0) -> bool:
        return self._conn.poll(timeout)

    def recv(self) -> Any:
        # The loop said a message has begun: wait for the rest of it (the caller writes it
        # without pause), then hand the descriptor back to the loop as it was.
        fd = self._conn.fileno()
        os.set_blocking(fd, True)
        try:
            return self._conn.recv()
        finally:
            os.set_blocking(fd, False)

    def close(self) -> None:
        self._conn.close()


class TiedDHT(hivemind.DHT):
    """hivemind's DHT process, with a hook that runs first in the child (to tie its life to
    ours), whole-message reads of its request pipe, and one writer thread for that pipe."""

    def __init__(self, *args: object, child_init: Callable[[], None] | None, **kwargs: object) -> None:
        self._child_init = child_init
        # Requests are written to the pipe by this thread alone: a write that waits waits here.
        self._writer = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="swarmd-dht-pipe")
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]

    def run(self) -> None:
        # The fork copied the daemon's signal handlers; the daemon alone decides when we stop.
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        # Lead our own process group, which p2pd joins: one killpg ends both.
        os.setpgid(0, 0)
        if self._child_init is not None:
            self._child_init()
        # hivemind's run() reads self._inner_pipe: the wrapper must stand in its place.
        self.__dict__["_inner_pipe"] = _WholeMessages(self.__dict__["_inner_pipe"])
        super().run()

    async def _run_coroutine(self, coro: Callable[..., Any], future: Any) -> None:
        # hivemind's version sets the result on a future the caller may have cancelled already
        # (our deadline on a ping ran out), which raises InvalidStateError and logs a traceback
        # in the DHT process for a routine timeout; its get and store check first, as here.
        try:
            result = await coro(self, self._node)
        except BaseException as e:
            if not future.done():
                future.set_exception(e)
            if not isinstance(e, Exception):
                raise
            logger.debug("a DHT coroutine failed: %r", e)
            return
        if not future.done():
            future.set_result(result)

    def run_in_background(self, await_ready: bool = True, timeout: float | None = None) -> None:
        super().run_in_background(await_ready=await_ready, timeout=timeout)
        # Ours was a copy: with the child the only reader, a write to a dead child fails at
        # once (EPIPE) instead of filling the pipe and waiting forever.
        with contextlib.suppress(OSError):
            self._inner_pipe.close()

    async def call(self, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``method(*args, return_future=True, **kwargs)`` (``get``, ``store``, ``run_coroutine``)
        written by the pipe's thread, its answer awaited on the caller's loop."""
        loop = asyncio.get_running_loop()
        future = await loop.run_in_executor(self._writer, lambda: method(*args, return_future=True, **kwargs))
        return await asyncio.wrap_future(future)

    def close_writer(self) -> None:
        """Let the pipe's thread go (a write it is stuck in fails once the process is dead)."""
        self._writer.shutdown(wait=False, cancel_futures=True)
