"""Tie every child process's life to the daemon's.

When the daemon is SIGKILLed nothing in it runs, so the children must notice by themselves.
The daemon holds the write end of a pipe for its whole life and never writes to it; a child
watches the read end in a thread, and end-of-file means the daemon is gone. The child then
kills its own process group (itself and p2pd, which it spawned) at once. Unlike
PR_SET_PDEATHSIG, this does not fire when merely the thread that forked the child exits, and
it reaches grandchildren.
"""

from __future__ import annotations

import os
import signal
import threading


class LivenessPipe:
    """Created in the daemon before any child is forked; ``watch_in_child`` runs in the child."""

    def __init__(self) -> None:
        self._read_fd, self._write_fd = os.pipe()

    def watch_in_child(self) -> None:
        """Start the watcher; call first thing in a forked child that leads its own process group."""
        os.close(self._write_fd)  # our copy would keep the pipe open forever
        read_fd = self._read_fd

        def watch() -> None:
            while True:
                try:
                    if os.read(read_fd, 1) == b"":
                        break
                except InterruptedError:
                    continue
                except OSError:
                    break
            try:
                # Only a group we lead: the daemon's own group may hold its caller too.
                if os.getpgid(0) == os.getpid():
                    os.killpg(os.getpid(), signal.SIGKILL)
            finally:
                os._exit(1)

        threading.Thread(target=watch, name="swarmd-parent-watch", daemon=True).start()
