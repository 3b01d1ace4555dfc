"""daemon/training/handlers.py with fakes: a request from a non-member is refused, one for what
this peer does not hold is ``NotHolder``, and a shard's state goes only to its new holder: the
holder that still follows the assignment naming it answers ``serving``, one the assignment
moved it from closes first and hands its checkpoint over, and a paused peer hands back what it
closed to any member."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from swarmd.peers.taskpool.assignment import Assignment
from swarmd.peers.taskpool.exchange import ExchangeConfig
from swarmd.peers.wire.errors import NotHolder, NotMember
from swarmd.peers.wire.messages import CellForward, Contribute, LedgerAbandon, Pull, ReplicaFetch
from swarmd.training.bookkeeping import Books
from swarmd.training.handlers import TrainingHandlers
from swarmd.training.held import Held
from swarmd.training.shards.replicas import ReplicaStore
from tests.unit.training.shards.test_shard_server import HOLDER, grid

pytestmark = pytest.mark.timeout(30)

RUN = "tiny." + "a" * 24
KEY = (0, 0)


@dataclass(frozen=True)
class Spec:
    checkpoint_access: str = "members"


@dataclass(frozen=True)
class Facts:
    own: str
    run_id: str = RUN
    spec: Spec = Spec()


@dataclass
class Pool:
    """Pipelines 0 and 1; the assignment names HOLDER for shard (0, 0), which ``holder`` holds."""

    holder: str
    books: Books = field(default_factory=lambda: Books(own="me", live=frozenset({"me", HOLDER, "cell-0", "other"})))
    assignment: Assignment = field(default_factory=lambda: grid(2))

    def shard_holder(self, key: tuple[int, int]) -> str:
        return self.holder

    def cell_holder(self, cell: tuple[int, int]) -> str:
        return f"cell-{cell[0]}"

    def exchange_settings(self) -> ExchangeConfig:
        return ExchangeConfig(batch_micro_batches=1, share_micro_batches=2)

    def ledger_keepers(self) -> list[str]:
        return []


@dataclass
class Server:
    version: int
    checkpoint_path: Path


@dataclass
class Peer:
    """A peer's handlers, with what it holds and the shards it was told to close."""

    own: str = "me"
    holder: str = "me"
    paused: bool = False
    held: Held = field(default_factory=Held)
    closed: list[tuple[int, int]] = field(default_factory=list)

    def handlers(self) -> TrainingHandlers:
        async def close_shard(key: tuple[int, int]) -> None:
            self.closed.append(key)
            server = self.held.servers.pop(key)
            self.held.handed_over[key] = (server.version, server.checkpoint_path)

        replicas = ReplicaStore(lambda key: self.holder)
        return TrainingHandlers(
            Facts(self.own),  # type: ignore[arg-type]
            Pool(self.holder),
            self.held,
            replicas,
            None,  # type: ignore[arg-type]  # read only for a replica's replay
            None,  # type: ignore[arg-type]
            None,  # type: ignore[arg-type]
            close_shard,
            lambda: self.paused,
        )


FORWARD = CellForward(
    run_id=RUN,
    pipeline=0,
    stage=1,
    epoch="e",
    share_id=1,
    share_first=0,
    share_count=1,
    round_end=False,
    attempt=0,
    micro_batch=0,
    version=0,
)


def fetch() -> ReplicaFetch:
    return ReplicaFetch(run_id=RUN, stage=0, shard=0, after_version=-1)


def serve(peer: Peer, tmp_path: Path, version: int) -> bytes:
    path = tmp_path / "shard.safetensors"
    path.write_bytes(f"state at {version}".encode())
    peer.held.servers[KEY] = Server(version, path)  # type: ignore[assignment]
    return path.read_bytes()


def test_a_stranger_is_refused_before_anything_is_looked_up() -> None:
    h = Peer().handlers()
    forward = FORWARD
    for call in (
        h.cell_tensor("stranger", forward, [b""]),
        h.ledger_abandon("stranger", LedgerAbandon(run_id=RUN, share_ids=[1], pipeline=0), []),
        h.replica_fetch("stranger", fetch(), []),
    ):
        with pytest.raises(NotMember):
            asyncio.run(call)


def test_what_this_peer_does_not_hold_is_not_holder() -> None:
    h = Peer().handlers()
    forward = FORWARD
    contribute = Contribute(
        run_id=RUN,
        stage=0,
        shard=0,
        shards=1,
        share_ids=[1],
        base_version=0,
        micro_batches=1,
        kind="gradient",
        codec="fp32",
    )
    pull = Pull(run_id=RUN, stage=0, shard=0, shards=1, have_version=0, pending_share_ids=[], wait_s=0.0)
    for call, what in (
        (h.cell_tensor("cell-0", forward, [b""]), "does not work cell"),
        (h.contribute("cell-0", contribute, [b""]), "does not serve shard"),
        (h.pull("cell-0", pull, []), "does not serve shard"),
        (h.ledger_abandon("cell-0", LedgerAbandon(run_id=RUN, share_ids=[1], pipeline=0), []), "share ledger"),
    ):
        with pytest.raises(NotHolder, match=what):
            asyncio.run(call)


def test_a_shards_state_goes_only_to_its_holder_or_the_peer_the_assignment_names() -> None:
    h = Peer(holder="other").handlers()
    with pytest.raises(NotHolder, match="only its new holder"):
        asyncio.run(h.replica_fetch("cell-0", fetch(), []))
    answer, blobs = asyncio.run(h.replica_fetch(HOLDER, fetch(), []))  # named: nothing kept here
    assert (answer.kind, answer.version, blobs) == ("none", -1, [])


def test_a_holder_the_assignment_still_names_answers_serving(tmp_path: Path) -> None:
    peer = Peer(own=HOLDER, holder=HOLDER)
    serve(peer, tmp_path, 14)
    answer, blobs = asyncio.run(peer.handlers().replica_fetch(HOLDER, fetch(), []))
    assert (answer.kind, answer.version, blobs) == ("serving", 14, [])
    assert peer.closed == [] and KEY in peer.held.servers


def test_a_holder_the_assignment_moved_the_shard_from_closes_and_hands_its_state_over(tmp_path: Path) -> None:
    peer = Peer()
    state = serve(peer, tmp_path, 14)
    answer, blobs = asyncio.run(peer.handlers().replica_fetch(HOLDER, fetch(), []))
    assert peer.closed == [KEY]  # closed first: no step after the state it sends
    assert (answer.kind, answer.version, blobs) == ("checkpoint", 14, [state])


def test_a_paused_peer_hands_back_what_it_closed_to_any_member(tmp_path: Path) -> None:
    peer = Peer(holder="other", paused=True)
    state = serve(peer, tmp_path, 9)
    path = peer.held.servers.pop(KEY).checkpoint_path
    peer.held.handed_over[KEY] = (9, path)
    answer, blobs = asyncio.run(peer.handlers().replica_fetch("cell-0", fetch(), []))
    assert (answer.kind, answer.version, blobs) == ("checkpoint", 9, [state])
    peer.paused = False  # the same ask of a peer that reads the pool again: not the holder's
    with pytest.raises(NotHolder):
        asyncio.run(peer.handlers().replica_fetch("cell-0", fetch(), []))
