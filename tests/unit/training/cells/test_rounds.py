"""training/cells/rounds.py: a round names each share once, however often it was trained in it; it is
contributed when its last share is done, on the weights it started from, or dropped, its shares
given back, when it is not finite; it waits for room, and in gradient mode for its step."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
import torch

from swarmd.training.cells.cell_facts import CellView
from swarmd.training.cells.cell_stats import CellStats
from swarmd.training.cells.in_flight import ShareInFlight
from swarmd.training.cells.rounds import CellRounds, named_once
from tests.unit.training.cells.cell_fakes import FakeCell, facts

pytestmark = pytest.mark.timeout(10)


def test_a_share_issued_again_within_its_round_is_named_once_with_its_last_ticket() -> None:
    # Seen on four daemons under load: shares 200 and 201 lapsed while the round stalled, came
    # back to the same pipeline, and the round's contribution named [200, 201, 200, 201].
    ids, tickets = named_once([200, 201, 200, 201], ["a", "b", "c", "d"])
    assert ids == [200, 201]
    assert tickets == ["c", "d"]


def test_a_round_of_distinct_shares_is_unchanged() -> None:
    assert named_once([7, 3, 9], ["x", "y", "z"]) == ([7, 3, 9], ["x", "y", "z"])
    assert named_once([], []) == ([], [])


def test_the_order_is_that_of_each_share_last_done() -> None:
    assert named_once([1, 2, 1, 3], ["a", "b", "c", "d"]) == ([2, 1, 3], ["b", "c", "d"])


@dataclass
class Compute:
    """A cell's compute at the end of a share and of a round: the round's contribution is ``vector``."""

    vector: torch.Tensor = field(default_factory=lambda: torch.ones(8))
    ended: list[int] = field(default_factory=list)  # each share's inner step

    def end_share(self, inner_step: int) -> None:
        self.ended.append(inner_step)

    def contribution(self) -> tuple[torch.Tensor, int]:
        return self.vector, 2 * len(self.ended)


@dataclass
class Weights:
    """The puller, as the rounds use it: weights at ``version``; each shard's step comes at once
    unless ``late``."""

    version: int = 4
    late: bool = False
    calls: list[str] = field(default_factory=list)

    def round_started(self) -> None:
        self.calls.append("round started")

    def round_bases(self) -> list[int]:
        return [self.version]

    async def wait_past(self, bases: list[int], timeout_s: float, in_vain: Callable[[], bool] = lambda: False) -> bool:
        self.calls.append(f"wait past {bases}" + (" (in vain)" if in_vain() else ""))
        return not self.late or in_vain()

    async def apply(self) -> None:
        self.calls.append("apply")


@dataclass
class Outbox:
    """The contributions: room once ``room_after`` checks have been made; what was added."""

    room_after: int = 0
    added: list[tuple[list[int], list[str], torch.Tensor, int, list[int]]] = field(default_factory=list)
    checks: int = 0
    awaits_more: bool = False

    def step_awaits_more(self) -> bool:
        return self.awaits_more

    async def room(self) -> bool:
        self.checks += 1
        return self.checks > self.room_after

    async def wait_for_room(self, timeout_s: float) -> bool:
        return False

    def add(
        self, share_ids: list[int], tickets: list[str], vector: torch.Tensor, micro_batches: int, bases: list[int]
    ) -> None:
        self.added.append((share_ids, tickets, vector, micro_batches, bases))


def rounds(
    compute: Compute, outbox: Outbox, weights: Weights, local_steps: int = 2, cell: FakeCell | None = None
) -> tuple[CellRounds, list[list[int]], CellStats]:
    """Rounds of ``local_steps`` shares at cell (0, 1); what goes back to the ledger is recorded."""
    given_back: list[list[int]] = []
    stats = CellStats()
    cell = cell or FakeCell()
    r = CellRounds(facts(local_steps=local_steps), cell, compute, stats, weights, outbox, given_back.append)  # type: ignore[arg-type]
    return r, given_back, stats


def share(share_id: int, round_end: bool) -> ShareInFlight:
    return ShareInFlight(share_id, 4 * share_id, 2, round_end, "e1", 1, f"t{share_id}")


def test_a_round_is_contributed_once_its_last_share_is_done_on_the_bases_it_started_from() -> None:
    async def scenario() -> None:
        compute, outbox, weights = Compute(), Outbox(), Weights()
        r, given_back, stats = rounds(compute, outbox, weights)
        r.share_begins()
        await r.share_done(share(1, round_end=False))
        r.share_begins()  # the round's second share: its base was taken already
        await r.share_done(share(1, round_end=False))  # issued again within the round
        assert outbox.added == [] and weights.calls == ["round started"]
        r.share_begins()
        await r.share_done(share(2, round_end=True))
        [(share_ids, tickets, vector, micro_batches, bases)] = outbox.added
        assert (share_ids, tickets, micro_batches, bases) == ([1, 2], ["t1", "t2"], 6, [4])
        assert vector is compute.vector and compute.ended == [8, 9, 10]  # H = 2 steps a round behind version 4
        assert given_back == [] and (stats.shares, stats.rounds) == (3, 1)

    asyncio.run(scenario())


def test_a_round_that_is_not_finite_is_dropped_and_its_shares_go_back() -> None:
    async def scenario() -> None:
        compute, outbox, weights = Compute(vector=torch.tensor([1.0, float("nan"), float("inf")])), Outbox(), Weights()
        r, given_back, stats = rounds(compute, outbox, weights)
        await r.share_done(share(1, round_end=False))
        await r.share_done(share(2, round_end=True))
        assert outbox.added == [] and given_back == [[1, 2]] and stats.dropped_rounds == 1
        compute.vector = torch.ones(3)  # the next round is fit to send, and names only its own shares
        await r.share_done(share(3, round_end=True))
        assert [added[0] for added in outbox.added] == [[3]] and given_back == [[1, 2]]

    asyncio.run(scenario())


def test_a_round_waits_for_room_and_in_gradient_mode_the_next_waits_for_its_step() -> None:
    async def scenario() -> None:
        compute, outbox, weights = Compute(), Outbox(room_after=3), Weights(late=True)
        r, _, stats = rounds(compute, outbox, weights, local_steps=1)
        await r.between_shares()
        assert weights.calls == ["apply"]  # no round contributed yet: nothing to wait for
        await r.share_done(share(1, round_end=True))
        assert outbox.checks == 4 and len(outbox.added) == 1  # held back until the last round was delivered
        await r.between_shares()
        assert weights.calls == ["apply", "wait past [4]", "apply"] and stats.sync_timeouts == 1
        await r.between_shares()  # once only
        assert weights.calls[3:] == ["apply"]

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("pipelines", "awaits_more", "waits_in_vain"), [(1, True, True), (2, True, False), (1, False, False)]
)
def test_a_lone_pipeline_does_not_wait_for_a_step_that_needs_its_next_round(
    pipelines: int, awaits_more: bool, waits_in_vain: bool
) -> None:
    """After a re-plan leaves one pipeline, shares cut for two make half a batch each round; the
    step waits for this cell's next round, so waiting for it stalled ``SYNC_WAIT_S`` a step. With
    another pipeline in the plan (or a round a shard stepped on) the wait is the synchronous one."""

    async def scenario() -> None:
        cell = FakeCell(view=CellView(epoch="e1", servers=["server"], pipelines=pipelines))
        compute, outbox, weights = Compute(), Outbox(awaits_more=awaits_more), Weights(late=True)
        r, _, stats = rounds(compute, outbox, weights, local_steps=1, cell=cell)
        await r.share_done(share(1, round_end=True))
        await r.between_shares()
        assert weights.calls[-2] == "wait past [4]" + (" (in vain)" if waits_in_vain else "")
        assert stats.sync_timeouts == (0 if waits_in_vain else 1)

    asyncio.run(scenario())
