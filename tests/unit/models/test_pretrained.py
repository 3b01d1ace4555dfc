"""models/pretrained.py: a local checkpoint's digest, its shape, and stage slices read from it.

Every "pretrained" checkpoint here is a random small model saved with ``save_pretrained``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, PreTrainedModel

from swarmd.models.build import build_model
from swarmd.models.cell_compute import flatten_parameters
from swarmd.models.pretrained import (
    PretrainedError,
    checkpoint_digest,
    checkpoint_files,
    read_stage_slice,
    shape_from_checkpoint,
    stage_sizes,
)
from swarmd.models.shape import ModelError, ModelShape
from swarmd.models.stages import StageModule

pytestmark = pytest.mark.timeout(60)

PLAN = [(0, 1), (1, 2), (2, 3)]
SHAPES = {
    "llama-gqa": ModelShape(
        family="llama", layers=3, hidden=32, heads=4, kv_heads=2, vocab=64, seq_len=16, rope_theta=5e5, positions=32
    ),
    "llama-gqa-tied": ModelShape(
        family="llama", layers=3, hidden=32, heads=4, kv_heads=2, vocab=64, seq_len=16, tied=True, norm_eps=1e-5
    ),
    "gpt2": ModelShape(family="gpt2", layers=3, hidden=32, heads=4, vocab=64, seq_len=16, intermediate=48),
    "gpt2-tied": ModelShape(family="gpt2", layers=3, hidden=32, heads=4, vocab=64, seq_len=16, tied=True),
}


def _untied(shape: ModelShape) -> ModelShape:
    return ModelShape.from_dict({**shape.to_dict(), "tied": False})


def _save(tmp_path: Path, name: str, **kwargs: Any) -> Path:
    folder = tmp_path / name
    build_model(SHAPES[name], 11).save_pretrained(folder, **kwargs)
    return folder


def _stage_vectors(folder: Path, shape: ModelShape, plan: list[tuple[int, int]]) -> list[torch.Tensor]:
    """What from_pretrained loads, as the stages' flat vectors (untied into ``shape`` if need be)."""
    loaded: PreTrainedModel = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    model = build_model(shape, 0)
    model.load_state_dict(loaded.state_dict(), strict=True)
    return [flatten_parameters(StageModule(model, plan, s)) for s in range(len(plan))]


