"""The folder layout (daemon/ -> swarmd, peers/ -> swarmd.peers, models/ -> swarmd.models).

Checks that pyproject.toml lists every package (setuptools silently drops unlisted ones from
wheels), that every package's docstring maps its modules, that tests/unit mirrors the
packages, and that the layering holds: models knows nothing of peers or the daemon, peers
nothing of the daemon except ``swarmd.errors``; inside peers, records -> dht, membership, lan,
taskpool, wire -> planning -> sim; and no module imports itself round a cycle, not even
through imports for annotations only.
"""

from __future__ import annotations

import ast
import tomllib
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(30)

ROOT = Path(__file__).resolve().parents[2]
TOP = {"daemon": "swarmd", "peers": "swarmd.peers", "models": "swarmd.models"}
SKIP_DIRS = {".git", ".venv", "venv", "build", "dist", "__pycache__", "node_modules"}


def parse(source: str, filename: str = "<unknown>") -> ast.Module:
    """``ast.parse``, tried twice: CPython 3.11 can raise a spurious "AST constructor recursion
    depth mismatch" SystemError (python/cpython#106905), which CI met once in this file."""
    try:
        return ast.parse(source, filename)
    except SystemError:
        return ast.parse(source, filename)


def _setuptools() -> dict[str, object]:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    section: dict[str, object] = data["tool"]["setuptools"]
    return section


def _package_folders() -> dict[str, Path]:
    """Every folder with an __init__.py under the three roots, by its import name."""
    found: dict[str, Path] = {}
    for folder, package in TOP.items():
        base = ROOT / folder
        for init in sorted(base.rglob("__init__.py")):
            if any(part in SKIP_DIRS for part in init.relative_to(ROOT).parts):
                continue
            rel = init.parent.relative_to(base).parts
            found[".".join((package, *rel))] = init.parent
    return found


def _resolve_dir(package: str, package_dir: dict[str, str]) -> Path:
    """Where setuptools looks for ``package``: the longest mapped prefix, then the rest as folders."""
    parts = package.split(".")
    for n in range(len(parts), 0, -1):
        prefix = ".".join(parts[:n])
        if prefix in package_dir:
            return ROOT / package_dir[prefix] / Path(*parts[n:])
    return ROOT / Path(*parts)


def test_top_level_folders_are_packages() -> None:
    for folder in TOP:
        assert (ROOT / folder / "__init__.py").is_file(), folder


def test_every_package_folder_is_listed() -> None:
    setuptools = _setuptools()
    listed = setuptools["packages"]
    package_dir = setuptools["package-dir"]
    assert isinstance(listed, list) and isinstance(package_dir, dict)
    for folder, package in TOP.items():
        assert package_dir.get(package) == folder, f"package-dir must map {package!r} to {folder!r}"
    folders = _package_folders()
    missing = sorted(set(folders) - set(listed))
    assert not missing, f"packages in pyproject.toml [tool.setuptools] lacks {missing}"
    for package, folder in folders.items():
        assert _resolve_dir(package, package_dir).resolve() == folder.resolve(), package


def test_every_listed_package_exists() -> None:
    setuptools = _setuptools()
    package_dir = setuptools["package-dir"]
    assert isinstance(package_dir, dict)
    for package in setuptools["packages"]:  # type: ignore[attr-defined]
        folder = _resolve_dir(package, package_dir)
        assert (folder / "__init__.py").is_file(), f"{package} maps to {folder}, which has no __init__.py"


# --- layering -------------------------------------------------------------------------------


def _modules(folder: str) -> Iterator[tuple[Path, str]]:
    """(file, dotted module name) of every .py file under a top-level folder."""
    base = ROOT / folder
    for path in sorted(base.rglob("*.py")):
        if any(part in SKIP_DIRS for part in path.relative_to(ROOT).parts):
            continue
        rel = path.relative_to(base).with_suffix("").parts
        if rel[-1] == "__init__":
            rel = rel[:-1]
        yield path, ".".join((TOP[folder], *rel))


