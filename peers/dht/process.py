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
  (``TiedDHT.ask``), never by the loop; the loop awaits the answer with a deadline.
- hivemind answers through an ``MPFuture`` pickled into each request: its state byte in shared
  memory and its answer pipe each travel as a file descriptor through ``multiprocessing``'s
  resource sharer, a Unix-socket connection with an HMAC challenge, twice per call (7% of
  the CPU of a four-daemon training test, measured with py-spy). Here every request carries a
  number, and the DHT process writes the tagged outcome to an answer pipe of our own, opened
  before the fork, which one thread of the caller's process reads.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import itertools
import logging
import multiprocessing
import os
import signal
import threading
from collections.abc import Awaitable, Callable
from multiprocessing.connection import Connection
from multiprocessing.reduction import ForkingPickler
from typing import Any

import hivemind
from hivemind.dht.node import DHTNode

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


DhtCoroutine = Callable[[hivemind.DHT, DHTNode], Awaitable[Any]]
"""What runs in the DHT process: a picklable async function of the DHT and its node."""


class TiedDHT(hivemind.DHT):
    """hivemind's DHT process, with a hook that runs first in the child (to tie its life to
    ours), whole-message reads of its request pipe, one writer thread for that pipe, and
    answers tagged by request on a pipe of their own (module doc)."""

    def __init__(self, *args: object, child_init: Callable[[], None] | None, **kwargs: object) -> None:
        self._child_init = child_init
        # Requests are written to the pipe by this thread alone: a write that waits waits here.
        self._writer = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="swarmd-dht-pipe")
        # Opened before the fork (hivemind's __init__ may start the process): the child writes
        # the answers, a thread of ours reads them.
        self._answers_in, self._answers_out = multiprocessing.Pipe(duplex=False)
        self._pending: dict[int, concurrent.futures.Future[Any]] = {}
        self._request_ids = itertools.count()
        self._gone: str | None = None
        """Why no answer can come any more (the process ended), once it is so."""
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]

    def run(self) -> None:
        # The fork copied the daemon's signal handlers; the daemon alone decides when we stop.
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        # Lead our own process group, which p2pd joins: one killpg ends both.
        os.setpgid(0, 0)
        self._answers_in.close()  # the caller's end
        if self._child_init is not None:
            self._child_init()
        # hivemind's run() reads self._inner_pipe: the wrapper must stand in its place.
        self.__dict__["_inner_pipe"] = _WholeMessages(self.__dict__["_inner_pipe"])
        super().run()

    async def _answer_request(self, request_id: int, coro: DhtCoroutine) -> None:
        """In the DHT process: run ``coro`` and write its outcome, tagged, to the answer pipe
        (from this loop's thread only, so one message never interleaves with another)."""
        try:
            outcome: tuple[bool, Any] = (True, await coro(self, self._node))
        except Exception as e:
            outcome = (False, e)
            logger.debug("a DHT coroutine failed: %r", e)
        except BaseException as e:  # the process is stopping: the caller must not read it as its own cancellation
            self._send_answer(request_id, (False, ConnectionResetError(f"the DHT process stopped the call ({e!r})")))
            raise
        self._send_answer(request_id, outcome)

    def _send_answer(self, request_id: int, outcome: tuple[bool, Any]) -> None:
        try:
            message = ForkingPickler.dumps((request_id, *outcome))
            if not outcome[0]:  # an exception class may pickle and not rebuild (required arguments)
                ForkingPickler.loads(message)
        except Exception as e:  # an answer that cannot travel is an error the caller reads
            error = RuntimeError(f"the DHT process could not send its answer ({type(outcome[1]).__name__}): {e}")
            message = ForkingPickler.dumps((request_id, False, error))
        self._answers_out.send_bytes(message)

    def run_in_background(self, await_ready: bool = True, timeout: float | None = None) -> None:
        super().run_in_background(await_ready=await_ready, timeout=timeout)
        # Ours were copies: with the child the only reader of the requests, a write to a dead
        # child fails at once (EPIPE) instead of filling the pipe and waiting forever; with it
        # the only writer of the answers, the reader sees the end of the pipe when it dies.
        with contextlib.suppress(OSError):
            self._inner_pipe.close()
        self._answers_out.close()
        threading.Thread(target=self._read_answers, name="swarmd-dht-answers", daemon=True).start()

    def _read_answers(self) -> None:
        """Hand each answer to the request it is tagged with, until the process ends; then fail
        every request still waiting."""
        try:
            while True:
                message = self._answers_in.recv_bytes()
                try:
                    request_id, ok, value = ForkingPickler.loads(message)
                except Exception as e:  # its caller waits out its deadline; the others are served
                    logger.warning("Dropped an answer of the DHT process that did not unpickle: %r", e)
                    continue
                answer = self._pending.pop(request_id, None)
                if answer is None:  # its caller gave up (a deadline): nobody waits for it
                    continue
                with contextlib.suppress(concurrent.futures.InvalidStateError):  # cancelled just now
                    if ok:
                        answer.set_result(value)
                    else:
                        answer.set_exception(value)
        except (EOFError, OSError) as e:
            self._gone = f"the DHT process ended ({type(e).__name__})"
        for answer in list(self._pending.values()):
            with contextlib.suppress(concurrent.futures.InvalidStateError):
                answer.set_exception(ConnectionResetError(self._gone))
        self._pending.clear()

    async def ask(self, coro: DhtCoroutine) -> Any:
        """``coro(dht, node)`` run in the DHT process (the request written by the pipe's thread),
        its answer awaited on the caller's loop. Raises what ``coro`` raised, or
        ``ConnectionError`` once the process is gone."""
        if self._gone is not None:
            raise ConnectionResetError(self._gone)
        request_id = next(self._request_ids)
        answer: concurrent.futures.Future[Any] = concurrent.futures.Future()
        answer.add_done_callback(lambda _: self._pending.pop(request_id, None))  # a caller that gave up
        self._pending[request_id] = answer
        if self._gone is not None:  # it ended after the check above, and its reader may be done
            answer.cancel()
            raise ConnectionResetError(self._gone)
        request: tuple[str, list[Any], dict[str, Any]] = (
            "_answer_request",
            [],
            {"request_id": request_id, "coro": coro},
        )
        try:
            await asyncio.get_running_loop().run_in_executor(self._writer, self._outer_pipe.send, request)
        except BaseException:
            answer.cancel()
            raise
        return await asyncio.wrap_future(answer)

    def close_writer(self) -> None:
        """Let the pipe's thread go (a write it is stuck in fails once the process is dead)."""
        self._writer.shutdown(wait=False, cancel_futures=True)
