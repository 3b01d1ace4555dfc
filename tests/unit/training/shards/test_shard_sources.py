"""daemon/training/shards/shard_sources.py with fakes: the state a shard opens from. Not from a
standby while the holder the assignment moved it from still serves it, or holds its lease and
refuses the ask for now (unless it never lets go past the grace); a fetched state far past what
the swarm has seen, or made by someone the shard never had as holder, is refused; this peer's
own file that cannot be traced is set aside; a shard nobody ever trained starts from the run's
starting slice."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
import torch

from swarmd.models.checkpoint_check import Provenance, ShardLayout, TracedShard
from swarmd.models.shard_config import ShardConfig
from swarmd.peers.taskpool.servers import SeenVersions, ShardLease
from swarmd.peers.wire.errors import NotHolder, NotMember, RpcError, Unavailable
from swarmd.peers.wire.messages import Fetched, ReplicaFetch
from swarmd.training.bookkeeping import Books
from swarmd.training.shards.replicas import ReplicaStore
from swarmd.training.shards.shard_sources import OPEN_GRACE_S, ShardSources, shard_file

pytestmark = pytest.mark.timeout(30)

RUN = "tiny." + "a" * 24
KEY = (1, 0)
LAYOUT = ShardLayout(RUN, 1, 0, 1, (0, 8), "gradient")
CONFIG = ShardConfig(mode="gradient", lr=1e-2, weight_decay=0.0)
ME, HOLDER, STANDBY = "me", "holder", "standby"


@dataclass(frozen=True)
class Facts:
    own: str = ME
    run_id: str = RUN


@dataclass
class Pool:
    """The pool as last read: HOLDER holds KEY rightfully and names STANDBY; both are live."""

    books: Books = field(
        default_factory=lambda: Books(
            own=ME, live=frozenset({ME, HOLDER, STANDBY}), rightful={KEY: (lease(HOLDER, 13, STANDBY), b"")}
        )
    )
    reachable: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Geometry:
    def config(self) -> ShardConfig:
        return CONFIG

    def initial_vector(self, stage: int) -> torch.Tensor:
        return torch.full((8,), 0.5)


def lease(peer: str, version: int, standby: str = "") -> ShardLease:
    now = time.time()
    return ShardLease(
        run_id=RUN,
        stage=KEY[0],
        shard=KEY[1],
        shards=1,
        peer_id=peer,
        claimed_at=now,
        issued_at=now,
        expires_at=now + 30,
        version=version,
        standby=standby,
    )


def state(folder: Path, version: int, holder: str = HOLDER) -> bytes:
    shard = TracedShard(0, 8, torch.full((8,), float(version)), CONFIG, step_micro_batches=1, version=version)
    shard.provenance = Provenance.of(LAYOUT, holder)
    return shard.checkpoint(folder / f"v{version}-{holder}.safetensors").read_bytes()


@dataclass
class Peers:
    """What each peer answers a ``ReplicaFetch``: a checkpoint at a version, "serving", or an error."""

    answers: dict[str, Any]
    asked: list[str] = field(default_factory=list)

    async def send(self, peer: str, request: Any, blobs: list[bytes], timeout_s: float) -> tuple[Any, list[bytes]]:
        assert isinstance(request, ReplicaFetch) and request.run_id == RUN and (request.stage, request.shard) == KEY
        self.asked.append(peer)
        answer = self.answers[peer]
        if isinstance(answer, Exception):
            raise answer
        if answer[0] == "serving":
            return Fetched(version=answer[1], kind="serving", versions=[]), []
        return Fetched(version=answer[1], kind="checkpoint", versions=[]), [answer[2]]


def values(shard: TracedShard) -> torch.Tensor:
    committed = shard.weights()
    assert committed is not None
    return committed[1]


def sources(peers: Peers, seen: int, initial: torch.Tensor | None = None, pool: Pool | None = None) -> ShardSources:
    versions = SeenVersions(ME)
    if seen:
        versions.note({KEY: lease(HOLDER, seen)}, time.time())

    async def initial_slice(stage: int, lo: int, hi: int) -> torch.Tensor | None:
        return initial

    replicas = ReplicaStore(lambda key: HOLDER)
    return ShardSources(Facts(), pool or Pool(), Geometry(), replicas, versions, initial_slice, peers.send)  # type: ignore[arg-type]


def believable(s: ShardSources, folder: Path) -> TracedShard | None:
    return asyncio.run(s.believable_state(KEY, LAYOUT, shard_file(folder, KEY, 1), 1))


def test_no_state_is_taken_from_the_standby_while_the_holder_still_serves_the_shard(tmp_path: Path) -> None:
    """The failure this guards against (four daemons on loaded cores): the assignment moved the
    shard while its holder still followed the older one; the new holder took the standby's
    replica at version 13 while the holder committed 14, and the version went back."""
    standby_state = ("checkpoint", 13, state(tmp_path, 13))
    peers = Peers({HOLDER: ("serving", 14), STANDBY: standby_state})
    s = sources(peers, seen=13)
    assert believable(s, tmp_path) is None and peers.asked == [HOLDER, STANDBY]
    # Once it follows the same assignment it closes and hands its state over: that is opened.
    peers.answers[HOLDER] = ("checkpoint", 14, state(tmp_path, 14))
    found = believable(s, tmp_path)
    assert found is not None and found.version == 14 and float(values(found)[0]) == 14.0
    # A holder that never lets go does not hold the shard up past the grace: the best is opened.
    s = sources(Peers({HOLDER: ("serving", 14), STANDBY: standby_state}), seen=13)
    assert believable(s, tmp_path) is None
    s._waiting_since[KEY] -= OPEN_GRACE_S + 1
    found = believable(s, tmp_path)
    assert found is not None and found.version == 13 and s.versions_lost == 0


def test_a_lease_holder_that_refuses_the_ask_for_now_is_waited_for(tmp_path: Path) -> None:
    """The failure this guards against (four daemons, two test workers): the shard's holder had
    not yet seen the new holder's heartbeat (NOT_MEMBER), or did not yet follow the assignment
    that moved the shard (NOT_HOLDER), and had stepped it once unreplicated; the new holder took
    its own version 0 for the swarm's and the version went back."""
    for refusal in (NotMember("not a live member here"), NotHolder("not its holder here")):
        standby_state = ("checkpoint", 0, state(tmp_path, 0))
        peers = Peers({HOLDER: refusal, STANDBY: standby_state})
        s = sources(peers, seen=0)
        assert believable(s, tmp_path) is None  # its lease is live: it may still step the shard
        peers.answers[HOLDER] = ("checkpoint", 1, state(tmp_path, 1))  # once its view catches up
        found = believable(s, tmp_path)
        assert found is not None and found.version == 1
    # Nor is the seed opened while it refuses, though no version was ever seen: its lease shows
    # version 0 from its claim, and the steps since are in its state alone (four daemons: the
    # first plan moved a shard its provisional holder had stepped twice; opened from the seed,
    # it went 2 -> 0).
    peers = Peers({HOLDER: NotHolder("not its holder here"), STANDBY: Unavailable("no replica yet")})
    s = sources(peers, seen=0)
    assert believable(s, tmp_path) is None
    peers.answers[HOLDER] = ("checkpoint", 2, state(tmp_path, 2))
    found = believable(s, tmp_path)
    assert found is not None and found.version == 2
    # The same refusal from a peer that holds no live lease of the shard holds nothing up.
    expired = replace(lease(HOLDER, 13, STANDBY), expires_at=time.time() - 1)
    pool = Pool(books=Books(own=ME, live=frozenset({ME, HOLDER, STANDBY}), rightful={KEY: (expired, b"")}))
    s = sources(Peers({HOLDER: NotHolder("not its holder here"), STANDBY: standby_state}), seen=0, pool=pool)
    found = believable(s, tmp_path)
    assert found is not None and found.version == 0


