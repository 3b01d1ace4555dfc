"""Model shapes and how a model is built from one: a ``transformers`` config, weights from a seed.

Nothing is ever downloaded: the model class comes from the config alone (``from_config``), and
the weights start from ``torch.manual_seed(seed)`` or are loaded later from a local checkpoint.
Every peer that builds the same shape with the same seed holds bit-identical weights, which is
what lets parameter servers and workers start a run without shipping the initial weights around.
"""

from __future__ import annotations

import importlib
import logging
from typing import TYPE_CHECKING, Any

import torch

from swarmd.models.shape import FAMILIES, ModelError, ModelShape, llama_intermediate_size

if TYPE_CHECKING:  # imported where a model is made: 2 s a daemon start need not pay until then
    from transformers import PretrainedConfig, PreTrainedModel

__all__ = [
    "ATTN_IMPLEMENTATION",
    "FAMILIES",
    "ModelError",
    "ModelShape",
    "build_model",
    "llama_intermediate_size",
    "load_model_library",
    "make_config",
]

logger = logging.getLogger(__name__)

# The attention kernel every swarmd model uses: torch's scaled_dot_product_attention, which
# picks the flash or memory-efficient kernel on CUDA (no T x T scores in memory) and a fused
# kernel on the CPU. Stages pass no mask, so transformers calls it with is_causal=True
# (stages.py). Its fused backward passes may sum in a different order on another device or
# from run to run: a recomputed micro-batch is correct to float rounding, not bit-identical,
# and nothing depends on more (docs/data-path.md, "Where determinism is kept").
ATTN_IMPLEMENTATION = "sdpa"


def load_model_library() -> None:
    """Import the model classes every family builds (blocking: a worker thread).

    transformers loads them on first use, about 2 s of imports on a CPU: a daemon does that in a
    thread before it builds its first stage, so that its event loop (heartbeats, status, the
    requests it serves) never stands still that long."""
    for family in FAMILIES:
        importlib.import_module(f"transformers.models.{family}.modeling_{family}")


def make_config(shape: ModelShape) -> PretrainedConfig:
    """The transformers config for ``shape``: sdpa attention, no dropout, every size explicit.

    Dropout is 0 everywhere: a micro-batch recomputed (its share lost, or a layer under
    activation checkpointing) must compute what the first forward did, and a random mask would
    differ.

    Word embeddings are untied unless ``shape.tied``. In a pipeline the embedding lives on the
    first stage and the head on the last, usually on different peers with different parameter
    servers, and a tied weight would need its two gradients summed across stages before every
    update; so a tied shape is only staged as one stage, where the head's weight *is* the
    embedding's parameter (``stages.StageModule`` refuses more). Untied, each stage owns its
    parameters outright; either way the merged checkpoint has both keys, which
    ``from_pretrained`` loads as they are.

    Every size and epsilon is passed, not left to the config class's defaults, so a shape builds
    the same network whatever transformers release a peer runs (GPT-2's ``n_inner=None`` is its
    own fixed rule, 4 * n_embd). Rotary settings go in ``rope_parameters``, where transformers 5
    keeps them and writes them to config.json, so they survive ``save_pretrained`` and
    ``from_pretrained`` as they are.

    ``bos``/``eos`` token ids are cleared: GPT-2's defaults (50256) lie outside a byte-level
    vocabulary and Llama's (1, 2) would name ordinary bytes; the tokenizer sets its own.
    """
    from transformers import GPT2Config, LlamaConfig

    common: dict[str, Any] = {
        "vocab_size": shape.vocab,
        "tie_word_embeddings": shape.tied,
        "attn_implementation": ATTN_IMPLEMENTATION,
        "bos_token_id": None,
        "eos_token_id": None,
    }
    if shape.family == "gpt2":
        return GPT2Config(
            n_layer=shape.layers,
            n_embd=shape.hidden,
            n_head=shape.heads,
            n_positions=shape.max_positions,
            # None is GPT-2's own "4 * n_embd": kept for a shape at that default, so that its
            # config.json reads as before.
            n_inner=shape.intermediate or None,
            layer_norm_epsilon=shape.layer_norm_eps,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            summary_first_dropout=0.0,
            **common,
        )
    return LlamaConfig(
        num_hidden_layers=shape.layers,
        hidden_size=shape.hidden,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.key_value_heads,
        intermediate_size=shape.intermediate_size,
        max_position_embeddings=shape.max_positions,
        rms_norm_eps=shape.layer_norm_eps,
        rope_parameters={
            "rope_type": "default",
            **shape.rope_scaling_table(),
            "rope_theta": shape.rope_theta,
        },
        attention_dropout=0.0,
        **common,
    )


def build_model(shape: ModelShape, seed: int) -> PreTrainedModel:
    """A causal LM of ``shape`` with weights drawn from ``seed``, in float32, in training mode.

    The global RNG is forked so building a model neither depends on nor disturbs whatever the
    caller seeded (a data loader's shuffle, say).
    """
    from transformers import AutoModelForCausalLM

    config = make_config(shape)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config)
    # from_config uses torch's default dtype, which a caller may have changed; the seed weights
    # are defined in float32 so every peer starts from the same numbers.
    model = model.to(torch.float32)
    # transformers picks the loss by class name and GPT2LMHeadModel matches no pattern, so every
    # reference loss would log "loss_type=None ... unrecognized"; it is the causal-LM loss anyway.
    model.loss_type = "ForCausalLM"
    model.train()
    logger.debug("built %s model (%d layers, hidden %d) from seed %d", shape.family, shape.layers, shape.hidden, seed)
    return model