def _daemon_modules() -> set[str]:
    """swarmd.X for every module and subpackage of daemon/ (not the swarmd package itself)."""
    return {name for _, name in _modules("daemon") if name != "swarmd"}


def _imports(path: Path, module: str) -> Iterator[tuple[int, str]]:
    """(line, imported module) pairs; ``from a import b`` yields both a and a.b."""
    is_package = path.name == "__init__.py"
    tree = parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                package = module.split(".") if is_package else module.split(".")[:-1]
                base_parts = package[: len(package) - (node.level - 1)]
                base = ".".join([*base_parts, *([node.module] if node.module else [])])
            else:
                base = node.module or ""
            yield node.lineno, base
            for alias in node.names:
                yield node.lineno, f"{base}.{alias.name}"


def _violations(folder: str, forbidden: set[str]) -> list[str]:
    found = []
    for path, module in _modules(folder):
        for line, name in _imports(path, module):
            if any(name == f or name.startswith(f + ".") for f in forbidden):
                found.append(f"{path.relative_to(ROOT)}:{line} imports {name}")
    return found


def test_daemon_modules_found() -> None:
    daemon = _daemon_modules()
    assert {"swarmd.errors", "swarmd.config", "swarmd.node", "swarmd.node.node"} <= daemon


def test_models_import_neither_peers_nor_daemon() -> None:
    forbidden = (_daemon_modules() - {"swarmd.errors"}) | {"swarmd.peers"}
    assert _violations("models", forbidden) == []


def test_peers_import_no_daemon_module_but_errors() -> None:
    forbidden = _daemon_modules() - {"swarmd.errors"}
    assert _violations("peers", forbidden) == []


def test_layering_check_catches_violations(tmp_path: Path) -> None:
    # The checker itself: each of these forms counts as importing a daemon module.
    daemon = {"swarmd.config", "swarmd.node"}
    source = (
        "import swarmd.config\n"
        "from swarmd import node\n"
        "from swarmd.config import Config\n"
        "from ... import config\n"
        "from swarmd import errors, __version__\n"
    )
    path = tmp_path / "mod.py"
    path.write_text(source)
    hits = sorted(
        (line, name)
        for line, name in _imports(path, "swarmd.peers.sub.mod")
        if any(name == f or name.startswith(f + ".") for f in daemon)
    )
    assert [line for line, _ in hits] == [1, 2, 3, 3, 4]


def test_no_bare_top_level_folder_imports() -> None:
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT)
        if any(part in SKIP_DIRS or part.startswith(".") or part.endswith(".egg-info") for part in rel.parts):
            continue
        tree = parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                if name.split(".")[0] in TOP:
                    found.append(f"{rel}:{node.lineno} imports {name}")
    assert found == [], "import swarmd, swarmd.peers or swarmd.models, not the folder names"


# Inside swarmd.peers, a package may import only packages of a lower layer or its own; the
# packages of one layer may import each other as long as no cycle forms (checked below).
PEERS_LAYERS = {
    "records": 0,
    "dht": 1,
    "membership": 1,
    "lan": 1,
    "taskpool": 1,
    "wire": 1,
    "planning": 2,
    "sim": 3,
}


def _package(module: str, prefix: tuple[str, ...], layers: dict[str, int]) -> str | None:
    """The package of ``layers`` that ``module`` lies in, just under ``prefix``; None: none."""
    parts, n = module.split("."), len(prefix)
    return parts[n] if len(parts) > n and tuple(parts[:n]) == prefix and parts[n] in layers else None


def layer_violations(
    modules: Iterable[tuple[Path, str]],
    prefix: tuple[str, ...],
    layers: dict[str, int],
    imports: Callable[[Path, str], Iterator[tuple[int, str]]],
) -> list[str]:
    """Every import, as ``imports`` reads them, of a package of a higher layer than its own."""
    found = []
    for path, module in modules:
        own = _package(module, prefix, layers)
        if own is None:
            continue
        for line, name in imports(path, module):
            other = _package(name, prefix, layers)
            if other is not None and layers[other] > layers[own]:
                found.append(f"{path.name}:{line} ({own}) imports {name} ({other}, a higher layer)")
    return found