def test_the_standby_of_a_gone_holder_that_refuses_the_ask_for_now_is_waited_for(tmp_path: Path) -> None:
    """The holder is gone and its standby's view does not follow the plan that moved the shard
    here yet: it may take the shard over from that view and step it, so its refusal is waited
    out, not taken for "no state" (another source's older state would fork the shard)."""
    books = Books(own=ME, live=frozenset({ME, STANDBY}), rightful={KEY: (lease(HOLDER, 13, STANDBY), b"")})
    pool = Pool(books=books, reachable=frozenset({"earlier"}))  # a holder that let go, still up
    for refusal in (NotMember("not a live member here"), NotHolder("not its holder here")):
        peers = Peers({HOLDER: RpcError("gone"), STANDBY: refusal, "earlier": ("checkpoint", 12, state(tmp_path, 12))})
        s = sources(peers, seen=12, pool=pool)
        s.note_holders({KEY: lease("earlier", 12)})
        assert believable(s, tmp_path) is None  # not the earlier holder's 12
        peers.answers[STANDBY] = ("checkpoint", 13, state(tmp_path, 13))  # its view caught up
        found = believable(s, tmp_path)
        assert found is not None and found.version == 13


def test_states_past_the_swarm_or_from_strangers_are_refused_and_counted(tmp_path: Path) -> None:
    peers = Peers({HOLDER: ("checkpoint", 10_000, state(tmp_path, 10_000)), STANDBY: Unavailable("nothing")})
    s = sources(peers, seen=13)
    assert believable(s, tmp_path) is None and s.refused_states == 1  # far past the 13 seen
    peers.answers[HOLDER] = ("checkpoint", 13, state(tmp_path, 13, holder="12D3KooWmallory"))
    assert believable(s, tmp_path) is None and s.refused_states == 2  # never a holder of the shard
    peers.answers[STANDBY] = ("checkpoint", 13, state(tmp_path, 13))  # the holder's, replayed by its standby
    found = believable(s, tmp_path)
    assert found is not None and found.version == 13 and s.refused_states == 3


