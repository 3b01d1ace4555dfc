"""A stage host's ledger of gradients: which micro-batches it has applied, and which finishing
leases outlive an epoch change.

When the run's hosting epoch changes (a stage changed hands), every host drops its queue and
stage 0 feeds again from its cursor (``stage_host``). Workers may then hold gradient sums for
*finishing* leases of the old epoch — a backward, or the last stage's forward-with-loss —
whose output has already gone down the pipeline. The stage below may have finished such a
micro-batch since, and stage 0 then never feeds it again: dropping the sum would lose that
micro-batch's gradient at this stage for good. So the host *carries* those leases: a push
that names them, under the epoch they were leased in, is applied after the change. A closing
host writes its carried leases into its last checkpoint, and the peer that takes the stage
over carries them on.

Carrying must not apply a micro-batch twice: one that was in flight at the change may also be
fed again and recomputed. The ledger remembers the micro-batches applied lately; a recomputed
task of one of them runs only for its output (the stage below may still need it), and a push
that would apply one again is refused. A recompute's push that would beat a carried one lately
on its way waits for it instead (the host chooses how long).

Pure bookkeeping: no network, no torch; time comes in as ``now``. What comes from a
checkpoint (another peer's, possibly) is parsed with bounds and types checked.
"""

from __future__ import annotations

import json
import logging
from collections import OrderedDict
from dataclasses import dataclass

logger = logging.getLogger(__name__)

MAX_CARRIED = 1024
"""Carried leases kept at once: more than any queue leases (``4 * max_in_flight``, 16 or more)."""
MAX_APPLIED_KEPT = 4096
"""Recently applied micro-batches remembered: a recompute comes within a few hundred."""
APPLIED_IN_CHECKPOINT = 512
"""Of those, the newest written into a checkpoint (a successor needs only the ones in flight)."""
MAX_METADATA_CHARS = 256 * 1024
MAX_FIELD_CHARS = 128


@dataclass(frozen=True)
class _Carried:
    worker: str
    micro_batch: int
    until: float


