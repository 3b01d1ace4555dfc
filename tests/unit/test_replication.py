"""daemon/replication.py: a standby logs a push from the stage's holder, checking who holds the
stage without a DHT lookup when the trainer's last lease scan already says so."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from swarmd.errors import SwarmdError
from swarmd.peers.stage_leases import StageLease
from swarmd.replication import StageReplicator

pytestmark = pytest.mark.timeout(30)


class LeaseScans:
    """A DHT that answers lease scans with one holder per stage, and counts them."""

    def __init__(self, holders: dict[int, str]) -> None:
        self.holders, self.scans = holders, 0

    async def scan_leases(self, stage: int, now: float) -> list[StageLease]:
        self.scans += 1
        peer = self.holders.get(stage)
        return [] if peer is None else [StageLease(run_id="r.x", stage=stage, peer_id=peer, claimed_at=now - 5,
                                                   issued_at=now, expires_at=now + 30)]  # fmt: skip


def log(replicator: StageReplicator, sender: str, seq: int) -> dict[str, Any]:
    header = {"run_id": "r.x", "stage": 1, "seq": seq, "meta": {"base": 0, "micro_batches": 2}, "lineage": "t"}
    return asyncio.run(replicator.handle_log(sender, header, [b"gradient"]))[0]


def test_a_push_from_the_holder_the_trainer_saw_is_logged_without_a_lease_scan(tmp_path: Path) -> None:
    dht = LeaseScans({1: "host"})
    replicator = StageReplicator("r.x", 2, tmp_path, dht)  # type: ignore[arg-type]
    replicator.holder_of = lambda stage: "host" if stage == 1 else None
    assert log(replicator, "host", 1) == {} and dht.scans == 0
    assert replicator.logged == 1 and sorted(p.name for p in (tmp_path / "stage1.pushes").iterdir() if p.suffix)
    assert replicator.log_phases.status()["append"]["n"] == 1


def test_a_holder_newer_than_the_trainers_scan_is_checked_in_the_dht_and_others_are_refused(tmp_path: Path) -> None:
    dht = LeaseScans({1: "new-host"})
    replicator = StageReplicator("r.x", 2, tmp_path, dht)  # type: ignore[arg-type]
    replicator.holder_of = lambda stage: "old-host"
    assert log(replicator, "new-host", 1) == {} and dht.scans == 1
    assert log(replicator, "new-host", 2) == {} and dht.scans == 1  # cached for a few seconds
    with pytest.raises(SwarmdError, match="does not hold stage 1"):
        log(replicator, "intruder", 3)
    assert replicator.refused == 1 and replicator.logged == 2