def _read_in_spans(folder: Path, shape: ModelShape, plan: list[tuple[int, int]], stage: int, size: int) -> torch.Tensor:
    # Uneven spans that start and end inside tensors (and inside rows of them), as shards do.
    cuts = sorted({0, 1, 37, size // 3, size // 3 + 5, size - 70, size})
    parts = [read_stage_slice(folder, shape, plan, stage, lo, hi) for lo, hi in zip(cuts, cuts[1:], strict=False)]
    return torch.cat(parts)


# ---- the shape ----


@pytest.mark.parametrize("name", SHAPES)
def test_the_shape_round_trips_through_a_saved_checkpoint(tmp_path: Path, name: str) -> None:
    folder = _save(tmp_path, name)
    assert shape_from_checkpoint(folder, seq_len=16) == SHAPES[name]
    shorter = shape_from_checkpoint(folder, seq_len=8)
    assert (shorter.seq_len, shorter.max_positions) == (8, SHAPES[name].max_positions)
    with pytest.raises(
        PretrainedError, match="seq_len 64 is longer than the 32 positions|seq_len 64 is longer than the 16"
    ):
        shape_from_checkpoint(folder, seq_len=64)


def test_a_tied_checkpoint_can_be_read_untied_but_not_the_reverse(tmp_path: Path) -> None:
    tied = _save(tmp_path, "llama-gqa-tied")
    assert shape_from_checkpoint(tied, seq_len=16, tied=False) == _untied(SHAPES["llama-gqa-tied"])
    untied = _save(tmp_path, "llama-gqa")
    with pytest.raises(PretrainedError, match="tie_word_embeddings is false"):
        shape_from_checkpoint(untied, seq_len=16, tied=True)
    with pytest.raises(PretrainedError, match="has a head of its own"):
        read_stage_slice(
            untied, ModelShape.from_dict({**SHAPES["llama-gqa"].to_dict(), "tied": True}), [(0, 3)], 0, 0, 1
        )


LLAMA_3_2_1B = {
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 128000,
    "eos_token_id": 128001,
    "head_dim": 64,
    "hidden_act": "silu",
    "hidden_size": 2048,
    "initializer_range": 0.02,
    "intermediate_size": 8192,
    "max_position_embeddings": 131072,
    "mlp_bias": False,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 16,
    "num_key_value_heads": 8,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {
        "factor": 32.0,
        "high_freq_factor": 4.0,
        "low_freq_factor": 1.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
    "rope_theta": 500000.0,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.45.0.dev0",
    "use_cache": True,
    "vocab_size": 128256,
}


def _config_only(tmp_path: Path, config: dict[str, Any]) -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


def test_llama_3_2_1b_config_maps_every_field(tmp_path: Path) -> None:
    shape = shape_from_checkpoint(_config_only(tmp_path, LLAMA_3_2_1B), seq_len=2048)
    assert shape.to_dict() == {
        "family": "llama",
        "layers": 16,
        "hidden": 2048,
        "heads": 32,
        "vocab": 128256,
        "seq_len": 2048,
        "kv_heads": 8,
        "rope_theta": 500000.0,
        "tied": True,
        "intermediate": 8192,
        "positions": 131072,
        "norm_eps": 1e-5,
        "rope_scaling": LLAMA_3_2_1B["rope_scaling"],
    }


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"model_type": "mistral"}, "model_type 'mistral' is not a family swarmd builds; supported: gpt2, llama"),
        ({"attention_bias": True}, "attention_bias = True, but swarmd builds attention_bias = False"),
        ({"mlp_bias": True}, "mlp_bias = True"),
        ({"head_dim": 128}, "head_dim = 128, but swarmd builds head_dim = 64"),
        ({"hidden_act": "gelu"}, "hidden_act = 'gelu'"),
        ({"quantization_config": {"quant_method": "gptq"}}, "quantization_config is set"),
        ({"rope_scaling": {"rope_type": "longrope", "short_factor": [1.0], "long_factor": [1.0]}}, "'longrope'"),
        ({"num_key_value_heads": 5}, "kv_heads 5 does not divide heads 32"),
    ],
)
def test_a_config_swarmd_would_build_differently_is_refused(
    tmp_path: Path, changes: dict[str, Any], words: str
) -> None:
    with pytest.raises(PretrainedError, match=words) as info:
        shape_from_checkpoint(_config_only(tmp_path, {**LLAMA_3_2_1B, **changes}), seq_len=2048)
    assert isinstance(info.value, ModelError)
    assert "config.json" in str(info.value)


def test_a_gpt2_config_with_another_activation_is_refused(tmp_path: Path) -> None:
    folder = _save(tmp_path, "gpt2")
    config = json.loads((folder / "config.json").read_text())
    _config_only(folder, {**config, "activation_function": "relu"})
    with pytest.raises(PretrainedError, match="activation_function = 'relu', but swarmd builds"):
        shape_from_checkpoint(folder, seq_len=16)


