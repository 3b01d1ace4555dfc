"""daemon/replication.py: a standby logs a push from the stage's holder, checking who holds the
stage without a DHT lookup when the trainer's last lease scan already says so."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from swarmd.errors import SwarmdError
from swarmd.peers.stage_leases import StageLease
from swarmd.replication import StageReplicator, choose_standby, standby_of

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


def write_checkpoint(path: Path, version: int, metadata: dict[str, str]) -> bytes:
    import torch

    from swarmd.models.param_server import ServerConfig, StageParameterServer

    server = StageParameterServer({"w": torch.zeros(3)}, ServerConfig(lr=1e-3), path)
    server.version, server.metadata = version, metadata
    server.checkpoint()
    return path.read_bytes()


def test_a_new_host_takes_the_previous_holders_copy_at_an_equal_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The copy written as the stage was handed over has the leases it carried for the next host;
    a standby copy of the same version, made earlier, lacks them. Another peer's equal copy is
    not fetched (it adds nothing), and a lower one never replaces ours."""
    from swarmd import replication
    from swarmd.models.param_server import stage_checkpoint_name

    ours = tmp_path / "ours"
    ours.mkdir()
    write_checkpoint(ours / stage_checkpoint_name(1), 7, {"gradient_ledger": "standby copy"})
    offered = {
        "previous": write_checkpoint(tmp_path / "previous.safetensors", 7, {"gradient_ledger": "handed over"}),
        "other": write_checkpoint(tmp_path / "other.safetensors", 7, {"gradient_ledger": "other copy"}),
        "older": write_checkpoint(tmp_path / "older.safetensors", 6, {"gradient_ledger": "older copy"}),
    }
    versions = {"previous": 7, "other": 7, "older": 6}
    fetched: list[str] = []

    async def call(p2p: object, peer: str, method: str, args: dict[str, Any], blobs: object = None,
                   timeout_s: float = 0) -> tuple[dict[str, Any], list[bytes]]:  # fmt: skip
        if args["op"] == "version":
            return {"version": versions[peer]}, []
        fetched.append(peer)
        return {"version": versions[peer]}, [offered[peer]]

    monkeypatch.setattr(replication, "call", call)
    replicator = StageReplicator("r.x", 2, ours, LeaseScans({}))  # type: ignore[arg-type]
    replicator.p2p = object()  # type: ignore[assignment]

    def ledger() -> str:
        from safetensors import safe_open

        with safe_open(str(ours / stage_checkpoint_name(1)), "pt") as f:
            return str((f.metadata() or {}).get("gradient_ledger"))

    assert asyncio.run(replicator.fetch_newest(1, ["other", "older"], previous="gone")) == 7
    assert fetched == [] and ledger() == "standby copy"
    assert asyncio.run(replicator.fetch_newest(1, ["other", "previous", "older"], previous="previous")) == 7
    assert fetched == ["previous"] and ledger() == "handed over"


def test_the_standby_is_on_the_best_link_from_the_host_among_the_equally_reliable() -> None:
    members = [{"peer_id": p, "uptime_s": up} for p, up in (("a", 10.0), ("b", 500.0), ("c", 100.0), ("d", 50.0))]
    links = {("a", "b"): 1e6, ("a", "c"): 5e6, ("a", "d"): 5e6}
    scores = {"b": 0.9, "c": 0.9, "d": 0.8}
    pick = choose_standby(members, "a", lambda p: scores.get(p, 0.0), lambda x, y: links.get((x, y), 0.0))
    assert pick == "c"  # b is as reliable but on a slower link; d is on as fast a link but less reliable
    assert choose_standby(members, "a", lambda p: scores.get(p, 0.0)) == "b"  # links unknown: the longest up
    # any peer computes the holder's pick the same way, with the holder's links
    assert standby_of(members[1:], "a", "b", lambda p: 0.9 if p in "cd" else 0.0, 10.0,
                      lambda x, y: 9e6 if (x, y) == ("b", "d") else 1e6) == "d"  # fmt: skip
