"""Mallory runs for office: fresh keys, the lowest peer IDs it can grind, with every record a
key may publish about itself and the others, all made up. Each attack returns ``{step: outcome}``.

``elect``: ``--count`` keys (5 by default), re-published every ``REFRESH_S`` for ``--duration``
seconds (60). The first ``NAMED`` keys publish every record: a worker and server heartbeat;
observations that see each other up for a million seconds and every honest peer gone fifty
times; a links record claiming a terabyte a second to everyone; and a plan a version past the
one in force that makes the key its coordinator's server, relay and stage-0 cell. The keys past
them, a crowd, publish the heartbeat and the plan: stored one at a time, 500 keys with all four
took two minutes a round, and their observations would count no more than the first keys' (only
planned members are believed). A batch's records go in two calls (``Mallory.store_many``): its
plans' parts, then the records. What once had five such keys elected within 4 s.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import TYPE_CHECKING, Any

from swarmd.peers.dht.keys import member_bucket, members_key, plan_part_key
from swarmd.peers.dht.swarm_dht import PER_PEER_KINDS
from swarmd.peers.membership.reliability import KIND as OBSERVATIONS_KIND
from swarmd.peers.membership.reliability import Observations
from swarmd.peers.records.identity import Identity
from swarmd.peers.records.links import KIND as LINKS_KIND
from swarmd.peers.records.links import LinksRecord
from swarmd.peers.records.plan_parts import open_bundle
from swarmd.peers.records.plan_record import KIND as PLAN_KIND
from tests.integration.hostile import forgery

if TYPE_CHECKING:
    from tests.integration.hostile.mallory import Mallory, Outcome, Stored

REFRESH_S = 10.0
TTL_S = 60.0
GRIND = 40
"""Keys generated per key kept: the lowest IDs of them, which sort before the honest ones'."""
BATCH = 50
"""Keys whose records are published at once."""
NAMED = 32
"""Fellow keys each key's observations and links name (the lowest: every record stays within
the DHT's value size, so it is stored and read, not refused for its size)."""


def lowest_keys(count: int) -> list[Identity]:
    return sorted((Identity.generate() for _ in range(count * GRIND)), key=lambda k: k.peer_id)[:count]


async def elect(mallory: Mallory, swarm: dict[str, Any], args: argparse.Namespace) -> dict[str, Outcome]:
    count, duration = args.count or 5, args.duration or 60.0
    keys = lowest_keys(count)
    ids = [k.peer_id for k in keys]
    version = int(swarm.get("plan_version") or 0) + 1
    stored: dict[str, int] = {"heartbeat": 0, OBSERVATIONS_KIND: 0, LINKS_KIND: 0, PLAN_KIND: 0}
    started = time.monotonic()
    deadline = started + duration
    rounds = 0
    while True:
        for first in range(0, count, BATCH):  # a batch of keys at a time
            records = [_records(mallory, swarm, key, ids, version) for key in keys[first : first + BATCH]]
            # A plan's parts first, then every record that names them (no reader meets a
            # manifest before its parts), each lot in one call.
            parts = [part for by_kind in records for found, _ in by_kind.values() for part in found]
            parts_ok = dict(zip(parts, await mallory.store_many(parts), strict=True))
            mains = [main for by_kind in records for _, main in by_kind.values()]
            mains_ok = iter(await mallory.store_many(mains))
            for by_kind in records:
                for kind, (found, _) in by_kind.items():
                    stored[kind] += next(mains_ok) and all(parts_ok[part] for part in found)
        rounds += 1
        if time.monotonic() + REFRESH_S > deadline:
            break
        await asyncio.sleep(REFRESH_S)  # sync-ok: the records' refresh interval, as a daemon's
    seconds = round(time.monotonic() - started, 1)
    return {
        "elect": {
            "ok": True,
            "keys": ",".join(ids),
            "rounds": rounds,
            "plan_version": version,
            "seconds": seconds,
            **stored,
        }
    }


def _records(
    mallory: Mallory, swarm: dict[str, Any], key: Identity, ids: list[str], version: int
) -> dict[str, tuple[list[Stored], Stored]]:
    """One key's records (``elect``'s doc) by kind: the parts stored before it (a plan's), and
    the record itself, under the keys the daemons' own publishing uses."""
    me, now = key.peer_id, time.time()
    expires = now + TTL_S
    honest = [p["peer_id"] for p in swarm["peers"]]
    others = [p for p in ids[: NAMED + 1] if p != me][:NAMED]
    seen = {p: (1e6, 1e6, 0) for p in others} | {p: (1e6, 0.0, 50) for p in honest}
    records: dict[str, bytes] = {
        OBSERVATIONS_KIND: Observations(
            run_id=mallory.run_id, peer_id=me, issued_at=now, expires_at=expires, peers=seen
        ).sign(key),
        LINKS_KIND: LinksRecord(
            run_id=mallory.run_id,
            peer_id=me,
            issued_at=now,
            expires_at=expires,
            tflops=1e4,
            memory_gib=1024.0,
            links={p: (0.0001, 1e12, 1.0) for p in [*others, *honest]},
        ).sign(key),
        PLAN_KIND: forgery.plan(key, mallory.run_id, version, [me, *honest], swarm["stages"], swarm["layers"]),
    }
    if me not in ids[:NAMED]:  # past the first NAMED keys, a crowd: heartbeat and plan (module doc)
        records = {PLAN_KIND: records[PLAN_KIND]}
    roles = ["worker", "parameter_server"]
    beat = forgery.heartbeat(key, mallory.run_id, [f"/ip4/127.0.0.1/tcp/9/p2p/{me}"], roles, TTL_S)
    out: dict[str, tuple[list[Stored], Stored]] = {
        "heartbeat": ([], (members_key(mallory.run_id, member_bucket(me)), me, beat, expires))
    }
    for kind, raw in records.items():
        where = PER_PEER_KINDS[kind][1](mallory.run_id)
        if kind == PLAN_KIND:
            bundle = open_bundle(raw)
            parts = [(plan_part_key(mallory.run_id, digest), None, v, expires) for digest, v in bundle.parts.items()]
            out[kind] = (parts, (where, me, bundle.manifest, expires))
        else:
            out[kind] = ([], (where, me, raw, expires))
    return out
