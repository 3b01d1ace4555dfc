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
from typing import Any

import pytest


def pytest_configure(config: pytest.Config) -> None:
    """In a pytest-xdist worker, torch computes on one thread: two workers on two cores, each
    with torch's default of a thread per core, oversubscribe them, and a test that trains in
    the worker (the reference beside a daemon) ran five times slower (31 s alone, 154 s)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        import torch

        torch.set_num_threads(1)


LONGER_SCOPES = ("module", "package", "class")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In a pytest-xdist worker (``--dist loadgroup``), the costliest work first, and a module's
    shared fixture on one worker.

    The suite is bound by two cores; with the long integration tests taken in file order, the
    four-daemon test started last once and ran alone for three minutes at the end (880 s, against
    784 s when it happened to start early). So work units go longest first (list scheduling):
    a unit's budget is its tests' ``timeout`` marks summed, the cost each test declares. Tests
    that start daemons (``integration``) and share a module-scoped fixture (a swarm started once
    for them all) are one unit, so that the swarm starts once, on one worker: pytest-xdist reads
    ``xdist_group`` after this hook. (A unit test's module fixture, a key or a spec, may be made
    once per worker.)"""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    default = float(config.getini("timeout") or 0)
    budget: dict[str, float] = {}
    unit: dict[int, str] = {}
    for item in items:
        name = item.nodeid
        if item.get_closest_marker("integration") and any(d.scope in LONGER_SCOPES for d in _fixture_defs(item)):
            name = item.nodeid.split("::")[0]
            item.add_marker(pytest.mark.xdist_group(name))
        mark = item.get_closest_marker("timeout")
        unit[id(item)] = name
        budget[name] = budget.get(name, 0.0) + (float(mark.args[0]) if mark and mark.args else default)
    items.sort(key=lambda item: budget[unit[id(item)]], reverse=True)  # stable: ties keep file order


def _fixture_defs(item: pytest.Item) -> list[Any]:
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return []
    return [d for defs in info.name2fixturedefs.values() for d in defs]


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
