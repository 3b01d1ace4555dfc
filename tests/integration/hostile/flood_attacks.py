"""Mallory on the DHT and the transport: forged leases and plans, claim floods,
oversized frames, slow-loris streams and large requests. Each attack returns
``{step: outcome}`` (``mallory.summary``'s forms)."""

from __future__ import annotations

import argparse
import asyncio
import json
import struct
import time
from typing import TYPE_CHECKING, Any

from swarmd.peers.dht.swarm_dht import cells_key, shards_key
from swarmd.peers.records.plan_record import KIND as PLAN_KIND
from swarmd.peers.wire.framing import read_message
from swarmd.peers.wire.messages import Contribute, Pull
from swarmd.peers.wire.rpc import PROTOCOL
from tests.integration.hostile import forgery
from tests.integration.hostile.wire_attacks import FAKE_SHARE, shard_holder

if TYPE_CHECKING:
    from tests.integration.hostile.mallory import Mallory, Outcome

DECLARED_BYTES = 200 * 2**20
BIG_REQUEST_BYTES = 48 * 2**20


def _tally(outcomes: list[Outcome]) -> dict[str, int]:
    out: dict[str, int] = {}
    for got in outcomes:
        key = "ok" if got.get("ok") else str(got.get("code") or got.get("error", "?"))[:60]
        out[key] = out.get(key, 0) + 1
    return out


async def leases(mallory: Mallory, swarm: dict[str, Any], args: argparse.Namespace) -> dict[str, Outcome]:
    """Mallory claims every cell and shard in force, claimed an hour ago, at version 10^6."""
    steps: dict[str, Outcome] = {}
    run_id, me = mallory.run_id, mallory.identity.peer_id
    expires = time.time() + 100  # within the records' own lifetime (the validator checks)
    for peer in swarm["peers"]:
        for cell in peer["cells"]:
            raw = forgery.cell_lease(mallory.identity, run_id, cell["pipeline"], cell["stage"])
            stored = await mallory.store(cells_key(run_id, cell["pipeline"], cell["stage"]), me, raw, expires)
            steps[f"cell_lease_{cell['pipeline']}_{cell['stage']}"] = {"ok": True, "stored": stored}
        for shard in peer["shards"]:
            raw = forgery.shard_lease(mallory.identity, run_id, shard["stage"], shard["shard"], shard["shards"], 10**6)
            stored = await mallory.store(shards_key(run_id, shard["stage"]), me, raw, expires)
            steps[f"shard_lease_{shard['stage']}_{shard['shard']}"] = {"ok": True, "stored": stored}
    return steps


async def plan_takeover(mallory: Mallory, swarm: dict[str, Any], args: argparse.Namespace) -> dict[str, Outcome]:
    """A plan at version 2^53 that makes Mallory the server, relay and every cell."""
    me = mallory.identity.peer_id
    devices = [me, *(p["peer_id"] for p in swarm["peers"])]
    raw = forgery.plan(mallory.identity, mallory.run_id, 2**53, devices, swarm["stages"], swarm["layers"])
    stored = await mallory.swarm_dht.publish_peer_record(PLAN_KIND, me, raw, time.time() + 500)
    return {"plan_2_53": {"ok": True, "stored": stored}}


async def claim_flood(mallory: Mallory, swarm: dict[str, Any], args: argparse.Namespace) -> dict[str, Outcome]:
    """Claims as fast as Mallory can sign and store them for ``--duration`` seconds: the cells
    in force again and again, and cells of pipelines that do not exist."""
    run_id, me, identity = mallory.run_id, mallory.identity.peer_id, mallory.identity
    deadline = time.monotonic() + (args.duration or 20.0)
    in_force = [(c["pipeline"], c["stage"]) for p in swarm["peers"] for c in p["cells"]]
    stored = sent = 0
    pipeline = 1
    while time.monotonic() < deadline and (not args.count or sent < args.count):
        batch = [*in_force, *((pipeline + i, s) for i in range(8) for s in range(swarm["stages"]))]
        pipeline += 8
        expires = time.time() + 100  # within the records' own lifetime (the validator checks)
        results = await asyncio.gather(
            *(
                mallory.store(cells_key(run_id, p, s), me, forgery.cell_lease(identity, run_id, p, s), expires)
                for p, s in batch
            )
        )
        sent += len(results)
        stored += sum(results)
    return {"claim_flood": {"ok": True, "sent": sent, "stored": stored}}


