"""The linter and the formatter own the code's layout: ``ruff check`` and ``ruff format`` are
clean; and ``mypy`` finds the source's types consistent (``[tool.mypy]`` in pyproject.toml).

They run here so that the README's one test command (and so CI) checks all three; the
``test`` extra installs ruff and mypy. Fix a failure with ``.venv/bin/ruff format . &&
.venv/bin/ruff check --fix .``, or as ``.venv/bin/python -m mypy daemon peers models`` says.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

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


@pytest.mark.timeout(300)
def test_mypy_is_clean() -> None:
    assert importlib.util.find_spec("mypy"), "mypy is not installed: `pip install -e '.[test]'` brings it"
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "daemon", "peers", "models"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert done.returncode == 0, f"mypy:\n{done.stdout[-4000:]}{done.stderr[-2000:]}"


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
