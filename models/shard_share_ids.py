"""Which share IDs a shard has taken, so that a share counts once however often it is sent.

A recompute after a failure sends a share again under the same ID. An ID is *buffered* while
its contribution waits for the step, *settled* when it is acknowledged without being applied
(a contribution dropped as too stale), and *done* from then on, with the version that
settled it: an applied share is done at the step that took it, so a pull sees it as committed
only once that version is. Settled and applied IDs travel with the next step to the standby's
log, so that a replica knows them all. Only the most recent ``recent_share_ids`` done IDs are
remembered, the least recently settled forgotten first: a record that grew with the run would
grow without bound. A step that comes out non-finite gives its buffered IDs back (neither
buffered nor done: sent again, they are taken afresh); until they are sent again they are told
apart from IDs never seen (``given_back``, with the number of the drop): a contribution still on
its way is unknown too, and only a given-back one is news to a long poll.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence


class ShardShareIds:
    """The share IDs of one shard: buffered for the next step, settled since the last, and done."""

    def __init__(self, recent_share_ids: int) -> None:
        self._capacity = recent_share_ids
        self._buffered: set[int] = set()
        self._settled: list[int] = []  # acknowledged since the last step, to log with it
        # share ID -> the version that settled it (applied ones are committed at that version).
        self._done: OrderedDict[int, int] = OrderedDict()
        self._given_back: OrderedDict[int, int] = OrderedDict()  # share ID -> the drop that gave it back

    @property
    def done(self) -> Mapping[int, int]:
        """Each remembered done ID and the version that settled it, least recently settled first."""
        return self._done

    def taken(self, ids: Sequence[int]) -> list[int]:
        """Those of ``ids`` already buffered or done."""
        return [i for i in ids if i in self._buffered or i in self._done]

    def fresh(self, ids: Sequence[int]) -> list[int]:
        """Those of ``ids`` neither buffered nor done."""
        return [i for i in ids if i not in self._buffered and i not in self._done]

    def given_back(self, ids: Sequence[int]) -> dict[int, int]:
        """Those of ``ids`` a dropped step gave back and not sent again since, with the drop's number."""
        if not self._given_back:  # no step dropped lately: every pull asks, on its hot path
            return {}
        return {i: self._given_back[i] for i in ids if i in self._given_back}

    def buffer(self, ids: Iterable[int]) -> None:
        """``ids`` wait in the step buffer."""
        for i in ids:
            self._buffered.add(i)
            self._given_back.pop(i, None)

    def settle(self, ids: Iterable[int], committed_version: int) -> None:
        """Remember share IDs acknowledged without being applied: done now (nothing of theirs can
        be lost), and logged with the next step so that a standby knows them too."""
        for i in ids:
            self._settled.append(i)
            self._given_back.pop(i, None)
            self.remember(i, committed_version)

    def forget_buffered(self, drop: int) -> int:
        """Give the buffered IDs back, by drop number ``drop`` (the step came out non-finite);
        those settled since the last step stay settled. Returns how many."""
        forgotten = len(self._buffered)
        for i in self._buffered:
            self._given_back[i] = drop
            self._given_back.move_to_end(i)
        while len(self._given_back) > self._capacity:
            self._given_back.popitem(last=False)
        self._buffered.clear()
        return forgotten

    def close_step(self, version: int) -> tuple[int, ...]:
        """The share IDs step ``version`` logs: those settled since the previous step, then those
        it applied (done at ``version`` from now on)."""
        share_ids = (*self._settled, *sorted(self._buffered))
        for i in self._buffered:
            self.remember(i, version)
        self._buffered.clear()
        self._settled = []
        return share_ids

    def remember(self, share_id: int, version: int) -> None:
        """``share_id`` is done at ``version``."""
        self._done[share_id] = version
        self._done.move_to_end(share_id)
        while len(self._done) > self._capacity:
            self._done.popitem(last=False)

    def committed(self, share_ids: Sequence[int], committed_version: int) -> set[int]:
        """Which of ``share_ids`` are done at ``committed_version`` or before."""
        done = self._done
        return {i for i in share_ids if i in done and done[i] <= committed_version}
