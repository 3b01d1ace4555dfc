"""A background thread that calls a subclass's ``sample`` every interval while a ``with`` block
runs: the tests' watches over running daemons (a swarm's versions, a process's memory)."""

from __future__ import annotations

import threading
from typing import Self


class Sampling:
    """``with Sub(...) as s:``: ``s.sample()`` every ``interval_s`` in a daemon thread until the
    block ends (then joined, within ``join_s``)."""

    def __init__(self, interval_s: float, join_s: float = 10.0) -> None:
        self.interval_s, self.join_s = interval_s, join_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(self.join_s)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()
