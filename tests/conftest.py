"""What every test shares: the root logger as the test found it, one torch thread per worker, and
the order in which two workers take the tests.

Tests that run the CLI in-process (``main([...])``) configure logging to the ``sys.stderr`` of
that moment, which pytest captures and closes after the test; a later test that logs would then
print "--- Logging error --- I/O operation on closed file" with a whole stack. Each test's
changes to the root logger are undone when it ends.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator

import pytest


def pytest_configure(config: pytest.Config) -> None:
    """In a pytest-xdist worker, torch computes on one thread: two workers on two cores, each
    with torch's default of a thread per core, oversubscribe them, and a test that trains in
    the worker (the reference beside a daemon) ran five times slower (31 s alone, 154 s)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        import torch

        torch.set_num_threads(1)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In a pytest-xdist worker (``--dist loadfile``: a file's tests on one worker, so that a
    swarm a module starts once serves its tests), the costliest files first: list scheduling.

    The suite is bound by two cores; with the files taken in name order, the four-daemon test
    once started last and ran alone for three minutes at the end (880 s, against 784 s when it
    started early). A file's budget is what its tests declare (their ``timeout`` marks): summed
    over the tests that start daemons (``integration``), which run for much of theirs; the
    largest one otherwise, since unit tests end far below theirs. ``--no-loadscope-reorder``
    keeps this order."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    default = float(config.getini("timeout") or 0)
    daemons: dict[str, float] = {}
    largest: dict[str, float] = {}
    for item in items:
        mark = item.get_closest_marker("timeout")
        seconds = float(mark.args[0]) if mark and mark.args else default
        file = item.nodeid.split("::")[0]
        largest[file] = max(largest.get(file, 0.0), seconds)
        if item.get_closest_marker("integration"):
            daemons[file] = daemons.get(file, 0.0) + seconds
    budget = {file: daemons.get(file) or most for file, most in largest.items()}
    items.sort(key=lambda item: budget[item.nodeid.split("::")[0]], reverse=True)  # stable: files stay whole


@pytest.fixture(autouse=True)
def root_logger_restored() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in list(root.handlers):
        if handler not in handlers:
            root.removeHandler(handler)
    for handler in handlers:
        if handler not in root.handlers:
            root.addHandler(handler)
    root.setLevel(level)
