"""The README and docs/ as a clone sees them: every relative link resolves inside the repository.

A link to ``../shared/...`` worked only in the development checkout; the scenario format and
its examples ship in ``docs/scenarios/``.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(30)

ROOT = Path(__file__).resolve().parents[2]
LINK = re.compile(r"\]\(([^)\s]+)\)")
README_LINES = (100, 160)
"""The README is an entry point: what swarmd is, the two commands, the picture, the CLI, the
service, the layout. Figures live in docs/results.md, mechanisms in docs/architecture.md."""


def _pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _links(page: Path) -> list[str]:
    return [target for target in LINK.findall(page.read_text()) if "://" not in target and not target.startswith("#")]


def test_every_relative_link_resolves_inside_the_repository() -> None:
    broken = []
    for page in _pages():
        for target in _links(page):
            path = (page.parent / target.split("#", 1)[0]).resolve()
            if not path.exists() or ROOT.resolve() not in path.parents:
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert broken == []


def test_link_check_sees_links(tmp_path: Path) -> None:
    page = tmp_path / "p.md"
    page.write_text("[a](docs/x.md) [b](https://example.org) [c](#top) ![d](figures/s.png)")
    assert _links(page) == ["docs/x.md", "figures/s.png"]


def test_readme_opens_with_the_two_commands_and_stays_short() -> None:
    text = (ROOT / "README.md").read_text()
    block = text.split("```sh\n", 1)[1].split("```", 1)[0].splitlines()
    assert block[0].startswith("bash packaging/dev-env.sh && .venv/bin/swarmd demo")
    assert block[1].startswith("bash packaging/dev-env.sh && .venv/bin/python -m pytest")
    low, high = README_LINES
    assert low <= len(text.splitlines()) <= high
