"""The order in which the suite's pytest-xdist workers take the test files: the costliest first.

The suite is bound by two cores; with the files taken in name order, the four-daemon test once
started last and ran alone for three minutes at the end (880 s, against 784 s when it started
early). Taking the longest work first (list scheduling) keeps both workers busy to the end. A
file's cost is what its tests declare in their ``timeout`` marks, not a record of past runs that
would go stale: summed over the tests that start daemons, which run for much of theirs; the
largest one otherwise, since unit tests end far below theirs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple


class Declared(NamedTuple):
    """What a collected test says of its cost."""

    file: str
    timeout_s: float
    starts_daemons: bool


def costliest_first(tests: Sequence[Declared]) -> list[int]:
    """Indices of ``tests`` in the order to run them: by their file's budget, largest first; a
    file's tests stay together and in their order, and files of equal budget keep theirs."""
    summed: dict[str, float] = {}
    largest: dict[str, float] = {}
    for test in tests:
        largest[test.file] = max(largest.get(test.file, 0.0), test.timeout_s)
        if test.starts_daemons:
            summed[test.file] = summed.get(test.file, 0.0) + test.timeout_s
    budget = {file: summed.get(file) or most for file, most in largest.items()}
    return sorted(range(len(tests)), key=lambda i: budget[tests[i].file], reverse=True)
