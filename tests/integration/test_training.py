"""Daemons train on the data path of docs/data-path.md: alone, two together, one killed, a stranger.

- a daemon alone holds every cell and every shard and trains the whole model; a second one
  joins and the pool spreads cells and shards over both, each shard resumed from its previous
  holder's state (versions only grow); paused by its owner (``swarmd pause``) it hands them
  back to the first at no lower version, and resumed it takes work again;
- SIGKILL of a shard's server: its standby takes the shard over from its replica, at the last
  committed version or later (no committed update lost);
- a key that never joined (no heartbeat) signs a shard lease claiming version 10**6 and offers
  a checkpoint: nobody believes the lease, and the request is refused before it is read;
- ``swarmd export`` gathers every stage's weights from the shards' holders.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from swarmd.system.local_swarm import LocalDaemon, create_run, wait_for
from tests.integration.conftest import BACKGROUND_SHARE
from tests.integration.fork_launcher import ForkLauncher
from tests.integration.small_run import SMALL_RUN

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

# Runs in its own interpreter (hivemind must not share the test process with py-libp2p): a
# fresh key that never published a heartbeat joins the DHT, stores a signed lease of shard
# (0, 0) at version 10**6, then sends the daemon a checkpoint of its own for that shard.
STRANGER = r"""
import asyncio, sys, time
import hivemind
from hivemind.p2p import P2P
from swarmd.peers.records.identity import Identity
from swarmd.peers.dht.swarm_dht import shards_key
from swarmd.peers.taskpool.servers import ShardLease
from swarmd.peers.wire.errors import RpcError
from swarmd.peers.wire.messages import ReplicaCheckpoint
from swarmd.peers.wire.rpc import call

async def main(addr, run_id):
    stranger = Identity.generate()
    now = time.time()
    lease = ShardLease(run_id=run_id, stage=0, shard=0, shards=1, peer_id=stranger.peer_id, claimed_at=now - 3600,
                       issued_at=now, expires_at=now + 120, version=10**6)
    dht = hivemind.DHT(initial_peers=[addr], start=True, host_maddrs=["/ip4/127.0.0.1/tcp/0"])
    stored = dht.store(shards_key(run_id, 0), lease.sign(stranger), now + 120, subkey=stranger.peer_id)
    print("stored", stored)
    p2p = await P2P.create(initial_peers=[addr], host_maddrs=["/ip4/127.0.0.1/tcp/0"], nat_port_map=False,
                           auto_nat=False, use_relay=False)
    try:
        request = ReplicaCheckpoint(run_id=run_id, stage=0, shard=0, lineage="stranger", version=10**6)
        await call(p2p, addr.rsplit("/p2p/", 1)[1], request, [b"not a checkpoint"])
        print("accepted")
    except RpcError as e:
        print("refused", type(e).__name__, e)
    await p2p.shutdown()
    dht.shutdown()