def test_peers_layers() -> None:
    folders = {p.parent.name for p in (ROOT / "peers").glob("*/__init__.py")}
    assert folders == set(PEERS_LAYERS), "every folder of peers/ has a layer here, and only those"
    assert not [p.name for p in (ROOT / "peers").glob("*.py") if p.name != "__init__.py"], (
        "peers/ holds folders only: a module belongs to its concern's folder"
    )
    assert layer_violations(_modules("peers"), ("swarmd", "peers"), PEERS_LAYERS, _runtime_imports) == []


# The daemon's own packages, lowest first: a package imports only lower layers or its own.
# Imports under ``if TYPE_CHECKING:`` count too: an annotation that names a higher layer is the
# same tie in the other direction, only hidden from the interpreter.
DAEMON_LAYERS = {
    "errors": 0,
    "system": 1,
    "config": 2,
    "data": 3,
    "training": 4,
    "web": 5,
    "node": 6,
    "cli": 7,
    "__main__": 8,
}


def test_daemon_layers() -> None:
    packages = {p.name for p in (ROOT / "daemon").iterdir() if (p / "__init__.py").is_file()}
    modules = {p.stem for p in (ROOT / "daemon").glob("*.py") if p.name != "__init__.py"}
    assert packages | modules == set(DAEMON_LAYERS), "every package and module of daemon/ has a layer here"
    assert layer_violations(_modules("daemon"), ("swarmd",), DAEMON_LAYERS, _imports) == []


# Inside ``swarmd.training``: the cell's side and the shard server's side are built from the same
# values (``bookkeeping``'s books, ``run_facts``) and never import each other or the trainer's
# modules, which compose them. Annotations count here too.
TRAINING_LAYERS = {
    "bookkeeping": 0,
    "run_facts": 0,
    "cells": 1,
    "shards": 1,
    "cell_making": 2,
    "held": 2,
    "lifecycle": 2,
    "handlers": 2,
    "evaluation": 2,
    "export": 2,
    "status": 2,
    "trainer": 2,
}
TRAINING_SIDES = ("cells", "shards")


def side_crossings(modules: Iterable[tuple[Path, str]], prefix: tuple[str, ...], sides: tuple[str, ...]) -> list[str]:
    """Every import from one of ``sides`` (packages under ``prefix``) into another of them."""
    found: dict[tuple[str, int], str] = {}  # one per import statement (``from a import b`` names a and a.b)
    for path, module in modules:
        own = _package(module, prefix, dict.fromkeys(sides, 0))
        for line, name in _imports(path, module) if own else ():
            other = _package(name, prefix, dict.fromkeys(sides, 0))
            if other is not None and other != own:
                found.setdefault((module, line), f"{path.name}:{line} ({own}) imports {name} ({other})")
    return list(found.values())


def test_training_sides() -> None:
    folder = ROOT / "daemon" / "training"
    packages = {p.parent.name for p in folder.glob("*/__init__.py")}
    modules = {p.stem for p in folder.glob("*.py") if p.name != "__init__.py"}
    assert packages | modules == set(TRAINING_LAYERS), "every package and module of training/ has a layer here"
    training = [(path, name) for path, name in _modules("daemon") if name.startswith("swarmd.training.")]
    assert layer_violations(training, ("swarmd", "training"), TRAINING_LAYERS, _imports) == []
    assert side_crossings(training, ("swarmd", "training"), TRAINING_SIDES) == []


def test_side_check_finds_a_crossing(tmp_path: Path) -> None:
    module = tmp_path / "puller.py"
    module.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from swarmd.training.shards.reducer import Reducer\n"
    )
    found = side_crossings([(module, "swarmd.training.cells.puller")], ("swarmd", "training"), TRAINING_SIDES)
    assert found == ["puller.py:3 (cells) imports swarmd.training.shards.reducer (shards)"]
    found = side_crossings([(module, "swarmd.training.shards.puller")], ("swarmd", "training"), TRAINING_SIDES)
    assert found == []


