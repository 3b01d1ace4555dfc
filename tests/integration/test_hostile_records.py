"""A hostile peer in the swarm's DHT stores forged and garbled records; no daemon believes them."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from swarmd.system.local_swarm import LocalDaemon, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

# Runs in its own interpreter (the test process may hold py-libp2p, which cannot share one
# with hivemind). A plain hivemind DHT with no validator joins the swarm and writes under the
# run's members key: garbage, a heartbeat signed by one key claiming another peer's ID, a
# heartbeat of another run, and an expired one. Prints what each store returned.
HOSTILE = r"""
import json, sys, time
import hivemind
from hivemind.utils.timed_storage import get_dht_time
from swarmd.peers.records.heartbeat import DeviceInfo, Heartbeat
from swarmd.peers.records.identity import Identity
from swarmd.peers.records.envelope import sign_record
from dataclasses import asdict
from swarmd.peers.dht.swarm_dht import member_bucket, members_key

run_id, victim, bootstrap = sys.argv[1], sys.argv[2], sys.argv[3:]
dht = hivemind.DHT(initial_peers=bootstrap, start=True, host_maddrs=["/ip4/127.0.0.1/tcp/0"],
                   nat_port_map=False, auto_nat=False, use_relay=False)
mallory, now = Identity.generate(), time.time()
def beat(**kw):
    base = dict(run_id=run_id, peer_id=mallory.peer_id, issued_at=now, expires_at=now + 60, addrs=[],
                device=DeviceInfo(kind="cpu", name="x", memory_bytes=1, cpus=1), throughput_gflops=1.0,
                version="0", roles=["worker"], uptime_s=1.0)
    base.update(kw)
    return Heartbeat(**base)
impostor = sign_record(mallory, "heartbeat", asdict(beat(peer_id=victim)))  # claims the victim's ID
attempts = {
    "garbage": (mallory.peer_id, b"\x00not a record"),
    "impostor": (victim, impostor),
    "other_run": (mallory.peer_id, beat(run_id="other.aaaaaaaaaaaaaaaaaaaaaaaa").sign(mallory)),
    "expired": (mallory.peer_id, beat(issued_at=now - 120, expires_at=now - 60).sign(mallory)),
}
results = {}
for name, (subkey, value) in attempts.items():
    results[name] = dht.store(members_key(run_id, member_bucket(subkey)), value, get_dht_time() + 60, subkey=subkey)
print(json.dumps({"mallory": mallory.peer_id, "stored": results}), flush=True)
dht.shutdown()
"""


def test_forged_and_garbled_heartbeats_are_refused(
    workdir: Path, make_run: Callable[..., str], daemon_factory: Callable[..., LocalDaemon]
) -> None:
    run_id = make_run(workdir / "d0")
    d0 = daemon_factory(workdir / "d0", run_id).start()
    bootstrap = d0.wait_running()["addrs"]
    d1 = daemon_factory(workdir / "d1", run_id).start(bootstrap)
    id0, id1 = d0.wait_running()["peer_id"], d1.wait_running()["peer_id"]
    wait_for(lambda: d0.seen_peers() == {id1} and d1.seen_peers() == {id0}, 60, "d0 and d1 to see each other")

    out = subprocess.run(
        [sys.executable, "-c", HOSTILE, run_id, id1, *bootstrap], capture_output=True, text=True, timeout=90
    )
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    # The daemons' DHT validators refused every write (the hostile node keeps only its own copy).
    assert not any(report["stored"].values()), report

    # Several membership scans later, neither daemon sees Mallory, and d1 is still d1.
    scans = {"n": 0}

    def scanned_a_few_times() -> bool:
        scans["n"] += 1
        assert d0.seen_peers() == {id1} and d1.seen_peers() == {id0}
        return scans["n"] >= 10

    wait_for(scanned_a_few_times, 60, "ten membership checks", poll_s=0.5)
    status = d0.status()
    assert status is not None
    (peer,) = status["peers"]
    assert peer["peer_id"] == id1 and peer["device"]["name"] != "x"
