"""A private run (``membership = "token"``): a daemon with the creator's token joins and trains;
one without is refused with a clear error; strangers' heartbeats never make members.

- the creator signs a token for the joiner (``swarmd run token``); the joiner runs with
  ``--join-token`` and the two train together (the joiner takes a cell, the shards' versions
  climb);
- a daemon with no token stops on joining with a one-line error naming the run and the command
  to ask the creator for; it never shows up among the creator's members;
- a stranger writes valid heartbeats of its own into the run's DHT key (no token; a token it
  signed itself): the DHT accepts them (they are well-formed and signed), the creator's
  membership refuses them and counts the refusals in its status, and never lists the stranger;
- a stranger (a fresh key) asks the members for what a private run keeps to itself by default
  (the spec says nothing of ``checkpoints``): a shard's weights (``shard.pull``, and a reduction
  head's ``cell.pull``), a standby's replica (optimizer state), the data manifest, the tokenizer
  and a token shard (``data.fetch``). Each is refused NOT_MEMBER with no blob, while the joiner,
  a member, fetched the same files from the creator.

The run is the ``tiny-llama-bpe`` preset, made private: the creator holds its prepared data,
the joiner fetches what it trains on.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from swarmd.models.data.manifest import Manifest
from swarmd.models.presets import PRESETS, materialize
from swarmd.peers.records.identity import load_or_create_identity
from swarmd.peers.wire.file_messages import MAX_CHUNK_BYTES, FileFetch
from swarmd.peers.wire.messages import Pull, PullFromHead, ReplicaFetch
from swarmd.system.local_swarm import LocalDaemon, create_run, wait_for
from swarmd.system.state_dir import prepare_state_dir
from tests.integration.conftest import Swarmd

pytestmark = [pytest.mark.integration, pytest.mark.timeout(420)]

# Runs in its own interpreter (hivemind must not share the test process with py-libp2p): a
# plain hivemind DHT joins the swarm and stores two valid heartbeats under the run's members
# key, one with no token and one with a token its signer made for a run of its own.
STRANGERS = r"""
import json, sys, time
import hivemind
from swarmd.peers.dht.swarm_dht import member_bucket, members_key
from swarmd.peers.records.heartbeat import DeviceInfo, Heartbeat
from swarmd.peers.records.identity import Identity
from swarmd.peers.records.join_token import sign_join_token
from swarmd.peers.records.run_id import derive_run_id

run_id, bootstrap = sys.argv[1], sys.argv[2:]
dht = hivemind.DHT(initial_peers=bootstrap, start=True, host_maddrs=["/ip4/127.0.0.1/tcp/0"],
                   nat_port_map=False, auto_nat=False, use_relay=False)
now = time.time()  # stored for no longer than the heartbeat lives, or the validators refuse it
def beat(who, token=""):
    return Heartbeat(run_id=run_id, peer_id=who.peer_id, issued_at=now, expires_at=now + 120, addrs=[],
                     device=DeviceInfo(kind="cpu", name="x", memory_bytes=1, cpus=1), throughput_gflops=1.0,
                     version="0", roles=["worker"], uptime_s=1.0, join_token=token).sign(who)
plain, forger = Identity.generate(), Identity.generate()
own_run = derive_run_id(run_id.split(".")[0], forger.public_key)
forged = sign_join_token(forger, own_run, forger.peer_id, now=now, days=1).text
def store(who, token):
    key = members_key(run_id, member_bucket(who.peer_id))
    return dht.store(key, beat(who, token), now + 120, subkey=who.peer_id)
stored = {name: store(who, token)
          for name, who, token in (("plain", plain, ""), ("forged", forger, forged))}
print(json.dumps({"peers": [plain.peer_id, forger.peer_id], "stored": stored}), flush=True)
dht.shutdown()
"""


# Runs in its own interpreter too: a fresh key's hivemind p2pd sends each request (a header the
# test made) to the member named, and prints what came back: the refusal's code, or the blobs.
STRANGER_READS = r"""
import asyncio, json, sys, tempfile
from pathlib import Path
from swarmd.peers.dht.swarm_dht import SwarmDHT
from swarmd.peers.records.identity import Identity, write_p2pd_identity
from swarmd.peers.wire.rpc import exchange

