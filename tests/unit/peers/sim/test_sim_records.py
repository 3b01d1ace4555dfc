"""The simulated data plane's records and the cells' ledger client, without a run: a shard's
memory of settled shares and its hand-over, a pipeline's epoch stamp, and which shares a
broken segment gives back unspent (issued again without counting as a recompute)."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

import pytest

from swarmd.peers.sim.ledger_client import LedgerClient
from swarmd.peers.sim.pipeline_state import Cell, Pipeline
from swarmd.peers.sim.shard_records import MAX_DONE_SHARES, Contribution, Shard
from swarmd.peers.taskpool.shares import OPEN_ROUNDS

pytestmark = pytest.mark.timeout(10)


def contribution(cid: int, cell: Cell, share_ids: tuple[int, ...]) -> Contribution:
    return Contribution(cid, 0, cell, cell.serial, 0, 0, share_ids, len(share_ids), 0, None)


def test_a_shard_forgets_its_oldest_settled_shares_a_batch_at_a_time() -> None:
    shard = Shard(0, 0, holder=0)
    half = MAX_DONE_SHARES // 2
    first, second, third = tuple(range(half)), tuple(range(half, 2 * half)), (2 * half,)
    shard.remember(first)
    shard.remember(second)
    assert shard.done_count == MAX_DONE_SHARES and 0 in shard.done  # at the bound, nothing goes
    shard.remember(third)
    assert 0 not in shard.done and half - 1 not in shard.done  # the oldest batch went whole
    assert half in shard.done and 2 * half in shard.done
    assert shard.done_count == half + 1


def test_a_shard_handed_over_returns_what_was_not_committed_and_lapses_old_events() -> None:
    pipeline = Pipeline(1)
    cell = Cell(pipeline, 0, 1)
    shard = Shard(0, 0, holder=3, version=7, committed=5, epoch=2)
    flying, buffered, stepped = (contribution(i, cell, (i,)) for i in (1, 2, 3))
    shard.in_flight[1] = flying
    shard.buffer, shard.buffered = [buffered], 1.0
    shard.steps.append((6, [stepped], 0.0))
    shard.replicas = {4: 5, 9: 4}
    assert shard.hand_over(4, restored=5) == [flying, buffered, stepped]
    assert (shard.holder, shard.version, shard.committed, shard.epoch) == (4, 5, 5, 3)
    assert not shard.in_flight and not shard.buffer and shard.buffered == 0.0 and not shard.steps
    assert shard.replicas == {9: 4}  # the successor's copy is now the shard itself


def test_a_pipelines_events_lapse_once_its_epoch_moves_on() -> None:
    pipeline = Pipeline(1)
    stamp = pipeline.stamp()
    assert stamp.current()
    pipeline.epoch += 1
    assert not stamp.current() and pipeline.stamp().current()


def client(local_steps: int = 1) -> LedgerClient:
    world = SimpleNamespace(settings=SimpleNamespace(lease_s=900.0), counts=Counter())
    sizes = SimpleNamespace(share_micro_batches=2, local_steps=local_steps)
    return LedgerClient(world, sizes)  # type: ignore[arg-type]


def test_a_holder_is_issued_shares_up_to_its_open_rounds() -> None:
    ledger = client(local_steps=2)
    shares = ledger.issue(0.0, "a", 3 * OPEN_ROUNDS)
    assert [s.share_id for s in shares] == list(range(2 * OPEN_ROUNDS))  # the ledger's limit
    assert ledger.held["a"] == set(range(2 * OPEN_ROUNDS)) and ledger.renewed["a"] == 0.0


def test_a_broken_segment_gives_back_the_share_in_flight_to_recompute_and_the_rest_unspent() -> None:
    ledger = client()
    ids = [s.share_id for s in ledger.issue(0.0, "a", 3)]
    ledger.give_back("a", ids, first_begun=True)
    assert ledger.unspent == {1, 2} and ledger.held["a"] == set()
    again = [s.share_id for s in ledger.issue(1.0, "b", 3)]
    assert sorted(again) == [0, 1, 2]
    assert ledger.world.counts["reissued_unspent"] == 2 and not ledger.unspent  # type: ignore[attr-defined]


def test_a_departed_holders_shares_are_issued_again_and_completed_ones_closed() -> None:
    ledger = client()
    ids = [s.share_id for s in ledger.issue(0.0, "a", 2)]
    ledger.complete("a", (ids[0],))
    assert ledger.held["a"] == {ids[1]}
    ledger.forget("a")
    assert "a" not in ledger.held and "a" not in ledger.renewed
    assert [s.share_id for s in ledger.issue(1.0, "b", 1)] == [ids[1]]
