"""A daemon alone trains the whole run; a second one stands by and takes over when it stops."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
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
from swarmd.peers.stage_rpc import RpcError, call

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

TRAINING = ["--heartbeat-interval", "1", "--heartbeat-ttl", "8", "--no-benchmark"]


def training(daemon: LocalDaemon) -> dict[str, Any]:
    status = daemon.status()
    return (status or {}).get("training") or {}


def test_one_daemon_trains_and_hands_over_on_stop(workdir: Path, make_run: Callable[..., str]) -> None:
    run_id = make_run(workdir / "d0")
    d0 = LocalDaemon(workdir / "d0", run_id, TRAINING)
    d1 = LocalDaemon(workdir / "d1", run_id, TRAINING)
    try:
        d0.start()
        addrs = d0.wait_running()["addrs"]
        wait_for(lambda: training(d0).get("updates", 0) >= 3, 90, "d0 to make 3 updates")
        first = training(d0)
        assert first["state"] == "training" and first["loss"] is not None

        d1.start(addrs)
        d1_id = d1.wait_running()["peer_id"]
        wait_for(lambda: training(d1).get("holder") == d0.status()["peer_id"], 30, "d1 to see d0 holding the stages")
        assert training(d1)["state"] == "waiting"
        wait_for(lambda: d1_id in d0.seen_peers(), 30, "d0 to see d1 (its standby)")

        assert d0.stop(timeout=60) == 0, d0.log_tail()
        # d0 checkpointed every stage on the way out, at the update it had reached.
        versions = [read_checkpoint_weights(run_checkpoint_dir(d0.state_dir, run_id) / f"stage{s}.safetensors")[0]
                    for s in (0, 1)]  # fmt: skip
        assert min(versions) >= 3
        # ... and copied them to its standby, d1, before releasing the stages.
        copies = [checkpoint_version(run_checkpoint_dir(d1.state_dir, run_id) / f"stage{s}.safetensors")
                  for s in (0, 1)]  # fmt: skip
        assert copies == versions
        # Its leases were released, not left to expire: d1 claims the stages and trains on from
        # where d0 stopped, not from scratch.
        wait_for(lambda: training(d1).get("updates", 0) > min(versions), 60, "d1 to train on from d0's updates")
        assert training(d1)["holder"] == d1_id and training(d1)["state"] == "training"

        # A peer that holds no stage cannot plant weights on anyone: refused and counted.
        planted = subprocess.run([sys.executable, "-c", PLANT, d1.status()["addrs"][0], run_id],
                                 capture_output=True, text=True, timeout=60)  # fmt: skip
        assert planted.returncode == 0, planted.stderr[-2000:]
        assert "does not hold stage 0" in planted.stdout
        assert d1.status()["standby_copies"]["refused"] == 1
    finally:
        for d in (d0, d1):
            d.stop(timeout=60)


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
