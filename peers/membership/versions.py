"""Whether the swarm runs a newer swarmd than this peer.

Told in ``swarmd status``, ``swarmd peers`` and the unit's STATUS line, so that a volunteer
knows to upgrade.

A version is the leading numbers of its text (``0.2.0``, ``0.2.0rc1`` as ``0.2.0``); a
heartbeat's version that does not start with a number is left out. It is each peer's word on
itself, so it only ever makes a warning, never a decision.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

_LEADING = re.compile(r"(\d+(?:\.\d+)*)")


def parse_version(text: str) -> tuple[int, ...] | None:
    found = _LEADING.match(text or "")
    return tuple(int(part) for part in found.group(1).split(".")) if found else None


@dataclass(frozen=True)
class NewerVersion:
    newest: str
    """The newest version a peer runs."""
    peers: int
    """How many peers run a version newer than ours."""
    of: int
    """How many peers said a version."""

    def warning(self, own: str) -> str:
        return f"{self.peers} of {self.of} peer(s) run a newer swarmd (up to {self.newest}; this is {own}): upgrade"


def newer_in_swarm(own: str, versions: Iterable[str]) -> NewerVersion | None:
    """The newer versions among ``versions`` (one per peer), None when no peer runs one."""
    mine = parse_version(own)
    parsed = [(v, parse_version(v)) for v in versions]
    known = [(text, number) for text, number in parsed if number is not None]
    if mine is None or not known:
        return None
    newer = [(number, text) for text, number in known if number > mine]
    if not newer:
        return None
    return NewerVersion(newest=max(newer)[1], peers=len(newer), of=len(known))
