"""``swarmd demo``, the README's first command: a local swarm that trains, shown, then stopped
cleanly by Ctrl-C; and its daemons die with it when it is killed."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from swarmd.system.local_swarm import wait_for
from tests.integration.procfs import descendants, processes

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


class Demo:
    """``swarmd demo`` as a user starts it, its output read as it comes."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "swarmd", "demo", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            # As a terminal starts it: Ctrl-C not ignored, even when the suite's own runner
            # inherited it ignored (a background job of a shell without job control).
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)

    @property
    def out(self) -> str:
        return "".join(self.lines)

    def daemons(self) -> set[int]:
        """The daemons it started (``python -m swarmd run``), with none of their own children."""
        procs = processes()
        return {p for p in descendants(self.proc.pid, procs) if procs[p][0] == self.proc.pid}

    def finish(self, timeout: float) -> tuple[int, str]:
        try:
            returncode = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:  # what it was doing, for the failure's message
            spy = Path(sys.executable).with_name("py-spy")  # where the dev extras are installed
            stack = ""
            if spy.exists():
                dump = [spy, "dump", "--pid", str(self.proc.pid)]
                stack = subprocess.run(dump, capture_output=True, text=True, timeout=30).stdout
            ended = f"not ended {timeout:.0f} s on; its output ends:\n{self.out[-3000:]}"
            raise AssertionError(f"{ended}\n{stack}") from None
        self._reader.join(10)
        assert self.proc.stderr is not None
        return returncode, self.proc.stderr.read()


@contextmanager
def demo(*args: str) -> Iterator[Demo]:
    d = Demo(*args)
    try:
        yield d
    finally:
        if d.proc.poll() is None:
            d.proc.kill()
            d.proc.wait(30)
        state = re.search(r"state and logs in (\S+)\)", d.out)
        if state:
            shutil.rmtree(state.group(1), ignore_errors=True)


def gone(pids: set[int]) -> bool:
    return not (pids & set(processes()))


def test_demo_trains_with_two_daemons_and_ctrl_c_stops_them_cleanly() -> None:
    with demo("--peers", "2") as d:
        updates = lambda: [int(m) for m in re.findall(r"update\s+(\d+)\s+loss", d.out)]  # noqa: E731
        planned = re.compile(r"plan v\d+ \((full|repair)\) by d\d: 1 pipeline\(s\) x 2 stages")

        def trained_under_a_plan() -> bool:
            return len(updates()) >= 2 and updates()[-1] > updates()[0] and bool(planned.search(d.out))

        wait_for(trained_under_a_plan, 240, "the demo to train under its coordinator's plan", 0.5)
        daemons = d.daemons()
        started = time.monotonic()
        d.proc.send_signal(signal.SIGINT)  # Ctrl-C, as the terminal sends it to the demo alone
        returncode, err = d.finish(60)
        print(f"\nCtrl-C to exit: {time.monotonic() - started:.1f} s")
        out = d.out
    assert returncode == 0, out[-3000:] + err[-3000:]
    assert len(daemons) == 2 and gone(daemons)
    # Each daemon works a cell of the pipeline (the plan puts 2 stages on 2 peers).
    for daemon in ("d0", "d1"):
        assert re.search(daemon + r": cell \(0, \d\) \d+ shares", out), out[-3000:]
    assert "stopping 2 daemon(s)" in out
    assert "stopped 2 daemons, exit codes [0, 0]" in out  # stopped in time: never killed
    assert "gathered every stage's weights from the shards" in out and "swarmd export --run-id" in out
    assert "Traceback" not in err


def test_the_demos_daemons_die_with_it_when_it_is_killed() -> None:
    # One daemon: each is tied to the demo alike (PR_SET_PDEATHSIG), and a second one's fresh
    # interpreter would cost as much again.
    with demo("--peers", "1") as d:
        wait_for(lambda: re.search(r"^d0 \S+ listening on ", d.out, re.M), 120, "the daemon to run", 0.2)
        daemons = d.daemons()
        assert len(daemons) == 1, d.out
        os.kill(d.proc.pid, signal.SIGKILL)  # no Ctrl-C, no cleanup: a closed terminal, a kill
        d.proc.wait(10)
        # The kernel sends each SIGTERM (PR_SET_PDEATHSIG); they stop as they would for systemd.
        wait_for(lambda: gone(daemons), 60, "the daemons to exit after the demo was killed", 0.2)
