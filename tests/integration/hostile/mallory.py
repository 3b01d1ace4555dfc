"""Mallory: joins a real run's DHT with a fresh key and attacks its daemons; prints one JSON line.

    python -m tests.integration.hostile.mallory ATTACK [ATTACK ...] --swarm swarm.json [--member]

Run from the repository root, in a process of its own (hivemind cannot share an interpreter
with py-libp2p, which the test process may hold). ``swarm.json`` describes the run as the
test read it from the daemons' status: ``run_id``, ``bootstrap`` addresses, ``stages``,
``layers``, and per peer its ``peer_id``, ``addrs``, ``cells`` (pipeline, stage, epoch),
``shards`` (stage, shard, shards, version), whether it keeps the ``ledger``, and the
``replicas`` it stands by for (``"stage/shard"``). Mallory's p2pd runs with its own key, so
every request carries its true peer ID: a STRANGER (no heartbeat ever published) unless
``--member``, which first publishes a valid heartbeat and waits until a daemon serves it.

The line printed: ``{"attacks", "mallory", "member", "steps": {"attack.step": outcome}}``
(each attack's first step, ``placement``, says where Mallory found the cells and shards:
``tests.integration.hostile.placement``), each outcome
``{"ok": true, ...}`` (answered, with the answer's small fields), ``{"code": CODE, "detail"}``
(refused) or ``{"error": ...}`` (the transport failed: no stream, or the stream broke).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import signal
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from swarmd.peers.dht.swarm_dht import SwarmDHT
from swarmd.peers.records.identity import Identity, write_p2pd_identity
from swarmd.peers.wire.errors import RpcError
from swarmd.peers.wire.framing import read_message, write_message
from swarmd.peers.wire.messages import LedgerIssue
from swarmd.peers.wire.rpc import PROTOCOL
from tests.integration.hostile import election_attacks, flood_attacks, forgery, placement, share_attacks, wire_attacks

Outcome = dict[str, Any]
Attack = Callable[["Mallory", dict[str, Any], argparse.Namespace], Awaitable[dict[str, Outcome]]]
MEMBER_WAIT_S = 30.0


def summary(header: dict[str, Any], blobs: Sequence[bytes] = ()) -> Outcome:
    """What a step got back, small enough to print: the code, or the answer's scalar fields."""
    if header.get("ok") is False:
        return {"code": header.get("code"), "detail": str(header.get("detail"))[:200]}
    small = {k: v for k, v in header.items() if isinstance(v, bool | int | float | str) and len(str(v)) < 80}
    return {**small, "blobs": len(blobs), "blob_bytes": sum(len(b) for b in blobs)}


Stored = tuple[str, str | None, bytes, float]
"""A record to store: its key, its subkey (None for a plain value), its bytes, its expiry."""
LOT_BYTES = 64 * 1024
"""The most record bytes ``Mallory.store_many`` sends in one DHT call."""


async def _store_many(records: list[Stored], dht: Any, node: Any) -> dict[Any, bool]:
    """Run in the DHT process (pickled into the request): ``Mallory.store_many``."""
    keys, subkeys, values, expiries = (list(column) for column in zip(*records, strict=True))
    return await node.store_many(keys, values, expiries, subkeys=subkeys)