def test_an_untraceable_own_file_is_set_aside_and_the_state_taken_from_the_holder(tmp_path: Path) -> None:
    path = shard_file(tmp_path, KEY, 1)
    path.write_bytes(state(tmp_path, 13, holder=HOLDER))  # another's state under our name
    s = sources(Peers({HOLDER: ("checkpoint", 13, state(tmp_path, 13)), STANDBY: RpcError("gone")}), seen=13)
    found = believable(s, tmp_path)
    assert found is not None and found.version == 13 and s.set_aside == 1
    assert not path.exists() and len(list(tmp_path.glob(f"{path.name}.bad-*"))) == 1


def test_a_shard_nobody_trained_starts_from_the_runs_slice_else_the_seed(tmp_path: Path) -> None:
    nobody = {HOLDER: RpcError("gone"), STANDBY: RpcError("gone")}
    found = believable(sources(Peers(dict(nobody)), seen=0, initial=torch.full((8,), 2.0)), tmp_path)
    assert found is not None and found.version == 0 and torch.equal(values(found), torch.full((8,), 2.0))
    found = believable(sources(Peers(dict(nobody)), seen=0), tmp_path)
    assert found is not None and torch.equal(values(found), torch.full((8,), 0.5))  # the geometry's seed


def test_a_holder_that_let_go_is_still_asked_once_noted(tmp_path: Path) -> None:
    peers = Peers({HOLDER: RpcError("gone"), STANDBY: RpcError("gone"), "earlier": ("checkpoint", 13, b"")})
    pool = Pool()
    s = sources(peers, seen=13, pool=pool)
    s.note_holders({KEY: lease("earlier", 12)})
    believable(s, tmp_path)
    assert "earlier" not in peers.asked  # neither a live worker nor reachable
    pool.reachable = frozenset({"earlier"})  # a paused holder: reachable, no longer a worker
    believable(s, tmp_path)
    assert peers.asked[-1] == "earlier"
