"""Run mypy over the source as the package ``swarmd``, the way it is imported.

``mypy daemon peers models`` sees three unrelated packages named daemon, peers and models,
and every ``from swarmd... import`` in them resolves to ``Any`` (the editable install is an
import hook mypy cannot follow), so no type crossing a module is checked. This script lays a
tree of symlinks out as the installed package (``swarmd/<each entry of daemon/>``,
``swarmd/peers -> peers/``, ``swarmd/models -> models/``) in a stable folder under the
system's temporary directory, named by a hash of the checkout's path so the incremental cache
(``.mypy_cache`` in the checkout) keeps matching, and runs ``mypy -p swarmd`` on it with the
``[tool.mypy]`` section of pyproject.toml. Error paths are mapped back to the checkout's.

Run from anywhere: ``.venv/bin/python packaging/typecheck.py`` (exit status is mypy's);
tests/unit/test_lint.py runs it too.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Folder -> where it sits inside the package tree; daemon/ is the package itself.
SUBPACKAGES = {"peers": "peers", "models": "models"}
SKIP = {"__pycache__"}


def tree_for(root: Path) -> Path:
    """The stable folder holding ``swarmd/`` for the checkout at ``root``."""
    digest = hashlib.sha256(str(root.resolve()).encode()).hexdigest()[:12]
    return Path(tempfile.gettempdir()) / f"swarmd-mypy-{digest}"


def lay_out(
    root: Path, package: str = "swarmd", top: str = "daemon", subpackages: dict[str, str] | None = None
) -> Path:
    """(Re)build ``<tree>/<package>`` as symlinks into ``root`` and return ``<tree>``."""
    subpackages = SUBPACKAGES if subpackages is None else subpackages
    tree = tree_for(root)
    pkg = tree / package
    if pkg.is_symlink() or pkg.is_file():
        pkg.unlink()
    elif pkg.exists():
        shutil.rmtree(pkg)
    pkg.mkdir(parents=True)
    for entry in sorted((root / top).iterdir()):
        if entry.name in SKIP:
            continue
        (pkg / entry.name).symlink_to(entry.resolve())
    for folder, name in subpackages.items():
        assert not (pkg / name).exists(), f"{top}/{name} clashes with the subpackage {folder}/"
        (pkg / name).symlink_to((root / folder).resolve())
    return tree


def back_to_repo(
    text: str,
    root: Path,
    tree: Path,
    package: str = "swarmd",
    top: str = "daemon",
    subpackages: dict[str, str] | None = None,
) -> str:
    """Rewrite paths inside the symlink tree as paths relative to the checkout."""
    subpackages = SUBPACKAGES if subpackages is None else subpackages
    pkg = str(tree / package)
    names = "|".join(re.escape(name) for name in subpackages.values())
    folder_of = {name: folder for folder, name in subpackages.items()}

    def repl(match: re.Match[str]) -> str:
        sub = match.group(1)
        return f"{folder_of[sub]}/" if sub else f"{top}/"

    pattern = re.escape(pkg) + (rf"/(?:({names})/)?" if names else "/")
    return re.sub(pattern, repl, text)


def run_mypy(
    root: Path = ROOT,
    package: str = "swarmd",
    top: str = "daemon",
    subpackages: dict[str, str] | None = None,
    timeout: float | None = None,
) -> tuple[int, str]:
    """Type-check the checkout at ``root`` as ``package``; (mypy's exit status, its report with
    the checkout's paths)."""
    tree = lay_out(root, package, top, subpackages)
    env = dict(os.environ, MYPYPATH=str(tree))
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(root / "pyproject.toml"), "-p", package],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return done.returncode, back_to_repo(done.stdout + done.stderr, root, tree, package, top, subpackages)


def main() -> int:
    code, report = run_mypy()
    sys.stdout.write(report)
    return code


if __name__ == "__main__":
    sys.exit(main())
