"""models/build.py: the transformers config a shape makes, and what it round-trips to."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, GPT2Config, LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

from swarmd.models.build import build_model, llama_intermediate_size, make_config
from swarmd.models.shape import FAMILY_NORM_EPS, ModelShape

pytestmark = pytest.mark.timeout(60)

LLAMA_3_2_1B = {  # its config.json as released (transformers 4.45 wrote it), shrunk only in test_rotary
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "head_dim": 64,
    "hidden_act": "silu",
    "hidden_size": 2048,
    "intermediate_size": 8192,
    "max_position_embeddings": 131072,
    "mlp_bias": False,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 16,
    "num_key_value_heads": 8,
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
    "vocab_size": 128256,
}


def test_the_family_defaults_are_the_config_classes_own() -> None:
    # What a shape without norm_eps built before the field existed.
    assert {"gpt2": GPT2Config().layer_norm_epsilon, "llama": LlamaConfig().rms_norm_eps} == FAMILY_NORM_EPS
    assert LlamaConfig().rope_parameters == {"rope_type": "default", "rope_theta": 10000.0}


def test_a_default_shape_makes_the_config_it_always_made() -> None:
    gpt2 = make_config(ModelShape(family="gpt2", layers=4, hidden=128, heads=4, vocab=256, seq_len=128))
    assert (gpt2.n_positions, gpt2.n_inner, gpt2.layer_norm_epsilon, gpt2.tie_word_embeddings) == (
        128,
        None,
        1e-5,
        False,
    )
    llama = make_config(ModelShape(family="llama", layers=4, hidden=96, heads=6, vocab=256, seq_len=64))
    assert (llama.num_key_value_heads, llama.intermediate_size) == (6, llama_intermediate_size(96))
    assert (llama.max_position_embeddings, llama.rms_norm_eps, llama.tie_word_embeddings) == (64, 1e-6, False)
    assert llama.rope_parameters == {"rope_type": "default", "rope_theta": 10000.0}


def test_every_field_reaches_the_llama_config_and_survives_save_and_load(tmp_path: Path) -> None:
    shape = ModelShape(
        family="llama",
        layers=2,
        hidden=64,
        heads=4,
        kv_heads=2,
        vocab=300,
        seq_len=32,
        rope_theta=123456.0,
        tied=True,
        intermediate=80,
        positions=256,
        norm_eps=1e-5,
        rope_scaling=(("factor", 4.0), ("rope_type", "linear")),
    )
    config = make_config(shape)
    assert config._attn_implementation == "sdpa"  # a runtime choice: config.json does not keep it
    config.save_pretrained(tmp_path)
    loaded = AutoConfig.from_pretrained(tmp_path)
    for c in (config, loaded):
        assert (c.num_key_value_heads, c.intermediate_size, c.max_position_embeddings) == (2, 80, 256)
        assert (c.rms_norm_eps, c.tie_word_embeddings) == (1e-5, True)
        assert c.rope_parameters == {"rope_type": "linear", "factor": 4.0, "rope_theta": 123456.0}
    model = build_model(shape, 0)
    assert model.model.layers[0].self_attn.k_proj.weight.shape == (2 * 16, 64)
    assert model.lm_head.weight is model.model.embed_tokens.weight


def test_every_field_reaches_the_gpt2_config() -> None:
    shape = ModelShape(
        family="gpt2", layers=2, hidden=32, heads=4, vocab=100, seq_len=16, tied=True, intermediate=48, positions=64
    )
    config = make_config(shape)
    assert (config.n_positions, config.n_inner, config.tie_word_embeddings) == (64, 48, True)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    assert model.transformer.h[0].mlp.c_fc.weight.shape == (32, 48)
    assert model.lm_head.weight is model.transformer.wte.weight


def test_llama3_rotary_scaling_matches_the_released_config() -> None:
    # The rotary frequencies of a shape written from Llama 3.2 1B's numbers are those that
    # transformers computes from the released config.json itself (legacy keys and all).
    shape = ModelShape(
        family="llama",
        layers=16,
        hidden=2048,
        heads=32,
        kv_heads=8,
        vocab=128256,
        seq_len=2048,
        rope_theta=500000.0,
        tied=True,
        intermediate=8192,
        positions=131072,
        norm_eps=1e-5,
        rope_scaling=tuple(LLAMA_3_2_1B["rope_scaling"].items()),  # type: ignore[attr-defined]
    )
    ours = LlamaRotaryEmbedding(make_config(shape))
    theirs = LlamaRotaryEmbedding(LlamaConfig.from_dict(LLAMA_3_2_1B))
    assert torch.equal(ours.inv_freq, theirs.inv_freq)
    assert ours.attention_scaling == theirs.attention_scaling