asyncio.run(main(*sys.argv[1:]))
"""

# Training goes on in the background while these tests watch hand-overs and take-overs.
TRAINING = ["--heartbeat-interval", "1", "--heartbeat-ttl", "8", "--no-benchmark", "--threads", "1"]
TRAINING += ["--config", str(BACKGROUND_SHARE)]


def training(daemon: LocalDaemon) -> dict[str, Any]:
    status = daemon.status()
    return (status or {}).get("training") or {}


def served(daemon: LocalDaemon) -> dict[int, int]:
    """Stage -> version, for the stages whose (only) shard this daemon serves."""
    return {s["stage"]: s["version"] for s in training(daemon).get("shards") or []}


def cells(daemon: LocalDaemon) -> list[tuple[int, int]]:
    return [(c["pipeline"], c["stage"]) for c in training(daemon).get("cells") or []]


def test_a_daemon_alone_trains_everything_a_second_takes_its_share_and_hands_it_back_paused(
    workdir: Path, make_run: Callable[..., str], launcher: ForkLauncher
) -> None:
    run_id = make_run(workdir / "d0")
    d0 = LocalDaemon(workdir / "d0", run_id, TRAINING, launcher=launcher)
    d1 = LocalDaemon(workdir / "d1", run_id, TRAINING, launcher=launcher)
    try:
        # Alone, a daemon holds both cells of its pipeline and both shards.
        d0.start()
        addrs = d0.wait_running()["addrs"]
        wait_for(lambda: min(served(d0).values(), default=0) >= 3, 90, "d0 to make 3 updates on both stages")
        assert sorted(served(d0)) == [0, 1] and sorted(cells(d0)) == [(0, 0), (0, 1)]
        assert training(d0)["loss"] is not None
        assert d0.status()["roles"] == ["worker", "parameter_server"]
        # A second daemon joins: the pool gives it a cell and a shard; the shard it takes resumes
        # from d0's state, and both work.
        before = served(d0)
        d1.start(addrs).wait_running()
        wait_for(lambda: len(served(d1)) == 1 and len(served(d0)) == 1, 90, "the shards to spread")
        ((moved, version),) = served(d1).items()
        assert version >= before[moved], "the new server resumed from the old one's state"
        wait_for(lambda: len(cells(d0)) == 1 and len(cells(d1)) == 1, 60, "one cell each")
        # The first plan may swap what the provisional assignment placed (each daemon keeps one
        # cell and one shard): training goes on over both, whichever stage each holds.
        spread = max(served(d0).values()) if served(d0) else 0

        def trained_on_both() -> bool:
            s0, s1 = served(d0), served(d1)
            return len(s0) == 1 and len(s1) == 1 and min(*s0.values(), *s1.values()) >= spread + 3

        wait_for(trained_on_both, 90, "training to go on over two daemons")
        # Its owner pauses d1: it hands its cell and shard back, d0 takes them at no lower
        # version and trains on alone; resumed, d1 takes work again.
        before = {**served(d0), **served(d1)}
        paused = owner(d1, "pause")
        assert "paused: this peer's cells and shards are handed back" in paused, paused
        wait_for(lambda: not cells(d1) and not served(d1), 60, "d1 to hand its work back")
        assert (d1.status() or {}).get("paused", {}).get("reason") == "asked by the owner"
        wait_for(lambda: sorted(served(d0)) == [0, 1] and len(cells(d0)) == 2, 120, "d0 to take everything")
        taken = served(d0)
        assert all(taken[stage] >= version for stage, version in before.items()), (before, taken)  # none lost
        after = min(served(d0).values())
        wait_for(lambda: min(served(d0).values()) >= after + 3, 90, "d0 to train on alone")
        assert "resumed" in owner(d1, "resume")
        wait_for(lambda: len(cells(d1)) == 1, 120, "d1 to take a cell again")
    finally:
        for d in (d0, d1):
            d.stop(timeout=60)


def owner(daemon: LocalDaemon, *command: str) -> str:
    """``swarmd COMMAND --state-dir`` as the daemon's owner types it; what it printed."""
    out = daemon.launcher.run([*command, "--state-dir", str(daemon.state_dir)], 90)
    assert out.returncode == 0, out.stderr
    return out.stdout


def start_pair(workdir: Path, launcher: ForkLauncher) -> tuple[str, LocalDaemon, LocalDaemon]:
    spec = workdir / "tiny-bytes.json"
    spec.write_text(json.dumps({**SMALL_RUN, "name": "tiny-bytes"}))
    run_id = create_run(workdir / "d0", spec)
    d0 = LocalDaemon(workdir / "d0", run_id, TRAINING, launcher=launcher)
    d1 = LocalDaemon(workdir / "d1", run_id, TRAINING, launcher=launcher)
    addrs = d0.start().wait_running()["addrs"]
    d1.start(addrs).wait_running()
    return run_id, d0, d1


@pytest.fixture
def pair(workdir: Path, launcher: ForkLauncher) -> Iterator[tuple[str, LocalDaemon, LocalDaemon]]:
    """Two training daemons of a fresh run, both running; stopped afterwards."""
    run_id, d0, d1 = start_pair(workdir, launcher)
    try:
        yield run_id, d0, d1
    finally:
        for d in (d0, d1):
            d.stop(timeout=60)


@pytest.fixture(scope="module")
def shared_pair(launcher: ForkLauncher) -> Iterator[tuple[Path, str, LocalDaemon, LocalDaemon]]:
    """The same, for the tests that leave both daemons running: one swarm serves them all
    (each costs a minute of two cores to start and spread)."""
    workdir = Path(tempfile.mkdtemp(prefix="swd-", dir="/tmp"))
    run_id, d0, d1 = start_pair(workdir, launcher)
    try:
        yield workdir, run_id, d0, d1
    finally:
        for d in (d0, d1):
            d.stop(timeout=60)
        if not os.environ.get("SWARMD_KEEP_TEST_DIRS"):
            shutil.rmtree(workdir, ignore_errors=True)