class Mallory:
    """A DHT node and a p2p handle under one fresh key (its peer ID, ``identity.peer_id``)."""

    def __init__(self, identity: Identity, dht: SwarmDHT, run_id: str) -> None:
        self.identity, self.swarm_dht, self.run_id = identity, dht, run_id
        self.p2p: Any = None
        self.member = False
        self._beating: asyncio.Task[None] | None = None

    @classmethod
    def join(cls, run_id: str, bootstrap: list[str], folder: Path, identity: Identity | None = None) -> Mallory:
        identity = identity or Identity.generate()
        path = write_p2pd_identity(identity, folder)
        dht = SwarmDHT(
            run_id,
            identity_path=str(path),
            initial_peers=bootstrap,
            host_maddrs=["/ip4/127.0.0.1/tcp/0"],
            nat_port_map=False,
            relay=False,
        )
        dht.start()
        return cls(identity, dht, run_id)

    async def open(self, peers: list[dict[str, Any]]) -> None:
        self.p2p = await self.swarm_dht.replicate_p2p()
        for peer in peers:
            await self.swarm_dht.add_peers(peer["peer_id"], peer["addrs"])

    async def send(
        self, peer_id: str, header: dict[str, Any], blobs: Sequence[bytes] = (), timeout_s: float = 40.0
    ) -> Outcome:
        """One request, its answer read while it is still being written: a server that refuses
        after the header and closes the stream unread is heard, not taken for a broken stream."""
        from hivemind.p2p import PeerID

        try:
            _, reader, writer = await asyncio.wait_for(
                self.p2p.call_binary_stream_handler(PeerID.from_base58(peer_id), PROTOCOL), timeout_s
            )
        except Exception as e:
            return {"error": f"Unreachable: {type(e).__name__}: {str(e)[:160]}"}
        writing = asyncio.create_task(write_message(writer, header, blobs, max_bytes=2**31))
        try:
            answer, out = await read_message(reader, 2**30, timeout_s)
        except (RpcError, OSError) as e:  # OSError: the connection reset under the read
            if writing.done() and not writing.cancelled() and writing.exception() is not None:
                return {"error": f"StreamBroken: closed while written ({writing.exception()!r})"[:200]}
            kind = type(e).__name__ if isinstance(e, RpcError) else f"StreamBroken ({type(e).__name__})"
            return {"error": f"{kind}: {str(e)[:200]}"}
        finally:
            if not writing.done():
                writing.cancel()
            with contextlib.suppress(BaseException):
                await writing
            writer.close()
        return summary(answer, out)

    async def store(self, key: str, subkey: str, raw: bytes, expires_at: float) -> bool:
        # Through the DHT's pipe thread, as the daemons write: never from this event loop.
        return (await self.store_many([(key, subkey, raw, expires_at)]))[0]

    async def store_many(self, records: Sequence[Stored]) -> list[bool]:
        """Many records in a few calls (hivemind's ``store_many``: one search per key, one store
        request per node for all of a lot's keys), as a crowd's publisher would send them: one
        at a time, a Mallory stored about 18 a second. The daemons still check every record.
        Lots of at most ``LOT_BYTES`` go at once: with a 50-key lot (about half a megabyte) in
        one call, a sybil run once stored none of a kind, most likely past the 3 s a hivemind
        node waits for a store's answer."""
        lots: list[list[Stored]] = []
        size = LOT_BYTES
        for record in records:
            if size + len(record[2]) > LOT_BYTES:
                lots.append([])
                size = 0
            lots[-1].append(record)
            size += len(record[2])
        dht = self.swarm_dht.dht
        done: dict[Any, bool] = {}
        calls = [dht.ask(functools.partial(_store_many, lot)) for lot in lots]
        for found in await asyncio.gather(*calls):
            done |= found
        return [bool(done.get(key if subkey is None else (key, subkey))) for key, subkey, _, _ in records]

    async def become_member(self, peers: list[dict[str, Any]], roles: list[str]) -> Outcome:
        """Publish a valid heartbeat (again every 10 s) and wait until every one of ``peers``
        takes us for a member (each reads the heartbeats on its own schedule): a ledger request,
        which only members may make, refused for another reason than NOT_MEMBER (we hold no
        cell, and all but one keep no ledger: NOT_HOLDER). Returns the last answer of each."""
        addrs = await self.swarm_dht.visible_maddrs()

        async def beat() -> None:
            while True:
                raw = forgery.heartbeat(self.identity, self.run_id, addrs[:4], roles)
                await self.swarm_dht.publish_heartbeat(self.identity.peer_id, raw, time.time() + 50)
                await asyncio.sleep(10)  # sync-ok: the heartbeat's refresh interval

        self._beating = asyncio.create_task(beat())
        header, _ = LedgerIssue(run_id=self.run_id, pipeline=0, renew=[], want=0).encode()
        deadline = time.monotonic() + MEMBER_WAIT_S
        while True:
            answers = {p["peer_id"][:16]: await self.send(p["peer_id"], header) for p in peers}
            served = all("error" not in a and a.get("code") != "NOT_MEMBER" for a in answers.values())
            if served or time.monotonic() > deadline:
                self.member = served
                return {"ok": served, "answers": json.dumps({k: a.get("code") for k, a in answers.items()})}
            await asyncio.sleep(0.5)  # sync-ok: a poll interval inside the MEMBER_WAIT_S deadline

    def close(self) -> None:
        if self._beating is not None:
            self._beating.cancel()
        self.swarm_dht.shutdown()


