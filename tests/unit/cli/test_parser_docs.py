"""daemon/cli/parser_docs.py: the bash completion and the man page follow the parser."""

from __future__ import annotations

import datetime
import shutil
import subprocess

import pytest

from swarmd.cli.main import build_parser
from swarmd.cli.parser_docs import bash_completion, man_page

pytestmark = pytest.mark.timeout(30)


def complete(script: str, *words: str) -> list[str]:
    """What bash offers after ``words`` (the last one being typed), through the script's function."""
    line = " ".join(words)
    program = (
        f"{script}\nCOMP_WORDS=({line}); COMP_CWORD={len(words) - 1}\n"
        '_swarmd_complete; printf "%s\\n" "${COMPREPLY[@]}"'
    )
    out = subprocess.run(["bash", "-c", program], capture_output=True, text=True, timeout=20)
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash here")
def test_bash_completes_commands_flags_and_choices() -> None:
    script = bash_completion(build_parser())
    assert complete(script, "swarmd", "ru") == ["run"]
    assert "--run-id" in complete(script, "swarmd", "run", "--ru") and "create" in complete(script, "swarmd", "run", "")
    assert complete(script, "swarmd", "run", "--data-via-relay", "al") == ["always"]
    assert complete(script, "swarmd", "export", "--over") == ["--overwrite"]


def test_the_man_page_names_every_command_and_flag() -> None:
    parser = build_parser()
    page = man_page(parser, datetime.date(2026, 12, 3))
    assert page.startswith('.TH SWARMD 1 "2026-12-03"')
    for command in ("run", "status", "export", "demo", "simulate", "completion"):
        assert f".SS swarmd {command}" in page
    for flag in ("\\-\\-run\\-id", "\\-\\-data\\-via\\-relay", "\\-\\-time\\-budget"):
        assert flag in page, flag
    assert ".SH EXIT STATUS" in page
    if shutil.which("groff"):  # it renders without warnings
        out = subprocess.run(["groff", "-man", "-Tutf8", "-ww"], input=page, capture_output=True, text=True, timeout=20)
        assert out.returncode == 0 and not out.stderr, out.stderr