class GradientLedger:
    def __init__(self, carry_s: float) -> None:
        if carry_s <= 0:
            raise ValueError(f"carry_s is {carry_s}; it must be > 0 (seconds a carried lease stays pushable)")
        self.carry_s = carry_s
        self._carried: OrderedDict[tuple[str, str], _Carried] = OrderedDict()  # (epoch, lease ID) -> lease
        self._applied: OrderedDict[int, None] = OrderedDict()

    # --- carried leases ---------------------------------------------------------------------

    def carry(self, epoch: str, leases: list[tuple[str, str, int]], now: float) -> None:
        """Keep ``(lease_id, worker, micro_batch)`` finishing leases of ``epoch`` pushable."""
        self._expire(now)
        for lease_id, worker, m in leases:
            self._carried[(epoch, lease_id)] = _Carried(worker, m, now + self.carry_s)
        while len(self._carried) > MAX_CARRIED:
            (old_epoch, lease_id), _ = self._carried.popitem(last=False)
            logger.warning("more than %d leases carried; lease %s of epoch %s is no longer pushable",
                           MAX_CARRIED, lease_id, old_epoch)  # fmt: skip

    def take(self, epoch: str, lease_ids: list[str], worker: str, now: float) -> list[int] | None:
        """The micro-batches of a push of carried leases, which are then no longer carried; None
        (and nothing taken) unless every one is carried, live, and held by ``worker``."""
        self._expire(now)
        keys = [(epoch, lid) for lid in lease_ids]
        found = [self._carried.get(k) for k in keys]
        if not keys or len(set(keys)) != len(keys) or any(c is None or c.worker != worker for c in found):
            return None
        for k in keys:
            del self._carried[k]
        return [c.micro_batch for c in found if c is not None]

    def awaits(self, m: int, now: float, within_s: float, besides: tuple[str | None, list[str]] = (None, [])) -> bool:
        """Whether a lease of micro-batch ``m`` (other than ``besides``: an epoch and lease IDs)
        was carried less than ``within_s`` ago and is still pushable: its gradient is on its
        way, and a recompute of it should not get in first."""
        epoch, own = besides
        return any(c.micro_batch == m and c.until - self.carry_s > now - within_s and c.until > now
                   and not (e == epoch and lid in own) for (e, lid), c in self._carried.items())  # fmt: skip

    def carries(self, epoch: str | None) -> bool:
        """Whether any lease of ``epoch`` is carried (a push under it may be one of them)."""
        return epoch is not None and any(e == epoch for e, _ in self._carried)

    @property
    def carried_count(self) -> int:
        return len(self._carried)

    def _expire(self, now: float) -> None:
        for key in [k for k, c in self._carried.items() if c.until <= now]:
            del self._carried[key]

    # --- applied micro-batches -------------------------------------------------------------

    def note_applied(self, micro_batches: list[int]) -> None:
        for m in micro_batches:
            self._applied[m] = None
            self._applied.move_to_end(m)
        while len(self._applied) > MAX_APPLIED_KEPT:
            self._applied.popitem(last=False)

    def was_applied(self, m: int) -> bool:
        return m in self._applied

    # --- in a checkpoint ---------------------------------------------------------------------

    def to_metadata(self, now: float) -> str:
        self._expire(now)
        carried = [[e, lid, c.worker, c.micro_batch] for (e, lid), c in self._carried.items()]
        applied = list(self._applied)[-APPLIED_IN_CHECKPOINT:]
        return json.dumps({"carried": carried, "applied": applied}, separators=(",", ":"))

    def load_metadata(self, text: str, now: float) -> None:
        """Take over a previous host's ledger; one that is malformed is ignored, with a warning
        (carrying is an optimisation against loss, never a reason not to host)."""
        try:
            carried, applied = _parse(text)
        except ValueError as e:
            logger.warning("ignoring the gradient ledger in the checkpoint: %s", e)
            return
        for epoch, lease_id, worker, m in carried:
            self.carry(epoch, [(lease_id, worker, m)], now)
        self.note_applied(applied)


def _parse(text: str) -> tuple[list[tuple[str, str, str, int]], list[int]]:
    if len(text) > MAX_METADATA_CHARS:
        raise ValueError(f"it is {len(text)} characters; at most {MAX_METADATA_CHARS}")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"not JSON ({e.msg})") from None
    except RecursionError:
        raise ValueError("nested too deeply") from None
    if (
        not isinstance(data, dict)
        or not isinstance(data.get("carried"), list)
        or not isinstance(data.get("applied"), list)
    ):
        raise ValueError("expected an object with lists 'carried' and 'applied'")
    carried, applied = data["carried"], data["applied"]
    if len(carried) > MAX_CARRIED or len(applied) > MAX_APPLIED_KEPT:
        raise ValueError(f"{len(carried)} carried and {len(applied)} applied; at most {MAX_CARRIED} and "
                         f"{MAX_APPLIED_KEPT}")  # fmt: skip
    out: list[tuple[str, str, str, int]] = []
    for entry in carried:
        if not (isinstance(entry, list) and len(entry) == 4 and all(_short_text(x) for x in entry[:3])
                and _micro_batch(entry[3])):  # fmt: skip
            raise ValueError(f"a carried lease is {str(entry)[:80]!r}; expected [epoch, lease ID, worker, micro-batch]")
        out.append((entry[0], entry[1], entry[2], entry[3]))
    if not all(_micro_batch(m) for m in applied):
        raise ValueError("'applied' must hold non-negative integers")
    return out, applied


def _short_text(x: object) -> bool:
    return isinstance(x, str) and 0 < len(x) <= MAX_FIELD_CHARS


def _micro_batch(x: object) -> bool:
    return type(x) is int and x >= 0
