"""The DHT survives: a daemon whose DHT process is killed restarts it and keeps answering, and
a flood of 500 fresh keys' heartbeats leaves every daemon answering, its DHT process alive."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from swarmd.system.local_swarm import LocalDaemon, wait_for
from tests.integration.procfs import processes

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

SYBILS = 500

# Runs in its own interpreter (hivemind and py-libp2p cannot share one). A plain hivemind DHT
# joins the swarm and stores one valid, signed heartbeat for each of SYBILS fresh keys, each
# under its bucket's key, as a Sybil would; prints how many the swarm's nodes accepted.
FLOOD = r"""
import json, sys, time
import hivemind
from swarmd.peers.records.heartbeat import DeviceInfo, Heartbeat
from swarmd.peers.records.identity import Identity
from swarmd.peers.dht.swarm_dht import member_bucket, members_key

run_id, count, bootstrap = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
dht = hivemind.DHT(initial_peers=bootstrap, start=True, host_maddrs=["/ip4/127.0.0.1/tcp/0"],
                   nat_port_map=False, auto_nat=False, use_relay=False)
now, futures = time.time(), []
for _ in range(count):
    sybil = Identity.generate()
    beat = Heartbeat(run_id=run_id, peer_id=sybil.peer_id, issued_at=now, expires_at=now + 120, addrs=[],
                     device=DeviceInfo(kind="cpu", name="sybil", memory_bytes=1, cpus=1), throughput_gflops=1e6,
                     version="0", roles=["worker"], uptime_s=1e6)
    key = members_key(run_id, member_bucket(sybil.peer_id))
    futures.append(dht.store(key, beat.sign(sybil), beat.expires_at, subkey=sybil.peer_id, return_future=True))
stored = sum(bool(f.result(60)) for f in futures)
print(json.dumps({"stored": stored}), flush=True)
dht.shutdown()
"""


def dht_process(daemon: LocalDaemon) -> int:
    """The daemon's DHT process: its child that runs p2pd."""
    procs = processes()
    children = [p for p, (parent, _) in procs.items() if parent == daemon.pid]
    found = [c for c in children if any(parent == c and name == "p2pd" for parent, name in procs.values())]
    assert len(found) == 1, f"expected one DHT process under {daemon.pid}, found {found} among {children}"
    return found[0]


def answers(daemon: LocalDaemon) -> dict:
    """Its status, which must come within the control call's own timeout every time."""
    status = daemon.status()
    assert status is not None, f"daemon {daemon.pid} did not answer status:\n{daemon.log_tail()}"
    return status


def test_killed_dht_process_is_restarted(
    workdir: Path, make_run: Callable[..., str], daemon_factory: Callable[..., LocalDaemon]
) -> None:
    run_id = make_run(workdir / "d0")
    d0 = daemon_factory(workdir / "d0", run_id).start()
    bootstrap = d0.wait_running()["addrs"]
    d1 = daemon_factory(workdir / "d1", run_id).start(bootstrap)
    id0, id1 = d0.wait_running()["peer_id"], d1.wait_running()["peer_id"]
    wait_for(lambda: d0.seen_peers() == {id1} and d1.seen_peers() == {id0}, 60, "d0 and d1 to see each other")

    old = dht_process(d1)
    os.kill(old, signal.SIGKILL)  # the DHT process alone, as an out-of-memory kill would
    # d1 answers all along, restarts its DHT (same peer ID), and the two find each other again.
    wait_for(lambda: answers(d1).get("dht_restarts") == 1, 90, "d1 to restart its DHT process")
    assert dht_process(d1) != old
    status = answers(d1)
    assert status["peer_id"] == id1 and status["state"] == "running", status
    wait_for(lambda: answers(d0) and d0.seen_peers() == {id1} and d1.seen_peers() == {id0}, 90, "the two to meet again")
    assert "Traceback" not in d1.log_tail(400), d1.log_tail(400)
    assert d1.stop(timeout=30) == 0  # SIGTERM is still handled


def test_sybil_heartbeat_flood_leaves_daemons_answering(
    workdir: Path, make_run: Callable[..., str], daemon_factory: Callable[..., LocalDaemon]
) -> None:
    run_id = make_run(workdir / "d0")
    d0 = daemon_factory(workdir / "d0", run_id).start()
    bootstrap = d0.wait_running()["addrs"]
    d1 = daemon_factory(workdir / "d1", run_id).start(bootstrap)
    id0, id1 = d0.wait_running()["peer_id"], d1.wait_running()["peer_id"]
    wait_for(lambda: d0.seen_peers() == {id1} and d1.seen_peers() == {id0}, 60, "d0 and d1 to see each other")
    pids = {d.pid: dht_process(d) for d in (d0, d1)}

    flood = subprocess.Popen(
        [sys.executable, "-c", FLOOD, run_id, str(SYBILS), *bootstrap],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    # While the flood runs and after, both answer status (each call bounded by its own timeout).
    while flood.poll() is None:
        for daemon in (d0, d1):
            answers(daemon)
        time.sleep(0.5)  # sync-ok: pacing the status calls, not synchronising: the loop ends on the flood's exit
    out, err = flood.communicate(timeout=30)
    assert flood.returncode == 0, err[-3000:]
    assert json.loads(out.strip().splitlines()[-1])["stored"] > 0  # the flood reached the swarm

    # Both daemons read the flood (membership scans are bounded per bucket), keep each other,
    # and their DHT processes never died.
    wait_for(lambda: len(d0.seen_peers()) > 100 and len(d1.seen_peers()) > 100, 60, "the daemons to read the flood")
    for daemon in (d0, d1):
        status = answers(daemon)
        assert status["dht_restarts"] == 0 and dht_process(daemon) == pids[daemon.pid], status
        assert {id0, id1} - {status["peer_id"]} <= daemon.seen_peers()
        assert "Traceback" not in daemon.log_tail(400), daemon.log_tail(400)
