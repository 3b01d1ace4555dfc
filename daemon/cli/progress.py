"""Progress of a long command on stderr: how far, how long so far, and about how long is left.

On a terminal the line is rewritten in place; elsewhere (a log, CI) a line is printed at most
every ``LINE_EVERY_S`` seconds, so that a long run shows it is alive without flooding. The
estimate is the elapsed time scaled by the fraction left, which holds for work done at an even
pace (a simulation's hours, a plan's search budget).
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO

LINE_EVERY_S = 10.0
TTY_EVERY_S = 0.5


def duration(seconds: float) -> str:
    """``42 s``, ``3 min 05 s``, ``1 h 02 min``."""
    s = int(round(max(0.0, seconds)))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


class ProgressLine:
    def __init__(self, label: str, stream: TextIO | None = None) -> None:
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.started = time.monotonic()
        self._shown_at = self.started
        self._shown = False

    def line(self, fraction: float, now: float | None = None) -> str:
        now = time.monotonic() if now is None else now
        elapsed = now - self.started
        text = f"{self.label}: {100 * fraction:3.0f}%, {duration(elapsed)} so far"
        if 0.0 < fraction < 1.0:
            text += f", about {duration(elapsed * (1.0 - fraction) / fraction)} left"
        return text

    def update(self, fraction: float) -> None:
        """Show ``fraction`` (0 to 1) done, if it is time to."""
        self._show(self.line(fraction))

    @contextmanager
    def waiting(self, at_most_s: float) -> Iterator[None]:
        """Work whose progress cannot be seen from here (another process's): the time so far
        and the most it may take, shown on the usual schedule until the block ends."""
        stop = threading.Event()

        def tick() -> None:
            while not stop.wait(TTY_EVERY_S if self.tty else 1.0):
                elapsed = time.monotonic() - self.started
                left = f", at most {duration(at_most_s - elapsed)} left" if elapsed < at_most_s else ""
                self._show(f"{self.label}: {duration(elapsed)} so far{left}")

        thread = threading.Thread(target=tick, name="progress", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()

    def _show(self, text: str) -> None:
        now = time.monotonic()
        if now - self._shown_at < (TTY_EVERY_S if self.tty else LINE_EVERY_S):
            return
        self._shown_at, self._shown = now, True
        print(text, end="\r" if self.tty else "\n", file=self.stream, flush=True)

    def done(self, what: str = "") -> None:
        """The last line: the whole time taken (clears a rewritten line on a terminal)."""
        text = f"{self.label}: done in {duration(time.monotonic() - self.started)}" + (f"; {what}" if what else "")
        print(("\r\x1b[K" if self.tty and self._shown else "") + text, file=self.stream, flush=True)