job = json.loads(sys.argv[1])
async def ask(dht):
    p2p, out = await dht.replicate_p2p(), {}
    for peer in job["peers"]:
        await dht.add_peers(peer["peer_id"], peer["addrs"])
    for name, (peer_id, header) in job["requests"].items():
        answer, blobs = await exchange(p2p, peer_id, header, timeout_s=30)
        out[name] = {"code": answer.get("code") if answer.get("ok") is False else "OK", "blobs": len(blobs),
                     "bytes": sum(map(len, blobs))}
    return out
with tempfile.TemporaryDirectory(prefix="stranger-") as folder:
    stranger = Identity.generate()
    dht = SwarmDHT(job["run_id"], identity_path=str(write_p2pd_identity(stranger, Path(folder))),
                   initial_peers=job["peers"][0]["addrs"], host_maddrs=["/ip4/127.0.0.1/tcp/0"],
                   nat_port_map=False, relay=False)
    dht.start()
    try:
        answers = asyncio.run(ask(dht))
    finally:
        dht.shutdown()
print(json.dumps({"stranger": stranger.peer_id, "answers": answers}), flush=True)
"""


def training(daemon: LocalDaemon) -> dict[str, Any]:
    return (daemon.status() or {}).get("training") or {}


def versions(daemons: list[LocalDaemon]) -> dict[int, int]:
    """Stage -> the highest version any of ``daemons`` serves."""
    out: dict[int, int] = {}
    for daemon in daemons:
        for shard in training(daemon).get("shards") or []:
            out[shard["stage"]] = max(out.get(shard["stage"], 0), shard["version"])
    return out


def peer_id_of(state_dir: Path) -> str:
    return load_or_create_identity(prepare_state_dir(state_dir)).peer_id


def test_a_token_run_admits_the_token_holder_and_no_one_else(
    workdir: Path, daemon_factory: Callable[..., LocalDaemon], swarmd: Swarmd
) -> None:
    spec = materialize(PRESETS["tiny-llama-bpe"], workdir / "files")  # its data, held by the creator
    spec.write_text(json.dumps({**json.loads(spec.read_text()), "name": "private", "access": {"membership": "token"}}))
    creator_dir, joiner_dir, outsider_dir = workdir / "a", workdir / "b", workdir / "c"
    run_id = create_run(creator_dir, spec)
    issued = swarmd(
        "run", "token", "--run-id", run_id, "--peer", peer_id_of(joiner_dir), "--state-dir", str(creator_dir)
    )
    assert issued.returncode == 0, issued.stderr
    token = issued.stdout.strip()

    creator = daemon_factory(creator_dir, run_id, train=True)
    joiner = daemon_factory(joiner_dir, run_id, ["--join-token", token], train=True)
    outsider = daemon_factory(outsider_dir, run_id)  # no token, and no training: it only has to be refused
    running = creator.start().wait_running()
    addrs, creator_id = running["addrs"], running["peer_id"]
    joiner_id = joiner.start(addrs).wait_running()["peer_id"]
    wait_for(lambda: creator.seen_peers() == {joiner_id} and joiner.seen_peers() == {creator_id}, 60, "admission")

    # Without a token, a daemon stops on joining, saying what to ask for.
    outsider.start(addrs)
    assert outsider.proc is not None
    wait_for(lambda: outsider.proc is not None and outsider.proc.poll() is not None, 120, "the outsider to stop")
    log = outsider.log_tail()
    assert outsider.proc.returncode == 1, log
    outsider_id = peer_id_of(outsider_dir)
    assert f"run {run_id} is private" in log
    assert f"swarmd run token --run-id {run_id} --peer {outsider_id}" in log
    assert "Traceback" not in log

    # Strangers' own heartbeats are valid records, so the DHT keeps them; membership refuses them.
    out = subprocess.run([sys.executable, "-c", STRANGERS, run_id, *addrs], capture_output=True, text=True, timeout=90)
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert all(report["stored"].values()), report  # the gate is membership's, not the DHT's
    strangers = set(report["peers"])

    def refused() -> dict[str, int] | None:
        status = creator.status() or {}
        seen = {p["peer_id"] for p in status.get("peers", [])}
        assert not seen & (strangers | {outsider_id}), f"a refused peer became a member: {seen}"
        counts: dict[str, int] = status.get("refused_members") or {}
        return counts if counts.get("no-token", 0) >= 1 and counts.get("bad-token", 0) >= 1 else None

    counts = wait_for(refused, 60, "the creator to refuse both strangers' heartbeats", poll_s=0.5)
    print(f"refused at the creator: {counts}")

    # Meanwhile, and after, the token holder trains beside the creator.
    wait_for(lambda: training(joiner).get("cells"), 120, "the joiner to take a cell")
    start = versions([creator, joiner])

    def trained_on() -> bool:
        now = versions([creator, joiner])
        return len(now) == 2 and all(now[s] >= start.get(s, 0) + 3 for s in now)

    wait_for(trained_on, 180, "training to go on over the creator and the joiner", poll_s=0.5)
    assert creator.seen_peers() == {joiner_id}

    # A stranger asks for the weights, a replica and the data; the joiner fetched the same data.
    fetched = (joiner.status() or {}).get("data") or {}
    assert sum(fetched["fetch"]["fetched_files"].values()) >= 2, fetched  # the manifest, the tokenizer, shards
    answers = stranger_reads(workdir, run_id, [creator, joiner])
    print(f"a stranger's reads: {answers}")
    assert answers and all(a == {"code": "NOT_MEMBER", "blobs": 0, "bytes": 0} for a in answers.values()), answers


def stranger_reads(workdir: Path, run_id: str, members: list[LocalDaemon]) -> dict[str, dict[str, Any]]:
    """What a fresh key gets back when it asks ``members`` for a shard's weights (its holder),
    a replica (its standby, else any member), and the data files (the creator, ``members[0]``)."""
    statuses = [m.status() or {} for m in members]
    holder = next(s for s in statuses if training_of(s).get("shards"))
    shard = training_of(holder)["shards"][0]
    where = {k: shard[k] for k in ("stage", "shard", "shards")}
    key = f"{shard['stage']}/{shard['shard']}"
    standby = next(
        (s for s in statuses if key in (training_of(s).get("replicas") or {}).get("shards", {})), statuses[-1]
    )
    pull = {"run_id": run_id, **where, "have_version": -1, "pending_share_ids": [], "wait_s": 0.0}
    manifest_file = workdir / "files" / "data" / "manifest.json"
    manifest = Manifest.parse(manifest_file.read_bytes())
    files = {
        "manifest": hashlib.sha256(manifest_file.read_bytes()).hexdigest(),
        "tokenizer": manifest.tokenizer.sha256,
        "train_shard": manifest.train[0].sha256,
    }
    requests = {
        "shard.pull": (holder["peer_id"], Pull(**pull).encode()[0]),
        "cell.pull": (holder["peer_id"], PullFromHead(**pull, pipeline=0).encode()[0]),
        "replica.fetch": (
            standby["peer_id"],
            ReplicaFetch(run_id=run_id, stage=shard["stage"], shard=shard["shard"], after_version=-1).encode()[0],
        ),
        **{
            f"data.fetch {name}": (
                statuses[0]["peer_id"],
                FileFetch(run_id=run_id, sha256=digest, offset=0, length=MAX_CHUNK_BYTES).encode()[0],
            )
            for name, digest in files.items()
            if digest
        },
    }
    job = {"run_id": run_id, "peers": [{"peer_id": s["peer_id"], "addrs": s["addrs"]} for s in statuses]}
    out = subprocess.run(
        [sys.executable, "-c", STRANGER_READS, json.dumps({**job, "requests": requests})],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    # The member counted the stranger's refusals (the request server's gate, before any blob).
    offenders = ((members[0].status() or {}).get("rpc") or {}).get("offenders") or {}
    assert offenders.get(report["stranger"], {}).get("NOT_MEMBER", 0) >= 1, offenders
    return dict(report["answers"])


def training_of(status: dict[str, Any]) -> dict[str, Any]:
    return status.get("training") or {}
