"""The ledger of shares: which data each pipeline trains on, and what must be trained again.

A share is a contiguous range of micro-batch indices (``first``, ``count``); a micro-batch is a
data index (``Dataset.micro_batch``), so a share is recomputed from its numbers alone. The
holder of shard ``(0, 0)`` keeps the ledger; pipelines' stage-0 cells ask it for shares:

- ``issue`` hands out first the shares to be trained again (abandoned by a pipeline that lost
  a cell, or whose lease lapsed), then new ones from the cursor. A share keeps its ID when it
  is issued again, so the shard servers recognise a recompute and never apply it twice.
- ``renew`` keeps a holder's shares open while their round runs and their contribution waits
  to be committed (a round of H shares can take minutes); ``expire`` returns lapsed ones.
- ``complete`` closes a share once its stage-0 contribution is committed at every shard of
  stage 0 (``docs/data-path.md``: stage 0 runs a share's backward last).

Pure bookkeeping: time comes in as ``now``; memory is bounded by the open shares, which the
caller bounds per holder (``issue``'s ``limit``). ``to_metadata`` and ``from_metadata`` carry
the state in the shard's checkpoint: every share open at the checkpoint is issued again after
a failover (its first holder may still finish it; the servers then take one of the two).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass

MAX_METADATA_SHARES = 100_000
OPEN_ROUNDS = 4
"""Rounds of shares one pipeline's stage-0 cell may hold open at the ledger (``open_limit``):
the round it trains and those whose contributions wait to be committed. Under two rounds a
pipeline alone in its run can deadlock: a shard steps once a round's worth of micro-batches is
in, so a round that delivered only part of them (some of its shares were in already, after a
replan) leaves the shard waiting for the next round, which the cell cannot open while the
uncommitted round holds its shares (four daemons replanned from two pipelines to one, held
6 open with H = 4 under the old limit of H + 2, and stood still)."""


def open_limit(local_steps: int) -> int:
    """The most shares one holder may hold open (``issue``'s ``limit``) with rounds of H shares."""
    if local_steps < 1:
        raise ValueError(f"local_steps = {local_steps} must be >= 1")
    return OPEN_ROUNDS * local_steps


class LedgerError(ValueError):
    """A request the ledger refuses: a holder over its limit, or unreadable metadata."""


@dataclass(frozen=True)
class Share:
    share_id: int
    first: int
    """The first micro-batch index."""
    count: int

    @property
    def micro_batches(self) -> range:
        return range(self.first, self.first + self.count)


@dataclass
class _Open:
    share: Share
    holder: str
    expires_at: float


@dataclass
class LedgerCounters:
    issued: int = 0
    reissued: int = 0
    """Issues of a share trained before (abandoned, lapsed, or open at a failover)."""
    completed: int = 0
    abandoned: int = 0
    expired: int = 0


class ShareLedger:
    def __init__(self, share_micro_batches: int, lease_s: float) -> None:
        if share_micro_batches < 1:
            raise ValueError(f"share_micro_batches = {share_micro_batches} must be >= 1")
        if not lease_s > 0:
            raise ValueError(f"lease_s = {lease_s} must be > 0")
        self.share_micro_batches = share_micro_batches
        self.lease_s = lease_s
        self.cursor = 0
        """Every micro-batch below it has been issued at least once."""
        self.next_id = 0
        self._open: dict[int, _Open] = {}
        self._held: Counter[str] = Counter()  # holder -> its open shares (issue checks it per share)
        self._again: dict[int, Share] = {}  # to be issued again, the earliest data first
        self.counters = LedgerCounters()

    # --- requests ---------------------------------------------------------------------------

    def issue(self, holder: str, now: float, limit: int) -> Share:
        """The next share for ``holder``, which may hold at most ``limit`` open at once."""
        held = self._held[holder]
        if held >= limit:
            raise LedgerError(f"{holder[:16]} holds {held} open shares; the limit is {limit}")
        if self._again:  # in data order: a swarm that drops a share trains the batches as one process would
            share = self._again.pop(min(self._again))
            self.counters.reissued += 1
        else:
            share = Share(self.next_id, self.cursor, self.share_micro_batches)
            self.next_id += 1
            self.cursor += share.count
        self.counters.issued += 1
        self._open[share.share_id] = _Open(share, holder, now + self.lease_s)
        self._held[holder] += 1
        return share

    def _close(self, share_id: int) -> _Open | None:
        """Take a share out of the open ones (None if it was not open)."""
        o = self._open.pop(share_id, None)
        if o is not None:
            self._held[o.holder] -= 1
            if not self._held[o.holder]:
                del self._held[o.holder]
        return o

    def renew(self, share_ids: list[int], holder: str, now: float) -> list[int]:
        """Extend ``holder``'s leases on these shares; returns those it still holds."""
        kept = []
        for sid in share_ids:
            o = self._open.get(sid)
            if o is not None and o.holder == holder:
                o.expires_at = now + self.lease_s
                kept.append(sid)
        return kept

    def complete(self, share_ids: list[int]) -> list[int]:
        """Close these shares (committed at stage 0); returns those that were still open or
        waiting to be issued again. Whoever trained a share, it is trained once it is in."""
        done = []
        for sid in share_ids:
            if self._close(sid) is not None or self._again.pop(sid, None) is not None:
                done.append(sid)
        self.counters.completed += len(done)
        return done

    def abandon(self, share_ids: list[int], holder: str) -> list[int]:
        """``holder`` cannot finish these (its pipeline lost a cell): issue them again."""
        gone = []
        for sid in share_ids:
            o = self._open.get(sid)
            if o is not None and o.holder == holder:
                self._close(sid)
                self._again[sid] = o.share
                gone.append(sid)
        self.counters.abandoned += len(gone)
        return gone

    def expire(self, now: float) -> list[Share]:
        """Shares whose lease lapsed (their holder vanished) go to be issued again."""
        lapsed = [o for o in self._open.values() if o.expires_at <= now]
        for o in lapsed:
            self._close(o.share.share_id)
            self._again[o.share.share_id] = o.share
        self.counters.expired += len(lapsed)
        return [o.share for o in lapsed]

    def drop_holder(self, holder: str) -> list[Share]:
        """A holder left the swarm: its shares go to be issued again now, not at expiry."""
        gone = [o for o in self._open.values() if o.holder == holder]
        for o in gone:
            self._close(o.share.share_id)
            self._again[o.share.share_id] = o.share
        self.counters.expired += len(gone)
        return [o.share for o in gone]

    # --- state ------------------------------------------------------------------------------

    def open_shares(self) -> list[tuple[Share, str]]:
        return [(o.share, o.holder) for o in self._open.values()]

    @property
    def waiting(self) -> int:
        """Shares waiting to be issued again."""
        return len(self._again)

    def done_below(self) -> int:
        """Every micro-batch below this index has been trained (none below is open or waiting)."""
        pending = [s.first for s in self._again.values()] + [o.share.first for o in self._open.values()]
        return min(pending, default=self.cursor)

    def to_metadata(self) -> str:
        unfinished = [o.share for o in self._open.values()] + list(self._again.values())
        return json.dumps(
            {
                "cursor": self.cursor,
                "next_id": self.next_id,
                "again": [[s.share_id, s.first, s.count] for s in unfinished],
                "counters": asdict(self.counters),
            },
            separators=(",", ":"),
        )

    @classmethod
    def from_metadata(cls, text: str, share_micro_batches: int, lease_s: float) -> ShareLedger:
        """The ledger a checkpoint holds; every share open then is to be issued again."""
        ledger = cls(share_micro_batches, lease_s)
        try:
            raw = json.loads(text)
            cursor, next_id, again = int(raw["cursor"]), int(raw["next_id"]), raw["again"]
            if cursor < 0 or next_id < 0 or not isinstance(again, list) or len(again) > MAX_METADATA_SHARES:
                raise ValueError("out of range")
            shares = [Share(int(i), int(f), int(c)) for i, f, c in again]
            counters = LedgerCounters(**{k: int(v) for k, v in raw.get("counters", {}).items()})
        except (KeyError, TypeError, ValueError) as e:
            raise LedgerError(f"share ledger metadata is unreadable ({e}); the checkpoint is corrupt") from None
        if any(s.count < 1 or s.first < 0 or s.first + s.count > cursor or s.share_id >= next_id for s in shares):
            raise LedgerError("share ledger metadata names a share beyond its own cursor; the checkpoint is corrupt")
        ledger.cursor, ledger.next_id, ledger.counters = cursor, next_id, counters
        for s in sorted(shares, key=lambda s: s.first):
            ledger._again[s.share_id] = s
        return ledger
