"""``swarmd config show | get SECTION.KEY | set SECTION.KEY VALUE | reload``.

``set`` edits the config file in place, line by line, so that the owner's comments and layout
stay: it replaces the key's line inside its ``[section]`` (with its trailing comment), or adds
the key at the end of the section, or adds the section. The whole result is checked as the
daemon would load it before anything is written, and written atomically with the file's mode
kept; then a running daemon is asked to reload, and the answer says whether the change took
effect live (``[limits]``) or needs a restart.

No heavy imports: this runs before the owner's eyes (``tests/unit/cli/test_quick_checks.py``).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import re
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from swarmd.errors import ConfigError, ControlError
from swarmd.models.files import write_atomically

SYSTEM_CONFIG = Path("/etc/swarmd/config.toml")
_HEADER = re.compile(r"^\s*\[\s*([A-Za-z0-9_-]+)\s*\]\s*(#.*)?$")
_KEY = re.compile(r"^(\s*)([A-Za-z0-9_-]+)\s*=")


def add_parser(sub: Any, add_common: Callable[[argparse.ArgumentParser], None]) -> None:
    config = sub.add_parser("config", help="show, get or set a config key; reload the running daemon's config")
    config.add_argument("action", choices=["show", "get", "set", "reload"], help="what to do")
    config.add_argument("key", nargs="?", metavar="SECTION.KEY", help="with get and set: e.g. limits.cpu_share")
    config.add_argument("value", nargs="?", metavar="VALUE", help='with set: a TOML value (0.5, true, "text")')
    add_common(config)


# --- TOML values and the line editor ----------------------------------------------------------


def toml_value(value: Any) -> str:
    """``value`` as TOML writes it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)  # a JSON string is a TOML basic string
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    raise ConfigError(f"cannot write {value!r} ({type(value).__name__}) as a TOML value")


def parse_value(text: str) -> Any:
    """A command line's VALUE: a TOML value, else the text as a string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def _value_extent(lines: list[str], start: int, after_eq: str) -> tuple[int, str]:
    """How many lines the value starting ``after_eq`` on line ``start`` spans, and the comment
    that follows it on its last line ("" if none)."""
    for end in range(start, len(lines)):
        rest = "\n".join([after_eq, *lines[start + 1 : end + 1]])
        last_line = rest.rsplit("\n", 1)[-1]
        prefix = rest[: len(rest) - len(last_line)]
        for cut in [i for i, ch in enumerate(last_line) if ch == "#"] + [len(last_line)]:
            with contextlib.suppress(tomllib.TOMLDecodeError):
                tomllib.loads(f"v = {prefix}{last_line[:cut]}")
                return end - start + 1, last_line[cut:].strip()
    raise ConfigError(f"line {start + 1}: the value after '=' does not parse as TOML; fix the file first")


def set_key(text: str, section: str, key: str, value: Any) -> str:
    """``text`` (a TOML file) with ``[section] key = value``, every other line as it was."""
    lines = text.splitlines()
    entry = f"{key} = {toml_value(value)}"
    header = next((i for i, line in enumerate(lines) if (m := _HEADER.match(line)) and m.group(1) == section), None)
    if header is None:
        while lines and not lines[-1].strip():
            lines.pop()
        return "\n".join([*lines, *([""] if lines else []), f"[{section}]", entry]) + "\n"
    end = next((i for i in range(header + 1, len(lines)) if _HEADER.match(lines[i])), len(lines))
    for i in range(header + 1, end):
        found = _KEY.match(lines[i])
        if found and found.group(2) == key:
            span, comment = _value_extent(lines, i, lines[i][found.end() :])
            lines[i : i + span] = [found.group(1) + entry + (f"  {comment}" if comment else "")]
            return "\n".join(lines) + "\n"
    last = max([i for i in range(header, end) if lines[i].strip() and not lines[i].lstrip().startswith("#")])
    lines.insert(last + 1, entry)
    return "\n".join(lines) + "\n"


def check_text(text: str, source: str) -> Any:
    """The config ``text`` would load as (ConfigError saying what is wrong otherwise)."""
    from swarmd.config import config_from_dict

    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{source} would not be valid TOML: {e}") from None
    return config_from_dict(data, source)


# --- the command ------------------------------------------------------------------------------


def config_path(args: argparse.Namespace) -> Path | None:
    """The file ``swarmd run`` reads: --config, $SWARMD_CONFIG, else a system install's."""
    if args.config:
        return Path(args.config)
    if os.environ.get("SWARMD_CONFIG"):
        return Path(os.environ["SWARMD_CONFIG"])
    return SYSTEM_CONFIG if SYSTEM_CONFIG.exists() else None


