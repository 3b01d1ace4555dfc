"""What runs inside the DHT process: the coroutines ``SwarmDHT`` sends there in its requests.

Each is a module-level async function of its arguments, then of the DHT and its node
(``swarmd.peers.dht.process.DhtCoroutine``), so that it pickles into a request; what it
returns is pickled back through the answer pipe, and so is kept small where strangers choose
the size (``sample``).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from typing import Any

import hivemind
from hivemind.dht.node import DHTNode
from hivemind.p2p import PeerID
from multiaddr import Multiaddr

logger = logging.getLogger(__name__)


async def store_value(
    key: str, raw: bytes, expires_at: float, subkey: str | None, dht: hivemind.DHT, node: DHTNode
) -> bool:
    return bool(await node.store(key, raw, expires_at, subkey=subkey))


async def get_latest(key: str, dht: hivemind.DHT, node: DHTNode) -> Any:
    return await node.get(key, latest=True)


async def sample_many(
    reads: list[tuple[str, int, list[str]]], dht: hivemind.DHT, node: DHTNode
) -> list[tuple[dict[str, bytes], int]]:
    """For each (key, limit, known): ``sample`` of its newest value, all keys found in one
    search (hivemind asks each peer on the way for every key at once)."""
    found = await node.get_many([key for key, _, _ in reads], sufficient_expiration_time=float("inf"))
    return [sample(found.get(key), limit, known) for key, limit, known in reads]


def sample(found: Any, limit: int, known: list[str]) -> tuple[dict[str, bytes], int]:
    """At most ``limit`` of the per-peer values of a key's value ``found``, ``known`` subkeys
    first, and how many there were: only these cross the pipe back (its answer side carries
    megabytes, but the reader's checks and memory must not grow with what strangers store)."""
    if found is None or not isinstance(found.value, dict):
        return {}, 0
    records = {
        subkey: item.value
        for subkey, item in found.value.items()
        if isinstance(subkey, str) and isinstance(getattr(item, "value", None), bytes)
    }
    if len(records) <= limit:
        return records, len(records)
    chosen = [subkey for subkey in known if subkey in records][:limit]
    taken = set(chosen)
    others = [subkey for subkey in records if subkey not in taken]
    chosen += random.sample(others, min(len(others), limit - len(chosen)))
    return {subkey: records[subkey] for subkey in chosen}, len(records)


async def ping(peer_id: str, dht: hivemind.DHT, node: DHTNode) -> float | None:
    started = time.perf_counter()
    answered = await node.protocol.call_ping(PeerID.from_base58(peer_id))
    return time.perf_counter() - started if answered is not None else None


async def add_peers(maddrs: list[str], dht: hivemind.DHT, node: DHTNode) -> int:
    async def one(maddr: str) -> bool:
        try:
            addr = Multiaddr(maddr)
            peer = PeerID.from_base58(addr["p2p"])
            await asyncio.wait_for(node.protocol.p2p._client.connect(peer, [addr.decapsulate(f"/p2p/{peer}")]), 5)
            return await node.protocol.call_ping(peer) is not None
        except Exception as e:
            logger.debug("Could not reach %s: %r", maddr, e)
            return False

    return sum(await asyncio.gather(*(one(m) for m in maddrs)))


async def visible_maddrs(dht: hivemind.DHT, node: DHTNode) -> list[str]:
    return [str(m) for m in await node.get_visible_maddrs()]


async def daemon_listen_maddr(dht: hivemind.DHT, node: DHTNode) -> Any:
    return node.protocol.p2p.daemon_listen_maddr


async def routing_table_size(dht: hivemind.DHT, node: DHTNode) -> int:
    return len(node.protocol.routing_table.uid_to_peer_id)
