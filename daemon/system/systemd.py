"""systemd integration: the sd_notify protocol and the watchdog interval, in stdlib only.

The protocol is one datagram of ``KEY=value`` lines to the AF_UNIX socket named by
``$NOTIFY_SOCKET`` (see sd_notify(3)); linking libsystemd for that is not worth a dependency.
Every function is a no-op when systemd does not run us, so callers never need to check.
"""

from __future__ import annotations

import logging
import os
import socket

logger = logging.getLogger(__name__)

# systemd reads at most this many bytes of one notification; a longer STATUS is cut here rather
# than rejected by the manager.
_MAX_STATUS_CHARS = 1024


def _socket_address(name: str) -> str | bytes:
    """The address to send to: '@name' is Linux's abstract namespace, spelled with a NUL byte."""
    if name.startswith("@"):
        return b"\0" + name[1:].encode()
    return name


def sd_notify(state: str) -> bool:
    """Send ``state`` (e.g. ``"READY=1"``) to systemd; True when the datagram went out.

    Returns False without doing anything when ``$NOTIFY_SOCKET`` is unset. A failed send is
    logged at DEBUG and reported as False, never raised: losing a status update must not take
    the daemon down (a missed watchdog ping is systemd's to act on).
    """
    name = os.environ.get("NOTIFY_SOCKET")
    if not name:
        return False
    if not name.startswith(("/", "@")):
        logger.debug("NOTIFY_SOCKET=%r is neither a path nor an abstract name; not notifying", name)
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            # The manager may be stalled; a datagram that cannot go out at once is dropped, not
            # waited for, so that no caller (e.g. the event loop) blocks on systemd.
            sock.setblocking(False)
            sock.sendto(state.encode(), _socket_address(name))
    except OSError as e:
        logger.debug("sd_notify(%r) to %r failed: %s", state, name, e)
        return False
    return True


def _one_line(text: str) -> str:
    # A newline would start a new KEY=value assignment in the datagram.
    return " ".join(text.splitlines())[:_MAX_STATUS_CHARS]


def notify_ready(status: str = "") -> bool:
    """Tell systemd that start-up finished (Type=notify units count as started only now)."""
    if status:
        return sd_notify(f"READY=1\nSTATUS={_one_line(status)}")
    return sd_notify("READY=1")


def notify_stopping() -> bool:
    """Tell systemd that shutdown began, so that it shows "deactivating" and waits."""
    return sd_notify("STOPPING=1")


def notify_watchdog() -> bool:
    """Ping the watchdog; call every :func:`watchdog_interval_s` seconds while healthy."""
    return sd_notify("WATCHDOG=1")


def notify_status(text: str) -> bool:
    """Set the one-line status that ``systemctl status swarmd`` shows."""
    return sd_notify(f"STATUS={_one_line(text)}")


def watchdog_interval_s() -> float | None:
    """Seconds between watchdog pings, or None when no watchdog is set for this process.

    Pings go at half the period systemd gives in ``$WATCHDOG_USEC``, as sd_watchdog_enabled(3)
    advises, so that one late ping does not get the daemon killed. ``$WATCHDOG_PID``, when set,
    names the process the watchdog is meant for; a child that inherited the environment must
    not ping on its parent's behalf.
    """
    usec = os.environ.get("WATCHDOG_USEC")
    if not usec:
        return None
    pid = os.environ.get("WATCHDOG_PID")
    if pid:
        try:
            if int(pid) != os.getpid():
                return None
        except ValueError:
            logger.debug("WATCHDOG_PID=%r is not a number; ignoring the watchdog", pid)
            return None
    try:
        period_us = int(usec)
    except ValueError:
        logger.debug("WATCHDOG_USEC=%r is not a number; ignoring the watchdog", usec)
        return None
    if period_us <= 0:
        return None
    return period_us / 2 / 1_000_000
