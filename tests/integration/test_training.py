"""A daemon alone trains the whole run; a second one stands by and takes over when it stops."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from swarmd.local_swarm import LocalDaemon, wait_for
from swarmd.models.param_server import checkpoint_version, read_checkpoint_weights
from swarmd.state_dir import run_checkpoint_dir

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

# Runs in its own interpreter (hivemind must not share the test process with py-libp2p).
PLANT = r"""
import asyncio, sys
from hivemind.p2p import P2P
from swarmd.peers.wire.rpc import RpcError, call

async def main(addr, run_id):
    p2p = await P2P.create(initial_peers=[addr], host_maddrs=["/ip4/127.0.0.1/tcp/0"], nat_port_map=False,
                           auto_nat=False, use_relay=False)
    try:
        await call(p2p, addr.rsplit("/p2p/", 1)[1], "replicate_stage",
                   {"run_id": run_id, "stage": 0, "version": 10**6}, [b"not a checkpoint"])
        print("accepted")
    except RpcError as e:
        print(e)
    await p2p.shutdown()

asyncio.run(main(*sys.argv[1:]))
"""

TRAINING = ["--heartbeat-interval", "1", "--heartbeat-ttl", "8", "--no-benchmark", "--threads", "1"]


def training(daemon: LocalDaemon) -> dict[str, Any]:
    status = daemon.status()
    return (status or {}).get("training") or {}


def hosted(daemon: LocalDaemon) -> dict[int, int]:
    """Stage -> parameter-server version, for the stages this daemon hosts."""
    return {int(s): h["version"] for s, h in (training(daemon).get("hosts") or {}).items()}


def test_stages_spread_as_daemons_join_and_come_back_as_they_leave(workdir: Path, make_run: Callable[..., str]) -> None:
    run_id = make_run(workdir / "d0")
    d0 = LocalDaemon(workdir / "d0", run_id, TRAINING)
    d1 = LocalDaemon(workdir / "d1", run_id, TRAINING)
    try:
        # Alone, a daemon hosts every stage and trains the whole model.
        d0.start()
        addrs = d0.wait_running()["addrs"]
        wait_for(lambda: min(hosted(d0).values(), default=0) >= 3, 90, "d0 to make 3 updates on both stages")
        assert sorted(hosted(d0)) == [0, 1] and training(d0)["loss"] is not None
        assert d0.status()["roles"] == ["worker", "parameter_server"]

        # A second daemon joins: d0 hands a stage over (the one the plan gives d1, if a plan
        # is in by then), d1 resumes it from d0's version, both work.
        before = hosted(d0)
        d1.start(addrs)
        d1_id = d1.wait_running()["peer_id"]
        wait_for(lambda: len(hosted(d1)) == 1 and len(hosted(d0)) == 1, 60, "the stages to spread")
        (moved,) = hosted(d1)
        kept = 1 - moved
        assert hosted(d1)[moved] >= before[moved], "the new host resumed from the old one's checkpoint"
        wait_for(lambda: sum(training(d1)["worker"]["tasks"].values()) >= 5, 60, "d1 to work")
        spread = hosted(d0)[kept]
        wait_for(lambda: hosted(d0).get(kept, 0) >= spread + 3, 60, "training to go on, spread over two daemons")
        holders = training(d0)["holders"]
        assert holders[kept] == d0.status()["peer_id"] and holders[moved] == d1_id

        # d0 leaves: its last checkpoint goes to d1 (its standby), which takes d0's stage over.
        assert d0.stop(timeout=60) == 0, d0.log_tail()
        name = f"stage{kept}.safetensors"
        final = read_checkpoint_weights(run_checkpoint_dir(d0.state_dir, run_id) / name)[0]
        assert checkpoint_version(run_checkpoint_dir(d1.state_dir, run_id) / name) == final
        wait_for(lambda: sorted(hosted(d1)) == [0, 1], 60, "d1 to host both stages")
        assert hosted(d1)[kept] >= final
        wait_for(lambda: hosted(d1)[kept] > final, 60, "d1 to train on from d0's updates")

        # A peer that holds no stage cannot plant weights on anyone: refused and counted.
        planted = subprocess.run([sys.executable, "-c", PLANT, d1.status()["addrs"][0], run_id],
                                 capture_output=True, text=True, timeout=60)  # fmt: skip
        assert planted.returncode == 0, planted.stderr[-2000:]
        assert "does not hold stage 0" in planted.stdout
        assert d1.status()["standby_copies"]["refused"] == 1
    finally:
        for d in (d0, d1):
            d.stop(timeout=60)


@pytest.fixture
def pair(workdir: Path, make_run: Callable[..., str]) -> Iterator[tuple[str, LocalDaemon, LocalDaemon]]:
    """Two training daemons of a fresh run, both running; stopped afterwards."""
    run_id = make_run(workdir / "d0")
    d0 = LocalDaemon(workdir / "d0", run_id, TRAINING)
    d1 = LocalDaemon(workdir / "d1", run_id, TRAINING)
    try:
        addrs = d0.start().wait_running()["addrs"]
        d1.start(addrs).wait_running()
        yield run_id, d0, d1
    finally:
        for d in (d0, d1):
            d.stop(timeout=60)


def test_a_killed_stage_host_is_replaced_with_no_update_lost(pair: tuple[str, LocalDaemon, LocalDaemon]) -> None:
    run_id, d0, d1 = pair

    # Each hosts one stage (which one follows the plan): d1's is the one killed with it.
    def one_each() -> bool:  # each daemon's status read once: hosting can change between reads
        h1, h0 = hosted(d1), hosted(d0)
        return len(h1) == 1 and max(h1.values()) >= 25 and len(h0) == 1

    wait_for(one_each, 120, "d1 to host a stage through 25 updates, d0 the other")
    ((s, _),) = hosted(d1).items()
    # d1 copies each checkpoint (every 10 updates) to its standby, d0, and logs every push
    # there before applying it.
    copies = run_checkpoint_dir(d0.state_dir, run_id) / f"stage{s}.safetensors"
    wait_for(lambda: (checkpoint_version(copies) or 0) >= 20, 30, f"a standby copy of stage {s} at d0")
    assert d0.status()["standby_copies"]["logged"] > 0
    at_kill = hosted(d1)[s]
    d1.kill()  # SIGKILL: no release, no last checkpoint
    # d0 sees d1's heartbeat go (TTL 8 s), voids its lease, and hosts the stage from the copy
    # plus the logged pushes since: every update d1 made (and told a worker of) survives.
    wait_for(lambda: sorted(hosted(d0)) == [0, 1], 60, f"d0 to take stage {s} over")
    resumed = hosted(d0)[s]
    print(f"stage {s} was at version {at_kill} when its host was killed; resumed at {resumed}")
    assert resumed >= at_kill
    wait_for(lambda: hosted(d0)[s] > at_kill, 60, "training to go on past the kill")


def test_export_gathers_the_stages_from_the_swarm(workdir: Path, pair: tuple[str, LocalDaemon, LocalDaemon]) -> None:
    run_id, d0, d1 = pair
    wait_for(lambda: len(hosted(d1)) == 1 and len(hosted(d0)) == 1 and min(hosted(d0).values()) >= 2, 90,
             "the stages to spread and train")  # fmt: skip
    ((s, _),) = hosted(d1).items()  # which stage d1 got follows the plan
    # d0 holds d1's stage only as it was when it handed it over (if at all): the export must fetch it.
    stale = checkpoint_version(run_checkpoint_dir(d0.state_dir, run_id) / f"stage{s}.safetensors") or 0
    wait_for(lambda: hosted(d1)[s] > stale, 60, f"stage {s} to move on at d1")
    out = workdir / "exported"
    export = [sys.executable, "-m", "swarmd", "export", "--run-id", run_id, str(out)]
    export += ["--state-dir", str(d0.state_dir)]
    result = subprocess.run(export, capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr[-2000:]
    versions = [int(v) for v in result.stdout.split("versions [")[1].split("]")[0].split(",")]
    assert min(versions) >= 2 and versions[s] > stale, result.stdout
    assert (out / "config.json").exists()


def test_a_corpus_missing_here_fails_training_not_the_daemon(workdir: Path) -> None:
    import json

    from swarmd.local_swarm import create_run
    from swarmd.models.presets import DEFAULT_RUN

    spec = workdir / "spec.json"
    spec.write_text(json.dumps({**DEFAULT_RUN, "name": "elsewhere", "data": {"corpus": "/nonexistent/corpus.txt"}}))
    run_id = create_run(workdir / "d0", spec)
    d0 = LocalDaemon(workdir / "d0", run_id, TRAINING)
    try:
        d0.start().wait_running()
        wait_for(lambda: training(d0).get("state") == "failed", 60, "training to fail")
        assert "/nonexistent/corpus.txt" in training(d0)["error"]
        assert d0.status()["state"] == "running"  # the daemon stays a member of the swarm
    finally:
        assert d0.stop(timeout=60) == 0
