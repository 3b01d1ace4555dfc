"""The share ledger (peers/taskpool/shares.py): nothing issued is lost, nothing is skipped."""

from __future__ import annotations

import pytest

from swarmd.peers.taskpool.shares import OPEN_ROUNDS, LedgerError, ShareLedger, open_limit

pytestmark = pytest.mark.timeout(10)


def test_shares_are_contiguous_and_an_abandoned_one_comes_back_first_with_its_id() -> None:
    ledger = ShareLedger(share_micro_batches=4, lease_s=60)
    a, b = ledger.issue("p0", 0.0, limit=4), ledger.issue("p1", 0.0, limit=4)
    assert (a.first, b.first) == (0, 4) and list(b.micro_batches) == [4, 5, 6, 7]
    assert ledger.abandon([a.share_id], "p1") == []  # not its share
    assert ledger.abandon([a.share_id], "p0") == [a.share_id]
    again = ledger.issue("p1", 1.0, limit=4)
    assert again == a and ledger.counters.reissued == 1
    assert ledger.issue("p1", 1.0, limit=4).first == 8
    assert ledger.done_below() == 0
    assert ledger.complete([a.share_id, b.share_id]) == [a.share_id, b.share_id]
    assert ledger.done_below() == 8


def test_a_lapsed_lease_returns_its_share_and_renewal_keeps_it() -> None:
    ledger = ShareLedger(share_micro_batches=2, lease_s=10)
    a = ledger.issue("p0", 0.0, limit=2)
    b = ledger.issue("p0", 0.0, limit=2)
    with pytest.raises(LedgerError, match="limit is 2"):
        ledger.issue("p0", 0.0, limit=2)
    assert ledger.renew([a.share_id], "p0", 8.0) == [a.share_id]
    assert ledger.expire(12.0) == [b]
    assert ledger.expire(17.0) == [] and ledger.expire(18.0) == [a]
    assert ledger.waiting == 2


def test_a_checkpointed_ledger_issues_its_open_shares_again_and_never_skips() -> None:
    ledger = ShareLedger(share_micro_batches=3, lease_s=10)
    shares = [ledger.issue("p", 0.0, limit=10) for _ in range(4)]
    ledger.complete([shares[0].share_id, shares[2].share_id])
    restored = ShareLedger.from_metadata(ledger.to_metadata(), 3, 10)
    assert restored.cursor == 12 and restored.waiting == 2
    assert [restored.issue("q", 0.0, 10) for _ in range(3)] == [shares[1], shares[3], restored.open_shares()[2][0]]
    assert restored.open_shares()[2][0].first == 12
    with pytest.raises(LedgerError, match="corrupt"):
        ShareLedger.from_metadata('{"cursor": 3, "next_id": 1, "again": [[0, 0, 9]]}', 3, 10)


def test_shares_given_back_are_issued_again_in_data_order() -> None:
    """Whatever order shares come back in, the earliest data goes out first: a swarm that drops
    shares trains its batches in the order one process would."""
    ledger = ShareLedger(share_micro_batches=2, lease_s=60)
    shares = [ledger.issue("p", 0.0, limit=4) for _ in range(3)]
    assert ledger.abandon([shares[2].share_id], "p") == [shares[2].share_id]
    assert ledger.abandon([shares[0].share_id], "p") == [shares[0].share_id]
    assert [ledger.issue("q", 1.0, limit=4).first for _ in range(3)] == [0, 4, 6]


@pytest.mark.parametrize("local_steps", [1, 4, 16])
def test_a_pipeline_alone_opens_a_whole_round_while_two_wait_to_be_committed(local_steps: int) -> None:
    # A round delivered but not committed, a second that fell short of the shard's step (some
    # of its shares were in already): the shard steps only once more micro-batches come, so
    # the pipeline must be able to open a whole third round while both wait, and no more
    # than the limit in all.
    ledger = ShareLedger(share_micro_batches=4, lease_s=60)
    limit = open_limit(local_steps)
    issued = [ledger.issue("p0", 0.0, limit=limit) for _ in range(3 * local_steps)]
    assert len({s.share_id for s in issued}) == 3 * local_steps
    for _ in range(limit - 3 * local_steps):
        ledger.issue("p0", 0.0, limit=limit)
    with pytest.raises(LedgerError, match=f"the limit is {OPEN_ROUNDS * local_steps}"):
        ledger.issue("p0", 0.0, limit=limit)
    with pytest.raises(ValueError, match="local_steps = 0"):
        open_limit(0)
