"""Reliability from what others observed: heartbeats seen or missed, never a peer's word on itself.

**Observing.** Every daemon keeps an ``ObservationBook`` of the other peers of its run. On each
membership scan it adds the time since the previous scan to every peer it knows: to
``watched_s`` always, and to ``up_s`` when the peer was live at that scan. A peer that was live
and is no longer counts one ``departure``. A gap between two scans longer than ``MAX_GAP_S``
(the observer itself was down, suspended or cut off; the daemon uses three scan intervals)
counts for no one: an observer's own
absence must not be held against the others. The book is saved in the state directory and
loaded at start, so an observer keeps what it saw across its own restarts.

**Publishing.** Each observer signs its book's figures as an ``observations`` record in the
DHT (at most ``MAX_SUBJECTS`` peers, the longest watched first).

**Score.** For one observer's figures about a subject::

    availability = (up_s + PRIOR_UP_S) / (watched_s + PRIOR_WATCHED_S)
    mean_session = up_s / (departures + 1)
    score        = availability * (1 - exp(-mean_session / SESSION_SCALE_S))

The prior (1 minute up out of 10) makes a newcomer start low and earn trust by staying; the
session factor keeps a peer that is up most of the time but leaves every few minutes (every
departure costs the swarm a handover) below one that stays for hours. With the constants
below a peer seen up for 10 minutes scores about 0.16, for an hour 0.75, for a day with no
departure 0.99, and one up 95% of an hour but gone ten times 0.13.

**Combining.** The swarm's view of a subject is the median of the scores of the observers
that watched it for at least ``MIN_WATCHED_S``, its own report excluded. A minority of lying
observers cannot move a median past the honest majority's range; with no qualifying observer
the score is 0 (unknown is not trusted). The same observers' median ``up_s`` is the subject's
``observed_up_s``: how long the others have seen it up, which elections use to prefer the
longest-observed members when nobody is yet reliable enough (a fresh key, however many of
them, starts at 0). A heartbeat's own ``uptime_s`` is the peer's word on itself and never counts.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import statistics
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from swarmd.errors import RecordError
from swarmd.peers.records.envelope import Fields
from swarmd.peers.records.signed import Head, SignedRecord

logger = logging.getLogger(__name__)

KIND = "observations"
MAX_OBSERVATIONS_BYTES = 16 * 1024
"""Every per-peer record stays within 16 KiB, far under what one request to the DHT process may carry."""
MAX_SUBJECTS = 192
"""About 13.8 KB signed at most (tests/benchmarks/bench_record_sizes.py)."""
MAX_TTL_S = 900.0
MAX_BOOK_PEERS = 4096
MAX_BOOK_BYTES = 4 * 1024 * 1024
MAX_GAP_S = 120.0
"""By default, a gap between scans longer than this is the observer's own absence: it counts
for no one. The daemon passes three of its scan intervals."""
PRIOR_UP_S = 60.0
PRIOR_WATCHED_S = 600.0
SESSION_SCALE_S = 1800.0
PRIOR_SESSION_S = 1800.0
"""A newcomer's session length until its departures say otherwise (``uptime_estimates``): the
session scale of the score, half an hour, about what a volunteer's machine stays at least."""
MIN_WATCHED_S = 30.0
"""An observer's figures about a subject count once it has watched the subject this long."""
MAX_SECONDS = 1e10
MAX_DEPARTURES = 1_000_000


@dataclass
class Watch:
    """One observer's figures about one subject."""

    watched_s: float = 0.0
    up_s: float = 0.0
    departures: int = 0
    last_live: bool = False
    last_seen: float = 0.0


def score(watched_s: float, up_s: float, departures: int) -> float:
    """The documented score (module doc) of one observer's figures."""
    availability = (up_s + PRIOR_UP_S) / (watched_s + PRIOR_WATCHED_S)
    session = up_s / (departures + 1)
    return max(0.0, min(1.0, availability * (1.0 - math.exp(-session / SESSION_SCALE_S))))