async def _raw_stream(mallory: Mallory, peer_id: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    from hivemind.p2p import PeerID

    _, reader, writer = await mallory.p2p.call_binary_stream_handler(PeerID.from_base58(peer_id), PROTOCOL)
    return reader, writer


async def _answer(reader: asyncio.StreamReader, timeout_s: float) -> Outcome:
    from tests.integration.hostile.mallory import summary

    try:
        header, blobs = await read_message(reader, 2**20, timeout_s)
    except Exception as e:
        return {"error": f"{type(e).__name__}: {e}"[:200]}
    return summary(header, blobs)


def _pull_header(mallory: Mallory, shard: dict[str, Any]) -> dict[str, Any]:
    request = Pull(
        run_id=mallory.run_id,
        stage=shard["stage"],
        shard=shard["shard"],
        shards=shard["shards"],
        have_version=shard["version"],
        pending_share_ids=[],
        wait_s=0.0,
    )
    return request.encode()[0]


def _contribute_header(mallory: Mallory, shard: dict[str, Any], n: int) -> bytes:
    request = Contribute(
        run_id=mallory.run_id,
        stage=shard["stage"],
        shard=shard["shard"],
        shards=shard["shards"],
        share_ids=[FAKE_SHARE + n],
        base_version=shard["version"],
        micro_batches=4,
        kind="gradient",
        codec="fp32",
    )
    return json.dumps(request.encode([b"x"])[0], separators=(",", ":")).encode()


async def oversized(mallory: Mallory, swarm: dict[str, Any], args: argparse.Namespace) -> dict[str, Outcome]:
    """Frames that declare 200 MiB: as a header, as the blob of a method that takes none, and
    as a contribution's blob of which only 64 KiB ever come (the rest never sent)."""
    server, shard = shard_holder(swarm, 0)
    steps: dict[str, Outcome] = {}
    pull = json.dumps(_pull_header(mallory, shard), separators=(",", ":")).encode()
    contribute = _contribute_header(mallory, shard, 7)
    for name, prefix, tail in (
        ("header_200MiB", struct.pack("<I", DECLARED_BYTES), b"{"),
        ("pull_blob_200MiB", struct.pack("<I", len(pull)) + pull + struct.pack("<II", 1, DECLARED_BYTES), b""),
        (
            "contribute_blob_200MiB_stalled",
            struct.pack("<I", len(contribute)) + contribute + struct.pack("<II", 1, DECLARED_BYTES),
            bytes(64 * 1024),
        ),
    ):
        reader, writer = await _raw_stream(mallory, server["peer_id"])
        started = time.monotonic()
        writer.write(prefix + tail)
        await writer.drain()
        steps[name] = {**await _answer(reader, 60.0), "seconds": round(time.monotonic() - started, 1)}
        writer.close()
    return steps


async def lurk(mallory: Mallory, swarm: dict[str, Any], args: argparse.Namespace) -> dict[str, Outcome]:
    """Be a node of the run's DHT for ``--duration`` seconds and nothing else: how much a slow
    or frozen DHT node costs the swarm is measured by holding this process back (a cgroup, or
    SIGSTOP) while it lurks."""
    await asyncio.sleep(args.duration or 20.0)  # sync-ok: the attack is to be present this long
    return {"lurk": {"ok": True}}


async def spin(mallory: Mallory, swarm: dict[str, Any], args: argparse.Namespace) -> dict[str, Outcome]:
    """Burn CPU for ``--duration`` seconds and send nothing: the control for a flood on a shared
    machine (what taking Mallory's CPU share from the daemons costs alone)."""
    deadline = time.monotonic() + (args.duration or 20.0)
    while time.monotonic() < deadline:
        sum(range(10_000))
        await asyncio.sleep(0)  # sync-ok: yield to the loop between bursts of CPU
    return {"spin": {"ok": True}}


async def slowloris(mallory: Mallory, swarm: dict[str, Any], args: argparse.Namespace) -> dict[str, Outcome]:
    """``--count`` streams (40 by default) to every peer, each sending 3 bytes then nothing,
    held ``--duration`` seconds (20); meanwhile a small pull each second says whether the
    peer still reads requests (refused NOT_MEMBER: read; BUSY: its slots are gone)."""
    count, duration = args.count or 40, args.duration or 20.0
    held: list[asyncio.StreamWriter] = []
    failed = 0
    for peer in swarm["peers"]:
        for _ in range(count):
            try:
                _, writer = await asyncio.wait_for(_raw_stream(mallory, peer["peer_id"]), 10)
            except Exception:
                failed += 1
                continue
            writer.write(b"\x10\x00\x00")
            held.append(writer)
    server, shard = shard_holder(swarm, 0)
    probes: list[Outcome] = []
    deadline = time.monotonic() + duration
    while time.monotonic() < deadline:
        probes.append(await mallory.send(server["peer_id"], _pull_header(mallory, shard), timeout_s=10))
        await asyncio.sleep(1.0)  # sync-ok: one honest probe a second while the streams stall
    for writer in held:
        writer.close()
    steps: dict[str, Outcome] = {
        "slowloris": {"ok": True, "streams": len(held), "failed": failed, "probes": json.dumps(_tally(probes))}
    }
    return steps


async def big_requests(mallory: Mallory, swarm: dict[str, Any], args: argparse.Namespace) -> dict[str, Outcome]:
    """Four 48 MiB contributions at once to one server (a frame of the wrong length)."""
    server, shard = shard_holder(swarm, 0)
    elements = (BIG_REQUEST_BYTES - 64) // 4
    blob = forgery.frame(forgery.vector(elements, 0.0))
    headers = [json.loads(_contribute_header(mallory, shard, 100 + i)) for i in range(args.count or 4)]
    started = time.monotonic()
    outcomes = await asyncio.gather(*(mallory.send(server["peer_id"], h, [blob], timeout_s=120) for h in headers))
    return {
        "big_requests": {
            "ok": True,
            "answers": json.dumps(_tally(list(outcomes))),
            "seconds": round(time.monotonic() - started, 1),
        }
    }
