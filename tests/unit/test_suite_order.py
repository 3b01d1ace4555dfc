"""tests/suite_order.py: the files' order for the suite's two workers."""

from __future__ import annotations

from tests.suite_order import Declared, costliest_first


def files(tests: list[Declared]) -> list[str]:
    return [tests[i].file for i in costliest_first(tests)]


def test_files_that_start_daemons_count_every_test_and_unit_files_their_longest() -> None:
    tests = [
        Declared("unit_a.py", 120, False),
        Declared("unit_a.py", 240, False),  # a unit file: its longest, 240
        Declared("swarm.py", 240, True),
        Declared("swarm.py", 240, True),  # daemons: 480 in all
        Declared("four.py", 900, True),
        Declared("unit_b.py", 120, False),
        Declared("unit_b.py", 120, False),
        Declared("unit_b.py", 120, False),  # many short unit tests do not add up: 120
    ]
    assert files(tests) == ["four.py", "swarm.py", "swarm.py", "unit_a.py", "unit_a.py", *["unit_b.py"] * 3]


def test_a_files_tests_stay_together_and_in_order_and_ties_keep_file_order() -> None:
    tests = [Declared("a.py", 120, False), Declared("b.py", 120, False), Declared("a.py", 60, False)]
    order = costliest_first(tests)
    assert order == [0, 1, 2]  # equal budgets (120): as collected
    tests = [Declared("a.py", 60, False), Declared("b.py", 300, True), Declared("b.py", 10, True)]
    assert costliest_first(tests) == [1, 2, 0]
