"""One run's files between two peers in one process: the creator holds a prepared dataset in a
data folder, the joiner has nothing and fetches what it reads; a tokenizer that does not hash to
what the manifest pins is refused."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import hashlib
from pathlib import Path
from typing import Any

import pytest
import torch

from swarmd.data.fetching import DataUnavailable
from swarmd.data.run_files import RunFiles
from swarmd.data.training_data import AHEAD, ShardedData
from swarmd.models.data.shard_files import open_prepared
from swarmd.models.presets import PRESETS, materialize
from swarmd.peers.records.identity import Identity
from swarmd.peers.records.run_spec import SignedRunSpec, parse_spec_body, run_seed, sign_run_spec
from swarmd.peers.wire.protocol import Request

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny-llama-bpe preset's tokenizer and shards (seconds: a 1,024-id BPE on the built-in corpus)."""
    folder = tmp_path_factory.mktemp("preset")
    materialize(PRESETS["tiny-llama-bpe"], folder)
    return folder / "data"


def signed_spec(data: Path) -> SignedRunSpec:
    body = copy.deepcopy(PRESETS["tiny-llama-bpe"].spec)
    manifest = (data / "manifest.json").read_bytes()
    tokenizer = hashlib.sha256((data / "tokenizer.json").read_bytes()).hexdigest()
    body["data"] = {"manifest": hashlib.sha256(manifest).hexdigest(), "tokenizer": tokenizer}
    return sign_run_spec(Identity.generate(), parse_spec_body(body))


class Pair:
    """The creator's and the joiner's ``RunFiles``, each other's only member."""

    def __init__(self, tmp_path: Path, spec: SignedRunSpec, data: Path) -> None:
        self.creator = self.files(tmp_path / "creator", spec, [data.parent], "joiner")
        self.joiner = self.files(tmp_path / "joiner", spec, [], "creator")

    def files(self, state: Path, spec: SignedRunSpec, dirs: list[Path], other: str) -> RunFiles:
        state.mkdir()

        async def send(peer: str, request: Request[Any], blobs: list[bytes], timeout_s: float) -> Any:
            target = self.creator if peer == "creator" else self.joiner
            return await target.server.handle(other, request, blobs)

        def holders() -> list[tuple[str, list[str]]]:
            return [(other, (self.creator if other == "creator" else self.joiner).holds())]

        return RunFiles(spec, state, dirs, 1 << 30, send, holders, lambda peer: peer in ("creator", "joiner"))


def test_a_peer_without_the_data_fetches_what_it_reads_from_a_member(tmp_path: Path, prepared: Path) -> None:
    spec = signed_spec(prepared)
    pair = Pair(tmp_path, spec, prepared)

    async def main() -> tuple[torch.Tensor, dict[str, Any], dict[str, Any]]:
        await pair.creator.open()
        await pair.joiner.open()  # the manifest and the tokenizer, from the creator
        data = await pair.joiner.training_data()
        assert isinstance(data, ShardedData)
        await data.ready(0, 4, 4, deadline_s=30)  # the shard of micro-batches 0-3, and the next two ahead
        tokens = data.micro_batch(2, 4)
        await asyncio.gather(*data._ahead.values())
        await pair.creator.stop()
        await pair.joiner.stop()
        return tokens, pair.creator.status(), pair.joiner.status()

    tokens, creator, joiner = asyncio.run(main())
    local = open_prepared(prepared, spec.spec.model.seq_len, run_seed(spec.run_id))
    assert torch.equal(tokens, local.train.micro_batch(2, 4))  # the same tokens as the holder reads
    # The run ID is fresh, so its seed orders the shards anew: micro-batches 0-3 may span two.
    read = {local.train.shard_of(i) for i in range(4 * 4)}
    ahead = local.train.shards_ahead(4 * 4 - 1, AHEAD)
    local.close()
    assert creator["holds"] == ["dataset"] and joiner["holds"] == ["shards"]
    assert joiner["fetch"]["fetched_files"]["member"] == 2 + len(read) + len(ahead)  # manifest, tokenizer, shards
    assert joiner["fetch"]["refused"] == 0 and creator["serve"]["served_peers"] == 1
    assert pair.joiner.tokenizer_file() is not None


def test_a_tokenizer_that_does_not_hash_to_the_pinned_digest_is_refused(tmp_path: Path, prepared: Path) -> None:
    spec = signed_spec(prepared)
    pair = Pair(tmp_path, spec, prepared)
    # The creator's copy is checked, then changed on its disk (it rots, or its owner lies).
    asyncio.run(pair.creator.open())
    pair.joiner.store.open()
    path = prepared / "tokenizer.json"
    original = path.read_bytes()
    try:
        path.write_bytes(original.replace(b'"<|endoftext|>"', b'"<|endoftexx|>"', 1))
        with pytest.raises(DataUnavailable, match="the tokenizer .* sent a copy whose SHA-256"):
            asyncio.run(pair.joiner.fetcher.ensure(_tokenizer_wanted(pair), deadline_s=0.5))
        assert pair.joiner.fetcher.counters.refused >= 1 and not pair.joiner.store.has(spec.spec.tokenizer_sha256)
    finally:
        path.write_bytes(original)
        pair.creator.store.close()


def _tokenizer_wanted(pair: Pair) -> Any:
    from swarmd.data.fetching import Wanted

    manifest = pair.creator.manifest
    assert manifest is not None and manifest.tokenizer.sha256 is not None and manifest.tokenizer.file is not None
    return Wanted(manifest.tokenizer.sha256, manifest.tokenizer.file, 1 << 26, "the tokenizer", anyone=True)


def test_data_prepared_with_no_held_out_split_trains_and_is_never_scored(tmp_path: Path) -> None:
    preset = dataclasses.replace(PRESETS["tiny-llama-bpe"], validation_fraction=0.0)
    materialize(preset, tmp_path / "preset")
    data = tmp_path / "preset" / "data"
    files = Pair(tmp_path, signed_spec(data), data).creator

    async def main() -> tuple[int, Any, dict[str, Any]]:
        await files.open()
        training = await files.training_data()
        assert isinstance(training, ShardedData)
        await training.ready(0, 4, 4, deadline_s=30)
        status = training.status()
        batch, held_out = training.micro_batch(0, 4), await training.held_out()
        await files.stop()
        return batch.shape[0], held_out, status

    rows, held_out, status = asyncio.run(main())
    assert rows == 4 and held_out is None
    assert status["held_out_shards"] == 0 and status["held_out_sequences"] == 0