def test_daemon_layer_check_counts_annotations_only_imports(tmp_path: Path) -> None:
    source = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from swarmd.node.node import Node\n"
    (tmp_path / "config.py").write_text(source)
    module = [(tmp_path / "config.py", "swarmd.config")]
    assert layer_violations(module, ("swarmd",), DAEMON_LAYERS, _imports) == [
        "config.py:3 (config) imports swarmd.node.node (node, a higher layer)",
        "config.py:3 (config) imports swarmd.node.node.Node (node, a higher layer)",
    ]


def _runtime_imports(path: Path, module: str) -> Iterator[tuple[int, str]]:
    """``_imports`` without those under ``if TYPE_CHECKING:`` (annotations only, never run)."""
    tree = parse(path.read_text(), str(path))
    typing_only = {
        id(node)
        for block in ast.walk(tree)
        if isinstance(block, ast.If) and isinstance(block.test, ast.Name) and block.test.id == "TYPE_CHECKING"
        for statement in block.body
        for node in ast.walk(statement)
    }
    lines = {node.lineno for node in ast.walk(tree) if id(node) in typing_only and hasattr(node, "lineno")}
    for line, name in _imports(path, module):
        if line not in lines:
            yield line, name


def _import_graph() -> dict[str, set[str]]:
    """Module -> the modules it imports, those under ``if TYPE_CHECKING:`` included."""
    modules = {name: path for folder in TOP for path, name in _modules(folder)}
    return {
        name: {other for _, other in _imports(path, name) if other in modules and other != name}
        for name, path in modules.items()
    }


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            step = next(edges, None)
            if step is not None:
                if step not in index:
                    index[step] = low[step] = len(index)
                    stack.append(step)
                    on_stack.add(step)
                    work.append((step, iter(sorted(graph[step]))))
                elif step in on_stack:
                    low[node] = min(low[node], index[step])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_cycle_annotations_included() -> None:
    # An import under ``if TYPE_CHECKING:`` counts: an annotation that names a module's owner
    # ties the two as a run-time import does. A part gets a narrow Protocol (in its own module
    # or a small shared one of records), never a back-import of the module that builds it.
    assert _cycles(_import_graph()) == []


def test_cycle_check_finds_cycles() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"} - {"e"}}
    assert _cycles(graph) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def _mapped_names(package_dir: Path) -> set[str]:
    """The names an ``__init__`` docstring's map lists: each ``- ``name`` `` entry (a folder as ``name/``)."""
    doc = ast.get_docstring(parse((package_dir / "__init__.py").read_text())) or ""
    names = set()
    for line in doc.splitlines():
        stripped = line.strip()
        if stripped.startswith("- ``"):
            names.add(stripped[4:].split("``", 1)[0].rstrip("/"))
    return names


def test_every_package_docstring_maps_its_modules() -> None:
    problems = []
    for package, folder in _package_folders().items():
        modules = {p.stem for p in folder.glob("*.py") if p.stem not in {"__init__", "__main__"}}
        subpackages = {p.parent.name for p in folder.glob("*/__init__.py")}
        mapped = _mapped_names(folder)
        if missing := sorted((modules | subpackages) - mapped):
            problems.append(f"{package}: its __init__ docstring does not map {missing}")
        if stale := sorted(mapped - modules - subpackages):
            problems.append(f"{package}: its __init__ docstring maps {stale}, which it does not hold")
    assert problems == []


def test_unit_tests_mirror_the_packages() -> None:
    packages = set(_package_folders())
    unit = ROOT / "tests" / "unit"
    found = []
    for folder in sorted(p for p in unit.rglob("*") if p.is_dir() and p.name != "__pycache__"):
        parts = folder.relative_to(unit).parts
        package = ".".join(("swarmd", *parts))
        if package not in packages:
            found.append(f"tests/unit/{'/'.join(parts)} mirrors no package ({package})")
    assert found == []