def split_key(dotted: str | None, config: Any) -> tuple[str, str]:
    """``SECTION.KEY`` checked against the config's sections and keys."""
    section, _, key = (dotted or "").partition(".")
    sections = [f.name for f in dataclasses.fields(config)]
    if section not in sections:
        raise ConfigError(f"{dotted!r} is not SECTION.KEY with a section of {', '.join(sections)} (limits.cpu_share)")
    keys = [f.name for f in dataclasses.fields(getattr(config, section))]
    if key not in keys:
        raise ConfigError(f"[{section}] has no key {key!r}; its keys: {', '.join(keys)}")
    return section, key


def show(config: Any) -> str:
    out = []
    for f in dataclasses.fields(config):
        out.append(f"[{f.name}]")
        values = getattr(config, f.name)
        out += [f"{k.name} = {toml_value(getattr(values, k.name))}" for k in dataclasses.fields(values)]
        out.append("")
    return "\n".join(out).rstrip() + "\n"


def run(args: argparse.Namespace, control_path: Callable[[argparse.Namespace], Path]) -> int:
    from swarmd.config import load_config

    path = config_path(args)
    if args.action in ("show", "reload") and args.key is not None:
        raise ConfigError(f"'swarmd config {args.action}' takes no SECTION.KEY (got {args.key!r})")
    if args.action == "reload":
        return _reload(args, control_path, None)
    config = load_config(path)
    if args.action == "show":
        print(f"# {path or 'built-in defaults'}, with SWARMD_* variables over it", end="\n\n")
        print(show(config), end="")
        return 0
    section, key = split_key(args.key, config)
    if args.action == "get":
        if args.value is not None:
            raise ConfigError(f"'swarmd config get' takes no VALUE (got {args.value!r}); to change it use 'set'")
        print(toml_value(getattr(getattr(config, section), key)))
        return 0
    if args.value is None:
        raise ConfigError(
            f"'swarmd config set {args.key}' needs a VALUE, e.g. 'swarmd config set limits.cpu_share 0.5'"
        )
    if path is None:
        raise ConfigError("no config file to edit: pass --config FILE (the daemon's) or set SWARMD_CONFIG")
    try:
        text = path.read_text() if path.exists() else ""
    except OSError as e:
        raise ConfigError(f"cannot read {path}: {e.strerror}; run as its owner (e.g. with sudo)") from None
    edited = set_key(text, section, key, parse_value(args.value))
    check_text(edited, f"{path} with {args.key} = {args.value}")
    if edited == text:
        print(f"{path}: [{section}] {key} is {toml_value(parse_value(args.value))} already")
        return 0
    try:
        write_atomically(path, edited)
    except OSError as e:
        raise ConfigError(f"cannot write {path}: {e.strerror}; run as its owner (e.g. with sudo)") from None
    print(f"{path}: [{section}] {key} = {toml_value(parse_value(args.value))}")
    return _reload(args, control_path, f"{section}.{key}")


def _reload(args: argparse.Namespace, control_path: Callable[[argparse.Namespace], Path], changed: str | None) -> int:
    """Ask the running daemon to re-read its config; say what took effect."""
    from swarmd.system.control import call

    try:
        socket = control_path(args)  # reads the config for its state directory
    except ConfigError as e:
        raise ConfigError(f"{e}; the running daemon keeps the config it has") from None
    if not socket.exists():
        if changed is None:
            raise ControlError(f"no daemon is running with control socket {socket}; start one with 'swarmd run'")
        print("no daemon runs here: the change takes effect when it starts")
        return 0
    answer = call(socket, "reload", timeout=30)
    if answer.get("refused"):
        raise ConfigError(f"{answer['refused']}; the running daemon keeps the config it has")
    applied, restart = answer.get("applied", []), answer.get("restart_needed", [])
    for line in applied:
        print(f"applied live: {line}")
    for key in restart:
        print(f"needs a restart: {key} (systemctl restart swarmd, or stop and start 'swarmd run')")
    section, _, key = (changed or "").partition(".")
    if changed is not None and changed not in restart and not any(a.startswith(f"[{section}] {key}:") for a in applied):
        print(f"the daemon saw no change: it may run with another config file than {config_path(args)}")
    elif changed is None and not applied and not restart:
        print("the daemon's config is unchanged")
    return 0