ATTACKS: dict[str, Attack] = {
    "wire": wire_attacks.data_plane,
    "replay": wire_attacks.replay,
    "relayed": wire_attacks.forged_relay,
    "leases": flood_attacks.leases,
    "plan": flood_attacks.plan_takeover,
    "claim_flood": flood_attacks.claim_flood,
    "oversized": flood_attacks.oversized,
    "slowloris": flood_attacks.slowloris,
    "lurk": flood_attacks.lurk,
    "spin": flood_attacks.spin,
    "big_requests": flood_attacks.big_requests,
    "poison": wire_attacks.poison,
    "shares": share_attacks.shares,
    "elect": election_attacks.elect,
}


async def _run(mallory: Mallory, swarm: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    await mallory.open(swarm["peers"])
    steps: dict[str, Outcome] = {}
    if args.member:
        steps["join"] = await mallory.become_member(swarm["peers"], args.roles)
        if args.await_cell and mallory.member:
            steps["join.named"] = await _await_cell(mallory, swarm, args.await_cell)
    for attack in args.attacks:
        # Aimed at where the cells and shards are now: the snapshot predates Mallory's join
        # and the re-plan it caused (``placement``'s doc).
        swarm = await placement.refresh(mallory, swarm)
        steps[f"{attack}.placement"] = {
            "ok": True,
            "plan_version": swarm["plan_version"],
            "mallory_cells": json.dumps(swarm["mallory_cells"]),
            "from_leases": swarm["from_leases"],
        }
        done = await ATTACKS[attack](mallory, swarm, args)
        steps.update({f"{attack}.{step}": outcome for step, outcome in done.items()})
    return {"attacks": args.attacks, "mallory": mallory.identity.peer_id, "member": mallory.member, "steps": steps}


async def _await_cell(mallory: Mallory, swarm: dict[str, Any], seconds: float) -> Outcome:
    """Wait until the plan in force names Mallory for a cell (the coordinator's probation
    over), up to ``seconds``: what it then sends as a contribution meets the value checks."""
    started = time.monotonic()
    while True:
        now = await placement.refresh(mallory, swarm)
        waited = round(time.monotonic() - started, 1)
        if now["mallory_cells"] or waited > seconds:
            return {
                "ok": True,
                "cells": json.dumps(now["mallory_cells"]),
                "plan_version": now["plan_version"],
                "seconds": waited,
            }
        await asyncio.sleep(2.0)  # sync-ok: a poll interval inside the caller's deadline


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="mallory")
    parser.add_argument("attacks", nargs="+", choices=sorted(ATTACKS), metavar="ATTACK")
    parser.add_argument("--swarm", type=Path, required=True)
    parser.add_argument("--member", action="store_true", help="publish a valid heartbeat first")
    parser.add_argument(
        "--roles", nargs="*", default=["worker"], help="the roles the heartbeat claims (a worker: served as a member)"
    )
    parser.add_argument(
        "--await-cell", type=float, default=0.0, help="as a member, wait up to this long to be named for a cell"
    )
    parser.add_argument("--count", type=int, default=0, help="the flood's size (0: the attack's default)")
    parser.add_argument("--duration", type=float, default=0.0, help="how long a flood lasts, seconds")
    args = parser.parse_args(argv)
    swarm = json.loads(args.swarm.read_text())
    # Stopped by SIGTERM (the benchmark ends a flood so), Mallory still closes its DHT below:
    # its process leads a group of its own with p2pd, which would outlive us and go on as a node.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with tempfile.TemporaryDirectory(prefix="mallory-") as folder:
        mallory = Mallory.join(swarm["run_id"], swarm["bootstrap"], Path(folder))
        try:
            report = asyncio.run(_run(mallory, swarm, args))
        finally:
            mallory.close()
    print(json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
