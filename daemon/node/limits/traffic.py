"""The caps ``[limits]`` sets on the training traffic, and the bytes counted against them.

What ``[limits]`` sets of the training traffic: the caps, today's bytes kept across restarts,
and the daily cap's reason to pause.

The data path paces and counts its bytes through the process's shaper
(``swarmd.peers.wire.shaping.TRAFFIC``), which ``shaping.apply_traffic_limits`` gives the caps
(``swarmd.node.limits.live``, at start and on every reload). The daily cap counts bytes sent and
received per local day, and a restart must not reset it: ``TrafficDay`` keeps today's figure
in the state directory (``traffic-day.json``), read back at start and written at most every
``SAVE_EVERY_S`` and at stop. ``transfer_cap_reason`` is ``swarmd.node.limits.auto_pause``'s reason to
pause once today's bytes reach the cap; the figure starts afresh at local midnight, and the
pause ends with it.
"""

from __future__ import annotations

import json
import logging
from datetime import date
from pathlib import Path
from typing import TYPE_CHECKING

from swarmd.models.files import write_atomically
from swarmd.peers.wire.shaping import GIB, TRAFFIC, TrafficShaper

if TYPE_CHECKING:
    from swarmd.config import LimitsConfig

logger = logging.getLogger(__name__)

DAY_FILENAME = "traffic-day.json"
SAVE_EVERY_S = 30.0
"""At most this much of a day's traffic is forgotten when the daemon dies without stopping."""
MAX_DAY_FILE_BYTES = 4096


def transfer_cap_reason(limits: LimitsConfig, shaper: TrafficShaper | None = None) -> str | None:
    """The reason to pause when today's traffic (``shaper``, None: the process's) has reached
    ``[limits] daily_transfer_gib``, or None."""
    cap_gib = limits.daily_transfer_gib
    if not cap_gib:
        return None
    _, moved = (shaper or TRAFFIC).today()
    if moved < cap_gib * GIB:
        return None
    return (
        f"transfer cap reached: {moved / GIB:.1f} of {cap_gib:g} GiB today; resumes at midnight "
        "([limits] daily_transfer_gib)"
    )


class TrafficDay:
    """Today's bytes in the state directory (module doc)."""

    def __init__(self, state_dir: Path, shaper: TrafficShaper = TRAFFIC) -> None:
        self.path = state_dir / DAY_FILENAME
        self.shaper = shaper
        self.loaded = False
        """Whether the file was read: until then a save would overwrite its figure with a smaller one."""

    def load(self) -> None:
        """Add what an earlier run of the daemon moved today; another day's figure, or a file
        that cannot be read, counts for nothing (said in the log)."""
        try:
            with self.path.open("rb") as f:
                data = f.read(MAX_DAY_FILE_BYTES + 1)
        except FileNotFoundError:
            data = b""
        except OSError as e:
            logger.warning("Cannot read %s (%s); today's transfer counts from 0", self.path, e.strerror)
            data = b""
        self.loaded = True
        if not data:
            return
        try:
            day, moved = _parse_day(data)
        except ValueError as e:
            logger.warning("Ignoring %s: %s; today's transfer counts from 0", self.path, e)
            return
        self.shaper.restore_day(day, moved)

    def save(self) -> None:
        """Write today's date and bytes, replacing the file whole (a crash leaves the old one)."""
        if not self.loaded:
            return
        day, moved = self.shaper.today()
        try:
            write_atomically(self.path, json.dumps({"date": day, "bytes": moved}))
        except OSError as e:
            logger.warning("Cannot write %s (%s); retrying in %.0f s", self.path, e.strerror, SAVE_EVERY_S)

    async def keep(self) -> None:
        """A service round (``swarmd.node.services``): save, every ``SAVE_EVERY_S``."""
        self.save()


def _parse_day(data: bytes) -> tuple[str, int]:
    """``{"date": "YYYY-MM-DD", "bytes": n}`` checked; ValueError naming what is wrong."""
    if len(data) > MAX_DAY_FILE_BYTES:
        raise ValueError(f"larger than {MAX_DAY_FILE_BYTES} bytes")
    try:
        raw = json.loads(data)
    except ValueError:
        raise ValueError("not JSON") from None
    if not isinstance(raw, dict):
        raise ValueError('not an object {"date": ..., "bytes": ...}')
    day, moved = raw.get("date"), raw.get("bytes")
    if not isinstance(day, str):
        raise ValueError(f"date {day!r} is not a string")
    try:
        date.fromisoformat(day)
    except ValueError:
        raise ValueError(f"date {day[:20]!r} is not YYYY-MM-DD") from None
    if type(moved) is not int or moved < 0:
        raise ValueError(f"bytes {moved!r} is not a count of bytes")
    return day, moved
