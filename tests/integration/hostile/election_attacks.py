"""Mallory runs for office: fresh keys, the lowest peer IDs it can grind, with every record a
key may publish about itself and the others, all made up. Each attack returns ``{step: outcome}``.

``elect``: ``--count`` keys (5 by default), re-published every ``REFRESH_S`` for ``--duration``
seconds (60). The first ``NAMED`` keys publish every record: a worker and server heartbeat;
observations that see each other up for a million seconds and every honest peer gone fifty
times; a links record claiming a terabyte a second to everyone; and a plan a version past the
one in force that makes the key its coordinator's server, relay and stage-0 cell. The keys past
them, a crowd, publish the heartbeat and the plan: one Mallory stores about 18 records a second,
so 500 keys with all four took two minutes a round, and their observations would count no more
than the first keys' (only planned members are believed). What once had five such keys elected
within 4 s.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import TYPE_CHECKING, Any

from swarmd.peers.membership.reliability import KIND as OBSERVATIONS_KIND
from swarmd.peers.membership.reliability import Observations
from swarmd.peers.records.identity import Identity
from swarmd.peers.records.links import KIND as LINKS_KIND
from swarmd.peers.records.links import LinksRecord
from swarmd.peers.records.plan_record import KIND as PLAN_KIND
from tests.integration.hostile import forgery

if TYPE_CHECKING:
    from tests.integration.hostile.mallory import Mallory, Outcome

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
            batch = keys[first : first + BATCH]
            published = await asyncio.gather(*(_publish(mallory, swarm, key, ids, version) for key in batch))
            for kinds, results in published:
                for kind, ok in zip(kinds, results, strict=True):
                    stored[kind] += bool(ok)
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


async def _publish(
    mallory: Mallory, swarm: dict[str, Any], key: Identity, ids: list[str], version: int
) -> tuple[list[str], list[bool]]:
    """One key's records (``elect``'s doc): their kinds, and whether each was stored."""
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
    results = await asyncio.gather(
        mallory.swarm_dht.publish_heartbeat(me, beat, expires),
        *(mallory.swarm_dht.publish_peer_record(kind, me, raw, expires) for kind, raw in records.items()),
    )
    return ["heartbeat", *records], results
