"""The run's weights gathered at one peer for ``swarmd export``.

Every stage's newest committed weights, asked of its shards' holders, written as
``stage<s>.safetensors``.

A shard that is between holders (a hand-over takes a few seconds: the old holder's last step
copied, the new one's lease published) is asked for again with backoff, for a bounded time.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch

from swarmd.errors import SwarmdError
from swarmd.models.cell_compute import flatten_parameters, unflatten_parameters
from swarmd.models.checkpoint import save_safetensors_atomic
from swarmd.peers.taskpool.exchange import shard_range
from swarmd.peers.taskpool.servers import Shard
from swarmd.peers.wire.codecs import decode_vector
from swarmd.peers.wire.errors import RpcError
from swarmd.peers.wire.messages import Pull
from swarmd.system.state_dir import GATHERED_TOKENIZER
from swarmd.training.run_facts import RunFacts, RunInputs, stage_module

if TYPE_CHECKING:
    from swarmd.data.training_data import TrainingData
    from swarmd.peers.taskpool.assignment import Assignment
    from swarmd.peers.wire.protocol import Request
    from swarmd.training.shards.shard_server import ShardServer

GATHER_WAIT_S = 45.0
"""How long a gather waits for a shard that is between holders."""
GATHER_BACKOFF_S = (0.5, 4.0)


class Gathering(Protocol):
    """What a gather reads of a trainer: the run, the pool, the shards served here, a way to ask
    the others, and where the weights go."""

    facts: RunFacts
    stages: int
    checkpoint_dir: Path
    data: TrainingData | None
    inputs: RunInputs

    @property
    def servers(self) -> Mapping[Shard, ShardServer]: ...

    @property
    def assignment(self) -> Assignment | None: ...

    def shard_holder(self, key: Shard) -> str | None: ...

    async def score(self, stages: list[dict[str, torch.Tensor]]) -> float | None: ...

    async def send(
        self, peer: str, request: Request[Any], blobs: list[bytes], timeout_s: float
    ) -> tuple[Any, list[bytes]]: ...


async def gather_weights(trainer: Gathering) -> dict[str, Any]:
    """Write every stage's weights to the trainer's checkpoint folder, with the run's tokenizer
    file when it has one, and score them on the held-out split: what ``swarmd export`` prints.
    Returns each stage's oldest shard version and the held-out loss (None before the data is open)."""
    stages = await gather_stages(trainer)
    versions = []
    for stage, (version, state) in enumerate(stages):
        path = trainer.checkpoint_dir / f"stage{stage}.safetensors"
        await asyncio.to_thread(save_safetensors_atomic, state, path, {"version": str(version)})
        versions.append(version)
    tokenizer = trainer.inputs.tokenizer_file()
    if tokenizer is not None:
        await asyncio.to_thread(shutil.copyfile, tokenizer, trainer.checkpoint_dir / GATHERED_TOKENIZER)
    loss = None
    if trainer.data is not None:
        loss = await trainer.score([state for _, state in stages])
    return {"versions": versions, "held_out_loss": loss, "held_out_sequences": trainer.facts.spec.eval_sequences}


async def gather_stages(trainer: Gathering) -> list[tuple[int, dict[str, torch.Tensor]]]:
    """Every stage's newest committed weights as a state dict, with its oldest shard's version."""
    assignment = trainer.assignment
    if assignment is None:
        raise SwarmdError("this peer has not read the pool yet; try again in a few seconds")
    stages = []
    for stage in range(trainer.stages):
        module = stage_module(trainer.facts, stage)
        vector = flatten_parameters(module)
        shards = (trainer.assignment or assignment).shard_counts()[stage]  # the newest: a plan may come meanwhile
        found = []
        for k in range(shards):
            lo, hi = shard_range(vector.numel(), shards, k)
            version, values = await _whole_slice(trainer, (stage, k), shards, hi - lo)
            vector[lo:hi] = values
            found.append(version)
        stages.append((min(found), unflatten_parameters(module, vector)))
    return stages


async def _whole_slice(trainer: Gathering, key: Shard, shards: int, size: int) -> tuple[int, torch.Tensor]:
    """Shard ``key``'s newest weights, from here or its holder; a shard between holders is
    asked for again (with backoff) for up to ``GATHER_WAIT_S``."""
    deadline = time.monotonic() + GATHER_WAIT_S
    delay = GATHER_BACKOFF_S[0]
    while True:
        server = trainer.servers.get(key)
        if server is not None and (found := server.weights()) is not None:
            return found
        holder = trainer.shard_holder(key)
        why = "it has no holder right now"
        if holder is not None:
            request = Pull(
                run_id=trainer.facts.run_id,
                stage=key[0],
                shard=key[1],
                shards=shards,
                have_version=-1,
                pending_share_ids=[],
                wait_s=0.0,
            )
            try:
                answer, blobs = await trainer.send(holder, request, [], 60.0)
            except RpcError as e:  # the holder is handing it over, or gone
                why = f"its holder {holder[:16]} did not answer ({e})"
            else:
                if answer.kind != "full":
                    raise SwarmdError(f"shard {key}'s holder answered {answer.kind!r} to a whole pull")
                return answer.version, decode_vector(blobs[0], size, "fp32")
        if time.monotonic() + delay > deadline:
            raise SwarmdError(f"shard {key}: {why}, for {GATHER_WAIT_S:.0f} s; try the export again shortly")
        await asyncio.sleep(delay)
        delay = min(2 * delay, GATHER_BACKOFF_S[1])
