"""The initial weights' manifest: every chunk of every stage hashed, so any chunk can be checked."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from swarmd.models.build import make_config
from swarmd.models.cell_compute import flatten_parameters
from swarmd.models.initial_weights import InitialWeights, InitialWeightsError, chunk_bytes, describe, values_of
from swarmd.models.shape import ModelShape
from swarmd.models.stages import StageModule, split_layers

pytestmark = pytest.mark.timeout(60)

SHAPE = ModelShape(family="llama", layers=2, hidden=32, heads=4, kv_heads=2, vocab=128, seq_len=16)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("ckpt")
    torch.manual_seed(3)
    AutoModelForCausalLM.from_config(make_config(SHAPE)).save_pretrained(folder)
    return folder


def test_the_chunks_are_the_stages_flat_vectors_and_their_digests_check(checkpoint: Path) -> None:
    weights = describe(checkpoint, SHAPE, 2, chunk_elements=5000)  # several chunks a stage at this size
    assert InitialWeights.parse(weights.to_json()) == weights
    model = AutoModelForCausalLM.from_pretrained(checkpoint)
    for stage in range(2):
        expected = flatten_parameters(StageModule(model, split_layers(2, 2), stage))
        assert weights.sizes[stage] == expected.numel() and len(weights.chunks[stage]) > 1
        for chunk, digest in enumerate(weights.chunks[stage]):
            data = chunk_bytes(checkpoint, weights, stage, chunk)
            assert hashlib.sha256(data).hexdigest() == digest
            lo, hi = weights.chunk_span(stage, chunk)
            assert torch.equal(values_of(data), expected[lo:hi])
            assert weights.locate(digest) == (stage, chunk)
    assert list(weights.chunks_of(1, 4999, 5001)) == [0, 1]


def test_a_manifest_from_a_peer_is_checked(checkpoint: Path) -> None:
    weights = describe(checkpoint, SHAPE, 2)
    raw = weights.to_json()
    assert InitialWeights.parse(raw) == weights
    body = json.loads(raw)
    for change, message in [
        ({"chunks": [body["chunks"][0], []]}, "stage 1 needs 1 chunk digests"),
        ({"checkpoint": "xyz"}, "bad checkpoint digest"),
        ({"stages": 3}, "bad checkpoint digest, stages, sizes or chunks"),
        ({"extra": 1}, "has keys"),
        ({"format": "other"}, "not an initial weights' manifest"),
    ]:
        with pytest.raises(InitialWeightsError, match=message):
            InitialWeights.parse(json.dumps({**body, **change}).encode())
    with pytest.raises(InitialWeightsError, match="over"):
        InitialWeights.parse(b" " * (16 * 1024 * 1024 + 1))
