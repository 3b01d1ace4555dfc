"""The linter and the formatter own the code's layout: ``ruff check`` and ``ruff format`` are
clean; and ``mypy`` finds the source's types consistent (``[tool.mypy]`` in pyproject.toml).

They run here so that the README's one test command (and so CI) checks all three; the
``test`` extra installs ruff and mypy. Fix a failure with ``.venv/bin/ruff format . &&
.venv/bin/ruff check --fix .``, or as ``.venv/bin/python packaging/typecheck.py`` says: it runs
mypy over the folders laid out as the package ``swarmd`` (a tree of symlinks), so that imports
between modules resolve and a class passed where a Protocol is expected is checked against it.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[2]


def _ruff() -> str:
    beside = Path(sys.executable).with_name("ruff")
    found = str(beside) if beside.is_file() else shutil.which("ruff")
    assert found, "ruff is not installed: `pip install -e '.[test]'` (packaging/dev-env.sh does) brings it"
    return found


@pytest.mark.parametrize("command", [["check", "."], ["format", "--check", "."]], ids=["check", "format"])
def test_ruff_is_clean(command: list[str]) -> None:
    done = subprocess.run([_ruff(), *command], cwd=ROOT, capture_output=True, text=True, timeout=100)
    assert done.returncode == 0, f"ruff {' '.join(command)}:\n{done.stdout}{done.stderr}"


def _typecheck() -> ModuleType:
    """packaging/typecheck.py, the command developers run, loaded as a module."""
    assert importlib.util.find_spec("mypy"), "mypy is not installed: `pip install -e '.[test]'` brings it"
    spec = importlib.util.spec_from_file_location("swarmd_typecheck", ROOT / "packaging" / "typecheck.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.timeout(300)
def test_mypy_is_clean() -> None:
    code, report = _typecheck().run_mypy(ROOT, timeout=280)
    assert code == 0, f"mypy (packaging/typecheck.py):\n{report[-6000:]}"


PROTOCOL = """from typing import Protocol


class Sized(Protocol):
    def size(self) -> int: ...


def total(things: list[Sized]) -> int:
    return sum(t.size() for t in things)
"""
USE = """from pkgx.proto import total


class Box:
    def size(self) -> {returns}:
        return {value}


def weigh() -> int:
    return total([Box()])
"""


@pytest.mark.timeout(120)
def test_mypy_checks_a_protocol_across_modules(tmp_path: Path) -> None:
    # The laid-out tree makes `from pkgx.proto import total` resolve, so a class that does not
    # match the protocol another module expects is an error, reported at the checkout's path
    # (extra/use.py, a subpackage folder beside the top one, as peers/ is beside daemon/).
    typecheck = _typecheck()
    (tmp_path / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "__init__.py").write_text("")
    (tmp_path / "src" / "proto.py").write_text(PROTOCOL)
    (tmp_path / "extra").mkdir()
    (tmp_path / "extra" / "__init__.py").write_text("")
    use = tmp_path / "extra" / "use.py"
    layout = dict(package="pkgx", top="src", subpackages={"extra": "extra"}, timeout=100)
    try:
        use.write_text(USE.format(returns="int", value="1"))
        code, report = typecheck.run_mypy(tmp_path, **layout)
        assert code == 0, report
        use.write_text(USE.format(returns="str", value='"1"'))
        code, report = typecheck.run_mypy(tmp_path, **layout)
        assert code == 1, report
        assert re.search(r"^extra/use\.py:\d+: error: .*\"Box\".*\[(arg-type|list-item)\]", report, re.M), report
    finally:
        shutil.rmtree(typecheck.tree_for(tmp_path), ignore_errors=True)


def test_no_hand_layout_fights_the_formatter() -> None:
    # A fmt skip or off comment keeps a hand-packed line from the formatter; the layout is
    # the formatter's, so none are left in the source.
    marker = "# fmt: " + "skip"
    found = [
        f"{path.relative_to(ROOT)}:{n}"
        for folder in ("daemon", "peers", "models", "tests")
        for path in sorted((ROOT / folder).rglob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if marker in line or "# fmt: " + "off" in line
    ]
    assert found == [], f"formatter escapes left: {found}"
