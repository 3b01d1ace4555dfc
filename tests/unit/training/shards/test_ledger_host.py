"""daemon/training/shards/ledger_host.py: every share the ledger issues comes with a ticket its keeper
signed for the asking pipeline, which a shard server on another peer can check."""

from __future__ import annotations

import pytest

from swarmd.peers.records.identity import Identity
from swarmd.peers.taskpool.shares import Share
from swarmd.peers.taskpool.tickets import ShareTicket, TicketVerifier
from swarmd.peers.wire.errors import NotHolder
from swarmd.peers.wire.messages import LedgerIssue
from swarmd.training.shards.ledger_host import LedgerHost

pytestmark = pytest.mark.timeout(60)

RUN_ID = "tiny." + "a" * 24
KEEPER = Identity.generate()
NOW = 1_800_000_000.0


def sign(share: Share, pipeline: int, now: float) -> str:
    fields = dict(share_id=share.share_id, first=share.first, count=share.count, pipeline=pipeline)
    return ShareTicket.sign(KEEPER, RUN_ID, **fields, now=now).text()


def test_issued_shares_carry_tickets_for_the_asking_pipeline() -> None:
    holders = {0: "cell-0", 1: "cell-1"}
    host = LedgerHost.from_state("", 4, holders.get, lambda: 3, sign)
    first = host.issue("cell-0", LedgerIssue(run_id=RUN_ID, pipeline=0, renew=[], want=2), NOW)
    second = host.issue("cell-1", LedgerIssue(run_id=RUN_ID, pipeline=1, renew=[], want=1), NOW)
    assert [s[0] for s in first.shares] == [0, 1] and [s[0] for s in second.shares] == [2]
    tickets = [ShareTicket.from_text(t) for t in first.tickets + second.tickets]
    assert [(t.share_id, t.first, t.count, t.pipeline) for t in tickets] == [(0, 0, 4, 0), (1, 4, 4, 0), (2, 8, 4, 1)]
    verifier = TicketVerifier()
    verifier.check(
        RUN_ID, tickets[:2], share_ids=[0, 1], micro_batches=8, pipelines=[0], keepers=[KEEPER.peer_id], now=NOW
    )
    with pytest.raises(NotHolder):  # only the pipeline's stage-0 cell gets its shares (and tickets)
        host.issue("cell-1", LedgerIssue(run_id=RUN_ID, pipeline=0, renew=[], want=1), NOW)


def test_a_pipeline_whose_stage_0_moved_gets_its_dropped_share_before_a_new_one() -> None:
    """The share open at the pipeline's old stage-0 holder (its abandon lost as the cell moved)
    is issued to the new holder first, before the tick has run."""
    holders = {0: "old", 1: "other"}
    host = LedgerHost.from_state("", 4, holders.get, lambda: 3, sign)
    dropped = host.issue("old", LedgerIssue(run_id=RUN_ID, pipeline=0, renew=[], want=1), NOW).shares[0]
    busy = host.issue("other", LedgerIssue(run_id=RUN_ID, pipeline=1, renew=[], want=1), NOW).shares[0]
    holders[0] = "new"
    issued = host.issue("new", LedgerIssue(run_id=RUN_ID, pipeline=0, renew=[], want=2), NOW).shares
    assert [s[0] for s in issued] == [dropped[0], 2]  # pipeline 1's open share stays its own
    assert [(share.share_id, holder) for share, holder in host.ledger.open_shares()][0] == (busy[0], "1/other")