def test_an_oversized_or_malformed_config_is_refused(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(" " * (1024 * 1024 + 1))
    with pytest.raises(PretrainedError, match="over 1048576 bytes"):
        shape_from_checkpoint(tmp_path, seq_len=8)
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(PretrainedError, match="must hold a JSON object"):
        shape_from_checkpoint(tmp_path, seq_len=8)


# ---- the digest ----


def test_the_digest_is_stable_and_covers_config_and_weights(tmp_path: Path) -> None:
    folder = _save(tmp_path, "gpt2")
    assert checkpoint_files(folder) == ["config.json", "model.safetensors"]
    digest = checkpoint_digest(folder)
    assert len(digest) == 64 and checkpoint_digest(folder) == digest
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)
    (copy / "generation_config.json").write_text("{}")  # not part of the weights
    assert checkpoint_digest(copy) == digest

    weights = bytearray((copy / "model.safetensors").read_bytes())
    weights[-3] ^= 1
    (copy / "model.safetensors").write_bytes(bytes(weights))
    assert checkpoint_digest(copy) != digest
    shutil.copy(folder / "model.safetensors", copy / "model.safetensors")
    assert checkpoint_digest(copy) == digest
    (copy / "config.json").write_text((folder / "config.json").read_text() + " ")
    assert checkpoint_digest(copy) != digest


def test_a_sharded_checkpoint_lists_its_index_and_shards(tmp_path: Path) -> None:
    folder = _save(tmp_path, "llama-gqa", max_shard_size="40KB")
    files = checkpoint_files(folder)
    shards = [f for f in files if f.startswith("model-")]
    assert len(shards) > 2 and files == sorted(["config.json", "model.safetensors.index.json", *shards])
    digest = checkpoint_digest(folder)
    (folder / shards[1]).write_bytes((folder / shards[1]).read_bytes()[:-1] + b" ")
    assert checkpoint_digest(folder) != digest


def test_pickled_weights_are_refused_with_the_fix(tmp_path: Path) -> None:
    folder = _config_only(tmp_path, LLAMA_3_2_1B)
    (folder / "pytorch_model.bin").write_bytes(b"not read")
    with pytest.raises(PretrainedError, match="re-save it with safetensors"):
        checkpoint_digest(folder)
    (folder / "pytorch_model.bin").unlink()
    with pytest.raises(PretrainedError, match="holds no safetensors weights"):
        checkpoint_files(folder)
    with pytest.raises(PretrainedError, match="has no config.json"):
        checkpoint_files(tmp_path / "nowhere")


@pytest.mark.parametrize("name", ["../model.safetensors", "sub/model.safetensors", "model.bin", ".."])
def test_an_index_may_only_name_plain_files_in_the_folder(tmp_path: Path, name: str) -> None:
    folder = _save(tmp_path, "llama-gqa", max_shard_size="40KB")
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    index["weight_map"]["lm_head.weight"] = name
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(PretrainedError, match="plain .safetensors file names"):
        checkpoint_digest(folder)


# ---- stage slices ----


@pytest.mark.parametrize("name", SHAPES)
def test_slices_of_every_stage_are_the_weights_from_pretrained_loads(tmp_path: Path, name: str) -> None:
    folder = _save(tmp_path, name)
    shape = shape_from_checkpoint(folder, seq_len=16, tied=False)  # three stages need it untied
    expected = _stage_vectors(folder, shape, PLAN)
    assert stage_sizes(shape, PLAN) == [v.numel() for v in expected]
    for stage, vector in enumerate(expected):
        assert torch.equal(_read_in_spans(folder, shape, PLAN, stage, vector.numel()), vector)


def test_a_tied_checkpoint_read_untied_starts_the_head_as_the_embedding(tmp_path: Path) -> None:
    folder = _save(tmp_path, "llama-gqa-tied")
    shape = _untied(SHAPES["llama-gqa-tied"])
    head_stage = StageModule.from_shape(shape, 0, PLAN, 2)
    names = [name for name, _ in head_stage.named_parameters()]
    size = stage_sizes(shape, PLAN)[2]
    head = read_stage_slice(folder, shape, PLAN, 2, size - 64 * 32, size)
    assert names[-1] == "lm_head.weight"
    embedding = load_file(str(folder / "model.safetensors"))["model.embed_tokens.weight"]
    assert torch.equal(head, embedding.reshape(-1))
    # A tied shape of one stage holds the shared weight once.
    tied = SHAPES["llama-gqa-tied"]
    whole = read_stage_slice(folder, tied, [(0, 3)], 0, 0, stage_sizes(tied, [(0, 3)])[0])
    assert torch.equal(whole, _stage_vectors(folder, tied, [(0, 3)])[0])


