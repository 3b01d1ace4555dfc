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

from tests.suite_order import Declared, costliest_first


def pytest_configure(config: pytest.Config) -> None:
    """In a pytest-xdist worker, torch computes on one thread: two workers on two cores, each
    with torch's default of a thread per core, oversubscribe them, and a test that trains in
    the worker (the reference beside a daemon) ran five times slower (31 s alone, 154 s)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        import torch

        torch.set_num_threads(1)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In a pytest-xdist worker, the costliest files first (``tests/suite_order.py``). With
    ``--dist loadfile`` a file's tests run on one worker, so that a swarm a module starts once
    serves them all; ``--no-loadscope-reorder`` keeps this order."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    default = float(config.getini("timeout") or 0)

    def declared(item: pytest.Item) -> Declared:
        mark = item.get_closest_marker("timeout")
        seconds = float(mark.args[0]) if mark and mark.args else default
        return Declared(item.nodeid.split("::")[0], seconds, item.get_closest_marker("integration") is not None)

    order = costliest_first([declared(item) for item in items])
    items[:] = [items[i] for i in order]


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
