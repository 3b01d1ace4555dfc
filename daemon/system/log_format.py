"""How the daemon's log lines look.

Plain text on a terminal, syslog priorities for journald, or one JSON object a line.

Under systemd, stderr is a stream into the journal and ``$JOURNAL_STREAM`` names it (device
and inode): a line that starts with ``<N>`` is stored at syslog priority N, so that
``journalctl -u swarmd -p warning`` shows the warnings alone. The journal adds the time and
the unit itself. Every line of a multi-line message (a traceback) carries the prefix, or the
journal would store its later lines at the default priority. ``[node] log_format = "json"``
writes one object a line (time, level, logger, message, and the traceback when there is one)
for a log shipper.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from typing import TextIO

FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
PRIORITIES = {logging.DEBUG: 7, logging.INFO: 6, logging.WARNING: 4, logging.ERROR: 3, logging.CRITICAL: 2}
"""Python's levels as syslog priorities (debug, info, warning, err, crit)."""


def syslog_priority(levelno: int) -> int:
    """The syslog priority of a Python level (between two levels: the more urgent's)."""
    return next((p for level, p in sorted(PRIORITIES.items()) if levelno <= level), PRIORITIES[logging.CRITICAL])


class JournalFormatter(logging.Formatter):
    """``<priority>logger: message`` on every line of the record."""

    def __init__(self) -> None:
        super().__init__("%(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        prefix = f"<{syslog_priority(record.levelno)}>"
        return "\n".join(prefix + line for line in super().format(record).splitlines())


class JsonFormatter(logging.Formatter):
    """One JSON object a record, on one line."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["traceback"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


def writes_to_journal(stream: TextIO, environ: dict[str, str] | os._Environ[str] = os.environ) -> bool:
    """Whether ``stream`` is the journal stream systemd gave us (``$JOURNAL_STREAM`` is
    ``device:inode`` of it; a child that inherited the variable but not the stream says no)."""
    found = environ.get("JOURNAL_STREAM", "")
    try:
        device, inode = (int(part) for part in found.split(":"))
        st = os.fstat(stream.fileno())
    except (ValueError, OSError, AttributeError):
        return False
    return (st.st_dev, st.st_ino) == (device, inode)


def formatter_for(log_format: str, stream: TextIO) -> logging.Formatter:
    if log_format == "json":
        return JsonFormatter()
    if writes_to_journal(stream):
        return JournalFormatter()
    return logging.Formatter(TEXT_FORMAT, datefmt="%H:%M:%S")


def configure_logging(level: str, log_format: str = "text", stream: TextIO | None = None) -> None:
    """The root logger at ``level`` ("debug" ... "error"), in ``log_format``, to ``stream`` (stderr)."""
    out = stream if stream is not None else sys.stderr
    handler = logging.StreamHandler(out)
    handler.setFormatter(formatter_for(log_format, out))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(getattr(logging, level.upper()))
    if level != "debug":
        # hivemind logs every bootstrap hiccup at WARNING; our own messages say what matters.
        logging.getLogger("hivemind").setLevel(logging.ERROR)
        for noisy in ("libp2p", "zeroconf", "multiaddr"):
            logging.getLogger(noisy).setLevel(logging.WARNING)