def test_a_killed_shard_server_is_taken_over_by_its_standby_with_no_update_lost(
    pair: tuple[str, LocalDaemon, LocalDaemon],
) -> None:
    _, d0, d1 = pair

    def replicated_at_d0() -> tuple[int, int] | None:
        """(stage, version) of the one shard d1 serves, once d0 serves the other and holds a
        replica of d1's: each status read once, since a re-plan can move a shard between reads."""
        s1, s0 = served(d1), served(d0)
        if len(s1) != 1 or len(s0) != 1 or max(s1.values()) < 15:
            return None
        ((stage, version),) = s1.items()
        replicas = training(d0).get("replicas", {}).get("shards") or {}
        return (stage, version) if f"{stage}/0" in replicas else None

    # d1 logs every step at its standby, d0, before anyone sees it: committed means replicated.
    stage, at_kill = wait_for(replicated_at_d0, 180, "d1 to serve a shard through 15 updates, replicated at d0")
    d1.kill()  # SIGKILL: no release, no last copy
    # d0 sees d1's heartbeat go (TTL 8 s) and takes the shard over from its replica: every step
    # d1 made and let a cell see survives.
    wait_for(lambda: sorted(served(d0)) == [0, 1], 90, f"d0 to take stage {stage}'s shard over")
    resumed = served(d0)[stage]
    print(f"stage {stage} was at version {at_kill} when its server was killed; resumed at {resumed}")
    assert resumed >= at_kill
    wait_for(lambda: served(d0)[stage] > at_kill + 2, 90, "training to go on past the kill")


def test_a_stranger_cannot_claim_a_shard_nor_plant_its_weights(
    shared_pair: tuple[Path, str, LocalDaemon, LocalDaemon],
) -> None:
    _, run_id, d0, d1 = shared_pair

    def stage0_holder() -> tuple[LocalDaemon, int] | None:  # each status read once: serving can change
        for d in (d0, d1):
            version = served(d).get(0)
            if version is not None and len(served(d1 if d is d0 else d0)) == 1:
                return d, version
        return None

    _, before = wait_for(stage0_holder, 120, "the shards to spread")
    result = subprocess.run(
        [sys.executable, "-c", STRANGER, d0.status()["addrs"][0], run_id], capture_output=True, text=True, timeout=90
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "refused NotMember" in result.stdout, result.stdout

    # Its lease (signed, well formed, claimed an hour ago, at version 10**6) counts for nothing:
    # the shard stays with the swarm's members (the first plan may move it from one to the
    # other) and trains on from where it was.
    def stage0_version() -> int:
        return max(served(d).get(0, 0) for d in (d0, d1))

    wait_for(lambda: stage0_version() >= before + 3, 90, "shard (0, 0) to train on at a member")
    assert all(v < 10**5 for d in (d0, d1) for v in served(d).values())
    assert any(0 in served(d) for d in (d0, d1))


def test_export_gathers_the_stages_from_the_swarm(shared_pair: tuple[Path, str, LocalDaemon, LocalDaemon]) -> None:
    workdir, run_id, d0, d1 = shared_pair
    wait_for(
        lambda: len(served(d1)) == 1 and len(served(d0)) == 1 and min(served(d1).values()) >= 2,
        120,
        "the shards to spread and train",
    )
    ((s, version),) = served(d1).items()  # d1's shard: the export on d0 must fetch it
    out = workdir / "exported"
    result = d0.launcher.run(["export", "--run-id", run_id, str(out), "--state-dir", str(d0.state_dir)], 180)
    assert result.returncode == 0, result.stderr[-2000:]
    versions = [int(v) for v in result.stdout.split("versions [")[1].split("]")[0].split(",")]
    assert min(versions) >= 2 and versions[s] >= version, result.stdout
    assert (out / "config.json").exists()


def test_doctor_has_a_peer_dial_the_daemon_back(shared_pair: tuple[Path, str, LocalDaemon, LocalDaemon]) -> None:
    _, run_id, d0, _ = shared_pair
    wait_for(lambda: len(d0.status().get("peers") or []) >= 1, 60, "d0 to see d1")
    result = d0.launcher.run(["doctor", "--run-id", run_id, "--state-dir", str(d0.state_dir)], 120)
    print(result.stdout)
    assert result.returncode == 0, result.stdout + result.stderr[-2000:]
    reach = next(line for line in result.stdout.splitlines() if " reachability " in line)
    assert reach.startswith("pass") and "a peer opened a fresh connection to /ip4/127.0.0.1/tcp/" in reach, reach


def test_a_corpus_missing_here_fails_training_not_the_daemon(workdir: Path, launcher: ForkLauncher) -> None:
    spec = workdir / "spec.json"
    spec.write_text(json.dumps({**SMALL_RUN, "name": "elsewhere", "data": {"corpus": "/nonexistent/corpus.txt"}}))
    run_id = create_run(workdir / "d0", spec)
    d0 = LocalDaemon(workdir / "d0", run_id, TRAINING, launcher=launcher)
    try:
        d0.start().wait_running()
        wait_for(lambda: training(d0).get("state") == "failed", 60, "training to fail")
        assert "/nonexistent/corpus.txt" in training(d0)["error"]
        assert d0.status()["state"] == "running"  # the daemon stays a member of the swarm
    finally:
        assert d0.stop(timeout=60) == 0
