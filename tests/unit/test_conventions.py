"""Conventions every module keeps: one concept per module and class, a plain opening sentence.

The walk over the source tree is ``test_layout``'s.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

from tests.unit.test_layout import ROOT, SKIP_DIRS, TOP, _modules, parse

# --- size: one concept per module and per class ------------------------------------------------

MAX_MODULE_LINES = 500
MAX_CLASS_LINES = 300


def _source_files() -> Iterator[Path]:
    for folder in TOP:
        for path, _ in _modules(folder):
            yield path


def test_no_module_over_500_lines_and_no_class_over_300() -> None:
    found = []
    for path in [*_source_files(), *sorted((ROOT / "tests").rglob("*.py"))]:
        if any(part in SKIP_DIRS for part in path.relative_to(ROOT).parts):
            continue
        text = path.read_text()
        lines = len(text.splitlines())
        if lines > MAX_MODULE_LINES:
            found.append(f"{path.relative_to(ROOT)}: {lines} lines (at most {MAX_MODULE_LINES})")
        for node in ast.walk(parse(text, str(path))):
            if isinstance(node, ast.ClassDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > MAX_CLASS_LINES:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} class {node.name}: {length} lines")
    assert found == [], "split along the concept's seams"


def test_no_two_classes_of_one_name() -> None:
    where: dict[str, list[str]] = {}
    for path in _source_files():
        for node in parse(path.read_text(), str(path)).body:
            if isinstance(node, ast.ClassDef):
                where.setdefault(node.name, []).append(str(path.relative_to(ROOT)))
    assert {name: paths for name, paths in where.items() if len(paths) > 1} == {}


# --- module docstrings: one plain sentence first (STYLE) -------------------------------------

SECOND_SENTENCE = re.compile(r"[.!?] [A-Z]")


def docstring_opening_problem(doc: str | None) -> str | None:
    """What keeps a module docstring from opening with one plain sentence (its first line ends
    with a full stop, holds no second sentence, and a blank line or nothing follows it); None:
    nothing does."""
    if not doc:
        return "no docstring"
    lines = doc.splitlines()
    first = lines[0]
    if not first.endswith("."):
        return f"its first line is no whole sentence: {first!r}"
    if SECOND_SENTENCE.search(first):
        return f"its first line holds a second sentence: {first!r}"
    if len(lines) > 1 and lines[1].strip():
        return f"its first line runs on, with no blank line after it: {first!r}"
    return None


def docstring_opening_offenders(modules: Iterable[tuple[Path, str]]) -> list[str]:
    found = []
    for path, module in modules:
        doc = ast.get_docstring(parse(path.read_text(), str(path)), clean=True)
        if (problem := docstring_opening_problem(doc)) is not None:
            found.append(f"{module}: {problem}")
    return found


def test_module_docstrings_open_with_one_sentence() -> None:
    modules = [m for folder in TOP for m in _modules(folder)]
    assert len(modules) > 100
    assert docstring_opening_offenders(modules) == []


def test_docstring_opening_check_catches_offenders(tmp_path: Path) -> None:
    assert docstring_opening_problem("One plain sentence.") is None
    assert docstring_opening_problem("Who holds what: the cells, e.g. one.\n\nThe spec. More.") is None
    assert docstring_opening_problem(None) == "no docstring"
    assert "no whole sentence" in str(docstring_opening_problem("The cells: who holds\nthem, and when."))
    assert "second sentence" in str(docstring_opening_problem("One sentence. Another one."))
    assert "runs on" in str(docstring_opening_problem("A summary.\nSpecification at once."))
    (tmp_path / "bad.py").write_text('"""The cells: who holds each one,\nand when it moves."""\n')
    (tmp_path / "good.py").write_text('"""The cells.\n\nWho holds each one, and when it moves.\n"""\n')
    modules = [(tmp_path / "bad.py", "swarmd.bad"), (tmp_path / "good.py", "swarmd.good")]
    assert docstring_opening_offenders(modules) == [
        "swarmd.bad: its first line is no whole sentence: 'The cells: who holds each one,'"
    ]
