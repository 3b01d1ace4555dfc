"""daemon/training/shard_server.py: the periodic checkpoint copy to the standby travels while
steps go on, and the standby's replica (its older copy, the log, then the new copy) rebuilds
the committed weights whichever arrives first."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch

from swarmd.errors import SwarmdError
from swarmd.models.parameter_shard import ParameterShard, ShardStep
from swarmd.models.shard_config import ShardConfig
from swarmd.peers.taskpool.exchange import ExchangeConfig
from swarmd.peers.wire.codecs import encode_vector
from swarmd.peers.wire.messages import Contribute
from swarmd.training.opening import replay
from swarmd.training.replicas import LogEntry, ReplicaStore
from swarmd.training.shard_server import ShardServer

pytestmark = pytest.mark.timeout(60)

SIZE = 300
KEY = (0, 0)
HOLDER = "holder"
RUN_ID = "tiny." + "a" * 24
CONFIG = ShardConfig(mode="gradient", lr=1e-2, weight_decay=0.0, betas=(0.9, 0.99), eps=1e-6)


class Standby:
    """The standby's end of the replication: a real ``ReplicaStore``, with copies that wait
    at a gate (a slow link) or fail, as a test says."""

    def __init__(self) -> None:
        self.store = ReplicaStore(lambda key: HOLDER)
        self.gate = asyncio.Event()
        self.gate.set()
        self.fail_copies = False
        self.copies_started: list[int] = []
        self.copies_ended = 0

    async def log(self, step: ShardStep, ledger: str) -> bool:
        frame = encode_vector(step.delta, "fp16")
        self.store.append(KEY, HOLDER, "lineage", LogEntry(step.version, frame, tuple(step.share_ids), ledger))
        return True

    async def copy(self, version: int, data: bytes) -> bool:
        self.copies_started.append(version)
        await self.gate.wait()
        self.copies_ended += 1
        if self.fail_copies:
            raise SwarmdError("the standby's link broke")
        self.store.store_checkpoint(KEY, HOLDER, "lineage", version, data)
        return True

    async def copies_end(self, count: int) -> None:
        while self.copies_ended < count:
            await asyncio.sleep(0.01)

    async def copies_start(self, count: int) -> None:
        while len(self.copies_started) < count:
            await asyncio.sleep(0.01)


def server(tmp_path: Path, standby: Standby, every: int) -> ShardServer:
    shard = ParameterShard(0, SIZE, torch.zeros(SIZE), CONFIG, step_micro_batches=1)
    settings = ExchangeConfig(batch_micro_batches=1, share_micro_batches=1)
    return ShardServer(KEY, 1, shard, settings, "lineage", tmp_path / "shard.pt", standby.log, standby.copy, every)


async def step(srv: ShardServer, share_id: int) -> None:
    gradient = torch.randn(SIZE, generator=torch.Generator().manual_seed(share_id))
    request = Contribute(
        run_id=RUN_ID,
        stage=0,
        shard=0,
        shards=1,
        share_ids=[share_id],
        base_version=srv.version,
        micro_batches=1,
        kind="gradient",
        codec="fp32",
    )
    answer = await srv.contribute(request, encode_vector(gradient, "fp32"))
    assert answer.accepted


def rebuilt(standby: Standby, srv: ShardServer) -> torch.Tensor:
    replica = standby.store.newest(KEY)
    assert replica is not None and replica.version == srv.version
    weights = replay(replica, CONFIG, 1, (0, SIZE)).weights()
    assert weights is not None
    return weights[1]


def test_steps_go_on_while_a_periodic_copy_travels_and_the_standby_rebuilds_every_step(tmp_path: Path) -> None:
    async def scenario() -> None:
        standby = Standby()
        srv = server(tmp_path, standby, every=3)
        await step(srv, 1)  # the first step copies to the new standby under the lock, then logs
        assert standby.copies_started == [1]
        await step(srv, 2)
        standby.gate.clear()  # the next copy is slow
        await asyncio.wait_for(step(srv, 3), 5)  # the third step since: a copy goes, in the background
        for share in range(4, 8):  # steps commit while it is in flight (under the lock they waited)
            await asyncio.wait_for(step(srv, share), 5)
        assert srv.version == 7 and standby.copies_started == [1, 3] and standby.copies_ended == 1
        assert torch.equal(rebuilt(standby, srv), srv.weights())  # old copy + the log
        standby.gate.set()
        await asyncio.wait_for(srv.close(), 10)
        replica = standby.store.newest(KEY)
        assert replica is not None and replica.checkpoint_version >= 3
        assert torch.equal(rebuilt(standby, srv), srv.weights())  # new copy + the log after it

    asyncio.run(scenario())


def test_a_failed_background_copy_makes_the_next_step_copy_first(tmp_path: Path) -> None:
    async def scenario() -> None:
        standby = Standby()
        srv = server(tmp_path, standby, every=2)
        for share in (1, 2):  # copies at 1 (the new standby's first) and 2
            await step(srv, share)
        await asyncio.wait_for(standby.copies_end(2), 5)
        standby.fail_copies = True
        standby.gate.clear()
        for share in (3, 4):
            await step(srv, share)
        await asyncio.wait_for(standby.copies_start(3), 5)
        assert standby.copies_started == [1, 2, 4]  # 4 in the background, failing at the gate
        standby.gate.set()
        await asyncio.wait_for(standby.copies_end(3), 5)
        standby.fail_copies = False
        await step(srv, 5)  # the standby is not taken as ready any more: a copy first, under the lock
        assert standby.copies_started == [1, 2, 4, 5]
        assert srv.stats.unreplicated == 0
        assert torch.equal(rebuilt(standby, srv), srv.weights())
        await srv.close()

    asyncio.run(scenario())
