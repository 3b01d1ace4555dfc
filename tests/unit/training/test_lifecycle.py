"""daemon/training/lifecycle.py with fakes: the bookkeeping's actions done on what this peer
holds. An opened shard (0, 0) brings the ledger with it and a closed one takes it away, leaving
its final state for the next holder; a released lease shows the version the shard was closed
at; the versions the pool shows are noted, and the holders remembered for a take-over."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from swarmd.peers.records.identity import Identity
from swarmd.peers.taskpool.assignment import Assignment
from swarmd.peers.taskpool.lease import Lease
from swarmd.peers.taskpool.servers import SeenVersions, Shard, ShardLease
from swarmd.training.bookkeeping import Books, CloseShard, NoteVersions, OpenShard, PublishShard, StandbyChanged
from swarmd.training.held import Held
from swarmd.training.lifecycle import Lifecycle
from swarmd.training.shards.opening import Opened
from swarmd.training.shards.replicas import ReplicaStore
from tests.unit.training.shards.test_shard_server import grid

pytestmark = pytest.mark.timeout(30)

RUN = "tiny." + "a" * 24
ME = Identity.generate()
KEY = (0, 0)


@dataclass(frozen=True)
class Facts:
    identity: Identity = ME
    run_id: str = RUN

    @property
    def own(self) -> str:
        return self.identity.peer_id


@dataclass
class Pool:
    books: Books = field(default_factory=lambda: Books(own=ME.peer_id))
    assignment: Assignment = field(default_factory=lambda: grid(1))

    def shard_holder(self, key: Shard) -> str | None:
        return None


@dataclass
class Server:
    version: int
    checkpoint_path: Path
    standby_changes: int = 0
    closed: bool = False

    async def close(self) -> int:
        self.closed = True
        return self.version

    def standby_changed(self) -> None:
        self.standby_changes += 1


@dataclass
class Opener:
    """Opens every shard at version 12; shard (0, 0)'s with a ledger."""

    path: Path
    opened: list[Shard] = field(default_factory=list)

    async def open(self, key: Shard, assignment: Assignment) -> Opened:
        self.opened.append(key)
        return Opened(Server(12, self.path), "the ledger" if key == KEY else None)  # type: ignore[arg-type]


@dataclass
class Peer:
    opener: Opener
    held: Held = field(default_factory=Held)
    seen: SeenVersions = field(default_factory=lambda: SeenVersions(ME.peer_id))
    published: list[Lease] = field(default_factory=list)
    noted: list[dict[Shard, ShardLease]] = field(default_factory=list)
    reducer_stops: int = 0

    def lifecycle(self) -> Lifecycle:
        async def publish(lease: Lease, raw: bytes) -> bool:
            assert type(lease).parse(raw, run_id=RUN, now=time.time()) == lease  # signed by this peer
            self.published.append(lease)
            return True

        async def stop_reducer() -> None:
            self.reducer_stops += 1

        return Lifecycle(
            Facts(),  # type: ignore[arg-type]
            Pool(),
            self.held,
            publish,
            self.seen,
            ReplicaStore(lambda key: None),
            lambda leases: self.noted.append(dict(leases)),
            self.opener,  # type: ignore[arg-type]
            None,  # type: ignore[arg-type]  # no cell is opened here
            stop_reducer,
            lambda: None,
        )


def lease(peer: str, version: int) -> ShardLease:
    now = time.time()
    return ShardLease(
        run_id=RUN,
        stage=0,
        shard=0,
        shards=1,
        peer_id=peer,
        claimed_at=now,
        issued_at=now,
        expires_at=now + 30,
        version=version,
    )


def publish(released: bool) -> PublishShard:
    return PublishShard(KEY, 1, time.time(), standby="", proof="", released=released)


def test_shard_0_0_opens_with_the_ledger_and_closes_without_it_leaving_its_state(tmp_path: Path) -> None:
    peer = Peer(Opener(tmp_path / "shard.safetensors"))
    life = peer.lifecycle()
    asyncio.run(life.apply([OpenShard(KEY), OpenShard((0, 1))], time.time()))
    assert peer.opener.opened == [KEY, (0, 1)] and set(peer.held.servers) == {KEY, (0, 1)}
    assert peer.held.ledger == "the ledger"
    server = peer.held.servers[KEY]
    asyncio.run(life.apply([StandbyChanged()], time.time()))
    assert [s.standby_changes for s in peer.held.servers.values()] == [1, 1]  # type: ignore[attr-defined]
    asyncio.run(life.apply([CloseShard(KEY)], time.time()))
    assert server.closed and KEY not in peer.held.servers and peer.held.ledger is None  # type: ignore[attr-defined]
    assert peer.held.handed_over[KEY] == (12, tmp_path / "shard.safetensors")


def test_a_shard_lease_shows_its_servers_version_or_the_one_it_closed_at(tmp_path: Path) -> None:
    peer = Peer(Opener(tmp_path / "shard.safetensors"))
    life = peer.lifecycle()
    asyncio.run(life.apply([OpenShard(KEY), publish(False), CloseShard(KEY), publish(True)], time.time()))
    served, released = peer.published
    assert isinstance(served, ShardLease) and (served.version, served.released) == (12, False)
    assert isinstance(released, ShardLease) and (released.version, released.released) == (12, True)
    assert served.peer_id == ME.peer_id


def test_the_versions_the_pool_shows_are_noted_and_the_holders_remembered(tmp_path: Path) -> None:
    peer = Peer(Opener(tmp_path / "shard.safetensors"))
    leases = {KEY: lease("holder", 30)}
    asyncio.run(peer.lifecycle().apply([NoteVersions(leases), publish(False)], time.time()))
    assert peer.seen.of(KEY) == 30 and peer.noted == [leases]
    [published] = peer.published  # no server here: the highest the swarm has shown
    assert isinstance(published, ShardLease) and published.version == 30
