"""The four-daemon test's watch over the swarm while it trains: every shard's committed version
at whichever daemons serve it (it must never go down), and whether the placement ever gave the
relay something to carry (``VersionWatch``). On a decrease it tells the shard's story from the
daemons' logs, so that a failure in CI, where only the assertion's message is printed, can be
read."""

from __future__ import annotations

import collections
import re
import threading
import time
from typing import Any

from swarmd.system.local_swarm import LocalDaemon
from tests.integration.sampling import Sampling

STORY_LINES = 40
"""Log lines of a shard's story, per failure: the newest kept (the assertion's message is what CI prints)."""
_STORY = re.compile(
    r"Serving shard|Stopped serving shard|unreplicated|could not (log|copy)|Following plan|lost|"
    r"still serves|newest state here|view lags"
)

NEEDED_SAMPLES = 4
"""Samples (0.5 s apart) a relay-mode daemon's cell must need the relay in a row to count."""


def alive(daemon: LocalDaemon) -> bool:
    return daemon.proc is not None and daemon.proc.poll() is None


def status_of(daemon: LocalDaemon) -> dict[str, Any]:
    try:
        return daemon.status() or {}
    except Exception:  # a daemon frozen, killed or restarting: no status, nothing to read
        return {}


class VersionWatch(Sampling):
    """Samples every shard's committed version at whichever daemons serve it and records any
    decrease: a holder behind the highest version seen, unless it closes while another serves
    the shard (two serve one for a moment while an assignment changes: the one that follows the
    old assignment may be behind and closes, and what it held does not go on);
    and whether the placement ever gave the relay something to carry: a daemon told to relay
    everything (``via_relay``), not the relay itself, holding a cell whose neighbour cell, or a
    shard of whose stage (or the ledger's shard, for stage 0), is held by a third daemon, and
    working there (its micro-batches counted on between two samples: a cell held for a moment
    under the provisional assignment, before the plan moved it, may have sent nothing; and only
    once that daemon's own plan names a relay: before it, every path is direct). (A plan
    may put the relay and the other such daemon in the one pipeline, holding every shard: then
    nothing of theirs crosses a relay.)"""

    def __init__(self, daemons: list[LocalDaemon], via_relay: set[int]) -> None:
        super().__init__(0.5)
        self.daemons = daemons
        self.via_relay = via_relay
        self.highest: dict[tuple[int, int], int] = {}
        self._behind: dict[tuple[int, tuple[int, int]], list[str]] = {}  # (daemon, shard) -> its decreases
        self.events: list[str] = []  # (in the story) what the test did, and when
        self._first_seen: dict[str, str] = {}  # a decrease -> the wall-clock time it was first sampled
        self.served_twice: list[str] = []  # (printed) a shard two daemons served at once, their versions
        self.relay_needed = False
        self._needed_for: dict[tuple[int, int, int], int] = {}  # (daemon, pipeline, stage) -> samples in a row
        self._worked: dict[tuple[int, int, int], int] = {}  # (daemon, pipeline, stage) -> micro-batches
        self._lock = threading.Lock()

    def sample(self) -> None:
        with self._lock:
            statuses = {i: status_of(d) for i, d in enumerate(self.daemons) if alive(d)}
            cells: dict[tuple[int, int], int] = {}
            shards: dict[tuple[int, int], int] = {}
            held: dict[tuple[int, int], dict[int, int]] = {}  # shard -> daemon -> committed version
            relays: set[str] = set()
            working: set[tuple[int, int]] = set()
            for i, status in statuses.items():
                t = status.get("training") or {}
                relays.update(((status.get("routes") or {}).get("relays")) or [])
                cells.update({(c["pipeline"], c["stage"]): i for c in t.get("cells") or []})
                for c in t.get("cells") or []:
                    key, done = (i, c["pipeline"], c["stage"]), c["forwards"] + c["backwards"]
                    if done > self._worked.get(key, done):
                        working.add((c["pipeline"], c["stage"]))
                    self._worked[key] = done
                for shard in t.get("shards") or []:
                    # Committed (logged at the standby): a step its standby refused to log, once
                    # the standby took the shard over, was never seen by a pull and is not lost.
                    key = (shard["stage"], shard["shard"])
                    shards[key] = i
                    held.setdefault(key, {})[i] = shard["committed"]
            self._note_versions(statuses, held)
            relay = {i for i, status in statuses.items() if status.get("peer_id") in relays}
            needed: set[tuple[int, int, int]] = set()
            for (p, s), i in cells.items():
                if i not in self.via_relay or i in relay or (p, s) not in working:
                    continue
                named = set((statuses[i].get("routes") or {}).get("relays") or [])
                if not named:
                    continue  # it has no plan naming a relay yet (the provisional assignment): it goes direct
                if not any(status.get("peer_id") in named for status in statuses.values()):
                    continue  # its relay is down (killed, restarting): unreachable until the repair, not skipped
                peers = {cells.get((p, s - 1)), cells.get((p, s + 1))}
                peers |= {j for (stage, _), j in shards.items() if stage == s}
                peers.add(shards.get((0, 0)) if s == 0 else None)
                if peers - {None, i} - relay:
                    needed.add((i, p, s))
            # Needed in NEEDED_SAMPLES samples in a row: one sample's statuses, read one daemon after
            # another, may pair a cell with a holder that has just handed it over.
            self._needed_for = {key: self._needed_for.get(key, 0) + 1 for key in needed}
            self.relay_needed |= any(n >= NEEDED_SAMPLES for n in self._needed_for.values())

    def _note_versions(self, statuses: dict[int, dict[str, Any]], held: dict[tuple[int, int], dict[int, int]]) -> None:
        for key, holders in held.items():
            highest = max(self.highest.get(key, 0), *holders.values())
            for i, version in holders.items():
                if version < highest:
                    decrease = f"shard {key}: {highest} -> {version} at d{i}"
                    self._behind.setdefault((i, key), []).append(decrease)
                    self._first_seen.setdefault(decrease, time.strftime("%H:%M:%S"))
            self.highest[key] = highest
            if len(holders) > 1:
                self.served_twice.append(f"shard {key}: {holders}")
        for i, key in list(self._behind):
            if i in statuses and i not in held.get(key, {}) and held.get(key):
                del self._behind[(i, key)]  # it closed behind while another serves the shard

    def note(self, event: str) -> None:
        """Something the test did (a kill, a restart), timed for the story."""
        self.events.append(f"{time.strftime('%H:%M:%S')} test: {event}")

    @property
    def decreases(self) -> list[str]:
        """Each decrease once, with the time it was first sampled and how many samples showed it."""
        counted = collections.Counter(d for found in self._behind.values() for d in found)
        return [f"{self._first_seen.get(d, '?')} {d} (x{n})" for d, n in counted.items()]

    def story(self) -> str:
        """The shards that went down, told from every daemon's log (module doc), the test's own
        events among them, in time order; the newest ``STORY_LINES`` lines."""
        keys = {key for _, key in self._behind}
        lines = list(self.events)
        for i, daemon in enumerate(self.daemons):
            try:
                text = daemon.log_path.read_text(errors="replace")
            except OSError:
                continue
            for line in text.splitlines():
                if _STORY.search(line) and ("plan" in line or any(str(key) in line for key in keys)):
                    lines.append(f"{line[:8]} d{i}:{line[8:200]}")
        return "\n".join(sorted(lines)[-STORY_LINES:])
