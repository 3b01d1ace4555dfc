"""daemon/system/log_format.py: syslog priorities for journald on every line, JSON lines, and
whether stderr is the journal's stream."""

from __future__ import annotations

import io
import json
import logging
import os
import sys
from pathlib import Path

import pytest

from swarmd.system.log_format import JournalFormatter, JsonFormatter, configure_logging, writes_to_journal

pytestmark = pytest.mark.timeout(10)


def record(level: int, message: str, exc: bool = False) -> logging.LogRecord:
    exc_info = None
    if exc:
        try:
            raise ValueError("boom")
        except ValueError:
            exc_info = sys.exc_info()
    return logging.LogRecord("swarmd.test", level, __file__, 1, message, None, exc_info)


@pytest.mark.parametrize(
    ("level", "priority"),
    [(logging.DEBUG, 7), (logging.INFO, 6), (logging.WARNING, 4), (logging.ERROR, 3), (logging.CRITICAL, 2)],
)
def test_each_level_carries_its_syslog_priority(level: int, priority: int) -> None:
    assert (
        JournalFormatter().format(record(level, "shard (0, 0) served"))
        == f"<{priority}>swarmd.test: shard (0, 0) served"
    )


def test_every_line_of_a_traceback_carries_the_priority() -> None:
    lines = JournalFormatter().format(record(logging.ERROR, "failed", exc=True)).splitlines()
    assert len(lines) > 3 and all(line.startswith("<3>") for line in lines), lines
    assert lines[-1] == "<3>ValueError: boom"


def test_json_lines_parse_and_keep_the_traceback() -> None:
    line = JsonFormatter().format(record(logging.WARNING, "slow peer", exc=True))
    assert "\n" not in line
    entry = json.loads(line)
    assert entry["level"] == "warning" and entry["logger"] == "swarmd.test" and entry["message"] == "slow peer"
    assert entry["traceback"].endswith("ValueError: boom")


def test_the_journal_stream_is_recognised_by_its_device_and_inode(tmp_path: Path) -> None:
    with open(tmp_path / "stream", "w") as stream, open(tmp_path / "other", "w") as other:
        st = os.fstat(stream.fileno())
        env = {"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"}
        assert writes_to_journal(stream, env)
        assert not writes_to_journal(other, env)  # inherited the variable, not the stream
        assert not writes_to_journal(stream, {}) and not writes_to_journal(stream, {"JOURNAL_STREAM": "x"})
        assert not writes_to_journal(io.StringIO(), env)


def test_configure_logging_writes_json_when_asked() -> None:
    out = io.StringIO()
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    try:
        configure_logging("info", "json", out)
        logging.getLogger("swarmd.test").info("cell (0, 1) claimed")
        logging.getLogger("swarmd.test").debug("not shown")
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
    (line,) = out.getvalue().splitlines()
    assert json.loads(line)["message"] == "cell (0, 1) claimed"