def uptime_estimates(watched_s: float, up_s: float, departures: int) -> tuple[float, float]:
    """(mean uptime h, mean downtime h) as the scenario format wants them: a session is the
    up time per departure, with one ``PRIOR_SESSION_S`` session counted beside the ones observed
    (the current one), a gap the down time per departure.

    The prior is what keeps a young swarm plannable: without it a peer seen up for a minute and
    never gone was taken to leave every minute, so every plan's churn term ate all of its
    throughput, each plan was predicted at 0 tokens/s, and a newcomer never replaced anyone
    (the coordinator found no plan faster than 0). Each departure observed outweighs it soon:
    gone 30 times in an hour up, a peer's session is under three minutes all the same."""
    sessions = departures + 1
    down = max(0.0, watched_s - up_s)
    return (up_s + PRIOR_SESSION_S) / sessions / 3600.0, (down / departures / 3600.0) if departures else 0.0


class ObservationBook:
    def __init__(self, own_peer_id: str, max_gap_s: float = MAX_GAP_S) -> None:
        self.own = own_peer_id
        self.max_gap_s = max_gap_s
        """Scans further apart than this: the observer was away (three scan intervals, say)."""
        self.watches: dict[str, Watch] = {}
        self.last_scan: float | None = None

    def observe(self, now: float, live: Iterable[str]) -> None:
        """A membership scan at ``now`` found ``live`` live (the observer itself is ignored)."""
        live_now = {p for p in live if p != self.own}
        gap = None if self.last_scan is None else now - self.last_scan
        counts = gap is not None and 0 < gap <= self.max_gap_s
        for peer in live_now - set(self.watches):
            self.watches[peer] = Watch()
        for peer, w in self.watches.items():
            is_live = peer in live_now
            if counts and w.last_seen:  # known before this scan: the interval is its to account
                w.watched_s += gap  # type: ignore[operator]
                if is_live and w.last_live:
                    w.up_s += gap  # type: ignore[operator]
            if w.last_live and not is_live:
                w.departures += 1
            if is_live:
                w.last_seen = now
            w.last_live = is_live
        self.last_scan = now
        self._bound()

    def _bound(self) -> None:
        if len(self.watches) > MAX_BOOK_PEERS:
            # the least recently seen go first; among equals, the least watched (a flood of new
            # keys must not push out a peer we have watched for hours)
            keep = sorted(self.watches, key=lambda p: (self.watches[p].last_seen, self.watches[p].watched_s))
            keep = keep[-MAX_BOOK_PEERS:]
            self.watches = {p: self.watches[p] for p in keep}

    # --- persistence --------------------------------------------------------------------------

    def save(self, path: Path) -> None:
        """Write atomically (temporary file, fsync, rename): a crash leaves the old book or the new."""
        data = {
            "version": 1,
            "observer": self.own,
            "peers": {p: [w.watched_s, w.up_s, w.departures, w.last_seen] for p, w in self.watches.items()},
        }
        fd, tmp = tempfile.mkstemp(prefix=".observations.", dir=path.parent)
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(data, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    @classmethod
    def load(cls, path: Path, own_peer_id: str, max_gap_s: float = MAX_GAP_S) -> ObservationBook:
        """The book saved at ``path``; empty (with a warning) when it is missing or damaged. The
        time until the first scan after loading counts for no one (the observer was down)."""
        book = cls(own_peer_id, max_gap_s)
        try:
            if path.stat().st_size > MAX_BOOK_BYTES:
                raise ValueError(f"{path.stat().st_size} bytes, over {MAX_BOOK_BYTES}")
            data = json.loads(path.read_text())
            if not isinstance(data, dict) or data.get("observer") != own_peer_id:
                raise ValueError("not this peer's book")
            peers = data.get("peers")
            if not isinstance(peers, dict):
                raise ValueError("no peers table")
            for peer, row in list(peers.items())[:MAX_BOOK_PEERS]:
                book.watches[_checked_peer(peer)] = _checked_watch(row)
        except FileNotFoundError:
            return book
        except (OSError, ValueError, TypeError, RecursionError) as e:  # deep nesting: RecursionError
            logger.warning("Ignoring the observation book at %s (%s); starting afresh", path, e)
            return cls(own_peer_id, max_gap_s)
        return book

    # --- the record ---------------------------------------------------------------------------

    def to_record(
        self, run_id: str, observer: str, now: float, ttl_s: float, limit: int = MAX_SUBJECTS
    ) -> Observations:
        chosen = sorted(self.watches.items(), key=lambda item: -item[1].watched_s)[: min(limit, MAX_SUBJECTS)]
        peers = {p: (round(w.watched_s, 1), round(min(w.up_s, w.watched_s), 1), w.departures) for p, w in chosen}
        return Observations(
            run_id=run_id, peer_id=observer, issued_at=now, expires_at=now + min(ttl_s, MAX_TTL_S), peers=peers
        )


def _checked_peer(peer: Any) -> str:
    if not isinstance(peer, str) or not 0 < len(peer) <= 128 or not peer.isprintable():
        raise ValueError(f"bad peer id {str(peer)[:40]!r}")
    return peer


def _checked_watch(row: Any) -> Watch:
    if not isinstance(row, list) or len(row) != 4 or not all(_is_number(v) for v in row):
        raise ValueError(f"bad row {str(row)[:60]}")
    watched, up, departures, last_seen = row
    if not 0 <= up <= watched <= MAX_SECONDS or not 0 <= departures <= MAX_DEPARTURES or not 0 <= last_seen <= 1e11:
        raise ValueError(f"figures out of range: {row}")
    return Watch(float(watched), float(up), int(departures), False, float(last_seen))


def _is_number(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


@dataclass(frozen=True, kw_only=True)
class Observations(SignedRecord):
    """One observer's signed figures about the peers it watched; ``peer_id`` is the observer."""

    KIND: ClassVar[str] = KIND
    MAX_BYTES: ClassVar[int] = MAX_OBSERVATIONS_BYTES
    MAX_TTL_S: ClassVar[float] = MAX_TTL_S
    peers: dict[str, tuple[float, float, int]]
    """subject -> (watched s, up s, departures)."""

    @property
    def observer(self) -> str:
        """The peer that watched (the signer, and the DHT subkey)."""
        return self.peer_id

    @classmethod
    def _read_fields(cls, f: Fields, head: Head) -> dict[str, Any]:
        claimed = head.peer_id
        raw_peers = f.obj.get("peers")
        if not isinstance(raw_peers, dict) or len(raw_peers) > MAX_SUBJECTS:
            size = len(raw_peers) if isinstance(raw_peers, dict) else type(raw_peers).__name__
            raise RecordError(
                f"observations of {claimed}: 'peers' must be an object of at most {MAX_SUBJECTS}, got {size}"
            )
        peers = {}
        for subject, value in raw_peers.items():
            if not isinstance(subject, str) or not 0 < len(subject) <= 128 or not subject.isprintable():
                raise RecordError(f"observations of {claimed}: bad subject {str(subject)[:60]!r}")
            if not (isinstance(value, list) and len(value) == 3 and all(_is_number(v) for v in value)):
                raise RecordError(f"observations of {claimed}: {subject[:60]} must be [watched_s, up_s, departures]")
            watched, up, departures = value
            if (
                not 0 <= up <= watched <= MAX_SECONDS
                or departures != int(departures)
                or not 0 <= departures <= MAX_DEPARTURES
            ):
                raise RecordError(f"observations of {claimed}: {subject[:60]} figures out of range: {value}")
            peers[subject] = (float(watched), float(up), int(departures))
        return {"peers": peers}


@dataclass(frozen=True)
class Reliability:
    score: float
    observers: int
    """Observers whose figures counted (watched the subject at least ``MIN_WATCHED_S``)."""
    mean_uptime_h: float | None
    mean_downtime_h: float | None
    observed_up_s: float = 0.0
    """The median over the same observers of how long each saw the subject up (module doc)."""


def swarm_reliability(records: Iterable[Observations], subjects: Iterable[str]) -> dict[str, Reliability]:
    """Each subject's reliability as the median over the observers that watched it long
    enough; its own report about itself is ignored (module doc)."""
    by_subject: dict[str, list[tuple[float, float, int]]] = {}
    for record in records:
        for subject, figures in record.peers.items():
            if subject != record.observer and figures[0] >= MIN_WATCHED_S:
                by_subject.setdefault(subject, []).append(figures)
    out = {}
    for subject in subjects:
        reports = by_subject.get(subject, [])
        if not reports:
            out[subject] = Reliability(0.0, 0, None, None)
            continue
        scores = [score(*r) for r in reports]
        ups, downs = zip(*(uptime_estimates(*r) for r in reports), strict=True)
        out[subject] = Reliability(
            statistics.median(scores),
            len(reports),
            statistics.median(ups),
            statistics.median(downs),
            statistics.median(r[1] for r in reports),
        )
    return out
