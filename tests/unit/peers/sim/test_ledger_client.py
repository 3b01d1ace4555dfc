"""peers/sim/ledger_client.py, the ledger's side: the client owns the ledger, renews a holder's
leases every third of their length, and rebuilds the ledger from its metadata at a failover of
shard (0, 0), so that every share open then is issued again."""

from __future__ import annotations

import pytest

from swarmd.peers.sim.ledger_client import LedgerClient
from tests.unit.peers.sim.small_world import sizes, world

pytestmark = pytest.mark.timeout(10)


def test_a_failover_rebuilds_the_ledger_and_issues_the_open_shares_again() -> None:
    w = world(2)
    client = LedgerClient(w, sizes(w, k=2, local_steps=2))
    before = client.ledger
    ids = [s.share_id for s in client.issue(0.0, "d0", 3)]
    client.complete("d0", (ids[0],))
    client.restarted()
    assert client.ledger is not before and client.held == {}
    again = [s.share_id for s in client.issue(1.0, "d1", 3)]
    assert again[:2] == ids[1:]  # the two open at the failover, in data order
    assert ids[0] not in again and client.ledger.counters.reissued == 2
    assert client.ledger.share_micro_batches == 2 and client.ledger.lease_s == w.settings.lease_s


def test_a_holders_leases_are_renewed_at_its_issues_a_third_of_a_lease_apart() -> None:
    w = world(2, lease_s=90.0)
    client = LedgerClient(w, sizes(w, k=2, local_steps=4))
    first = client.issue(0.0, "d0", 1)[0].share_id
    client.issue(20.0, "d0", 1)  # under a third of the lease: no renewal
    assert client.renewed["d0"] == 0.0
    client.issue(60.0, "d0", 1)  # renews the open ones: the first lasts to 150 s
    assert client.renewed["d0"] == 60.0
    client.ledger.expire(120.0)
    assert first not in [s.share_id for s in client.issue(121.0, "d1", 4)]