def test_a_sharded_checkpoint_reads_the_same(tmp_path: Path) -> None:
    single = _save(tmp_path, "llama-gqa")
    sharded = tmp_path / "sharded"
    build_model(SHAPES["llama-gqa"], 11).save_pretrained(sharded, max_shard_size="40KB")
    shape = SHAPES["llama-gqa"]
    for stage, size in enumerate(stage_sizes(shape, PLAN)):
        assert torch.equal(
            _read_in_spans(sharded, shape, PLAN, stage, size), _read_in_spans(single, shape, PLAN, stage, size)
        )


def test_gpt2_keys_without_the_transformer_prefix_and_its_buffers(tmp_path: Path) -> None:
    # OpenAI's GPT-2 files: base-model names, no head (tied), and the causal-mask buffers.
    folder = _save(tmp_path, "gpt2-tied")
    state = load_file(str(folder / "model.safetensors"))
    renamed = {k.removeprefix("transformer."): v for k, v in state.items() if k != "lm_head.weight"}
    renamed["h.0.attn.bias"] = torch.ones(1, 1, 16, 16)
    original = tmp_path / "original"
    original.mkdir()
    shutil.copy(folder / "config.json", original / "config.json")
    save_file(renamed, str(original / "model.safetensors"))
    shape = _untied(SHAPES["gpt2-tied"])
    for stage, size in enumerate(stage_sizes(shape, PLAN)):
        assert torch.equal(
            _read_in_spans(original, shape, PLAN, stage, size), _read_in_spans(folder, shape, PLAN, stage, size)
        )


def test_half_precision_weights_are_widened_exactly(tmp_path: Path) -> None:
    folder = tmp_path / "bf16"
    build_model(SHAPES["llama-gqa"], 11).to(torch.bfloat16).save_pretrained(folder)
    shape = SHAPES["llama-gqa"]
    expected = _stage_vectors(folder, shape, PLAN)
    for stage, vector in enumerate(expected):
        got = read_stage_slice(folder, shape, PLAN, stage, 0, vector.numel())
        assert got.dtype == torch.float32 and torch.equal(got, vector)
        assert torch.equal(got, got.to(torch.bfloat16).to(torch.float32))  # bf16 values, not rounded anew


def test_a_missing_tensor_or_a_wrong_shape_names_the_key(tmp_path: Path) -> None:
    folder = _save(tmp_path, "llama-gqa")
    shape = SHAPES["llama-gqa"]
    state = load_file(str(folder / "model.safetensors"))
    key = "model.layers.1.self_attn.k_proj.weight"
    save_file({k: v for k, v in state.items() if k != key}, str(folder / "model.safetensors"))
    with pytest.raises(PretrainedError, match=f"no tensor '{key}'"):
        read_stage_slice(folder, shape, PLAN, 1, 0, stage_sizes(shape, PLAN)[1])
    save_file({**state, key: torch.zeros(32, 32)}, str(folder / "model.safetensors"))  # no GQA: 4 kv heads
    with pytest.raises(PretrainedError, match=rf"'{key}' has shape \(32, 32\), but the model's {key} has \(16, 32\)"):
        read_stage_slice(folder, shape, PLAN, 1, 0, 10_000)
    with pytest.raises(PretrainedError, match="outside its"):
        read_stage_slice(folder, shape, PLAN, 1, 0, 10**9)
    # An untied checkpoint without its head is broken, not tied.
    save_file({k: v for k, v in state.items() if k != "lm_head.weight"}, str(folder / "model.safetensors"))
    size = stage_sizes(shape, PLAN)[2]
    with pytest.raises(PretrainedError, match="no tensor 'lm_head.weight'"):
        read_stage_slice(folder, shape, PLAN, 2, size - 1, size)
