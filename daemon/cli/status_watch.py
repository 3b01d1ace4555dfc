"""The status view of ``swarmd status --watch``, refreshed in place.

``swarmd status --watch``: the status view, refreshed in place on a terminal (rich's Live),
instead of a scrolling log. A daemon that stops answering is said so, and the view keeps asking;
Ctrl-C leaves. Off a terminal each view is printed whole, one after the other."""

from __future__ import annotations

import time
from pathlib import Path

from rich.console import Console
from rich.live import Live
from rich.text import Text

from swarmd.cli.status_view import format_status
from swarmd.errors import ControlError
from swarmd.system.control import call


def render(path: Path) -> Text:
    try:
        view = format_status(call(path, "status"))
    except ControlError as e:
        view = f"{e}\n(asking again)"
    return Text(f"{view}\n\n{time.strftime('%H:%M:%S')}  refreshed; Ctrl-C to leave")


def watch_status(path: Path, interval_s: float, count: int = 0, console: Console | None = None) -> int:
    """Show the status every ``interval_s`` seconds, ``count`` times (0: until Ctrl-C)."""
    console = console or Console()
    shown = 0
    try:
        if not console.is_terminal:
            while not count or shown < count:
                console.print(render(path))
                shown += 1
                if not count or shown < count:
                    time.sleep(interval_s)  # the refresh period the user asked for
            return 0
        with Live(render(path), console=console, auto_refresh=False, screen=False) as live:
            shown = 1
            while not count or shown < count:
                time.sleep(interval_s)  # the refresh period the user asked for
                live.update(render(path), refresh=True)
                shown += 1
    except KeyboardInterrupt:
        pass
    return 0
