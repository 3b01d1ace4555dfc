"""Cutting a model into pipeline stages by layer ranges.

A stage owns a contiguous range of transformer blocks. Stage 0 also owns the embeddings, the last
stage the final norm, the LM head and the loss; a single stage owns everything. A stage's
parameters keep the names they have in the full ``transformers`` model (``transformer.h.3.attn
.c_attn.weight``, ``model.layers.2.mlp.up_proj.weight``, ``lm_head.weight``), so stage state
dicts merge into one checkpoint that ``from_pretrained`` loads, and a parameter server can check
a gradient's names against the full model.

Chaining the stages of one model reproduces the full model's loss and gradients, to float
rounding: each stage calls the very same block modules with the same position embeddings, and
causal attention without a mask, as the full model does with sdpa attention and no padding
(tests/unit/models/test_stages.py checks this for both families, within a stated tolerance:
the attention kernel may differ in summation order, never in what it computes).

A model with tied embeddings is staged only as one stage (``check_tied_stages``): its
embedding and head are one parameter, and cut into two stages they would sit on different
peers and parameter servers, whose two gradients would have to be summed before every update.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping, Sequence
from fractions import Fraction
from functools import lru_cache
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from swarmd.models.build import ATTN_IMPLEMENTATION, ModelError, ModelShape, build_model, make_config
from swarmd.models.layer_runner import LayerRunner

if TYPE_CHECKING:  # imported where a model is made (swarmd.models.build)
    from transformers import PreTrainedModel

# Label value that the loss skips (padding), the same convention as transformers.
IGNORE_INDEX = -100
HEAD_KEY = "lm_head.weight"
EMBEDDING_KEYS = {"gpt2": "transformer.wte.weight", "llama": "model.embed_tokens.weight"}
"""The full model's name of the token embedding, which a tied head shares."""


def check_tied_stages(tied: bool, stages: int) -> None:
    """Refuse tied embeddings in a model cut into more than one stage (see the module docstring)."""
    if tied and stages > 1:
        raise ModelError(
            f"a model with tied embeddings (tied = true) cannot be cut into {stages} stages: the embedding "
            f"sits on the first stage and the head on the last, on different peers and parameter servers, "
            f"and their one weight would need both gradients summed before every update; use stages = 1, "
            f"or tied = false (a tied checkpoint is untied on import: the head starts as a copy of the embedding)"
        )


def split_layers(layers: int, stages: int, weights: Sequence[float] | None = None) -> list[tuple[int, int]]:
    """Contiguous half-open layer ranges ``[(start, end), ...]`` covering ``range(layers)``.

    Every stage gets at least one layer. With ``weights`` (e.g. the devices' speeds) each stage's
    share is proportional to its weight (largest-remainder rounding, so it is off from its exact
    quota by less than one layer unless the one-layer minimum forces it); without, the split is
    as even as possible and the earlier stages take the extra layers, keeping the last stage
    (which also runs the LM head and the loss) the lighter one.

    Arithmetic is exact (fractions): every peer must derive the same plan from the same inputs.
    """
    if isinstance(layers, bool) or not isinstance(layers, int) or layers < 1:
        raise ModelError(f"cannot split {layers!r} layers: need a positive number of layers")
    if isinstance(stages, bool) or not isinstance(stages, int) or stages < 1:
        raise ModelError(f"cannot split into {stages!r} stages: need at least 1 stage")
    if stages > layers:
        raise ModelError(
            f"cannot split {layers} layers into {stages} stages: each stage needs at least one layer; "
            f"use at most {layers} stages"
        )
    if weights is None:
        weights = [1.0] * stages
    if len(weights) != stages:
        raise ModelError(f"got {len(weights)} stage weights for {stages} stages; give one weight per stage")
    exact: list[Fraction] = []
    for i, w in enumerate(weights):
        # `not w > 0` also catches NaN; an infinite weight would leave every other stage nothing.
        if isinstance(w, bool) or not isinstance(w, int | float) or not w > 0 or w == float("inf"):
            raise ModelError(f"stage {i} weight is {w!r}; weights must be positive finite numbers")
        exact.append(Fraction(w))
    total = sum(exact)
    quotas = [layers * w / total for w in exact]
    counts = [max(1, int(q)) for q in quotas]
    # Hand out what is left to the stages furthest below their quota, or take back from the ones
    # furthest above it (never below one layer); ties favour the earlier stage.
    while sum(counts) < layers:
        i = max(range(stages), key=lambda j: (quotas[j] - counts[j], -j))
        counts[i] += 1
    while sum(counts) > layers:
        i = max((j for j in range(stages) if counts[j] > 1), key=lambda j: (counts[j] - quotas[j], j))
        counts[i] -= 1
    ranges = []
    start = 0
    for c in counts:
        ranges.append((start, start + c))
        start += c
    return ranges


def check_ranges(layers: int, ranges: Sequence[tuple[int, int]]) -> None:
    """Raise ``ModelError`` unless ``ranges`` are non-empty, contiguous and cover ``range(layers)``."""
    expected_start = 0
    for i, (start, end) in enumerate(ranges):
        if start != expected_start or end <= start:
            raise ModelError(
                f"stage {i} layer range [{start}, {end}) does not follow on from layer {expected_start}; "
                f"ranges must be contiguous and non-empty, e.g. from split_layers()"
            )
        expected_start = end
    if not ranges or expected_start != layers:
        raise ModelError(f"stage layer ranges {list(ranges)} cover {expected_start} of {layers} layers")


class TensorSpec(NamedTuple):
    """What a tensor crossing a stage boundary must look like."""

    dtype: torch.dtype
    shape: tuple[int, ...]


def stage_input_spec(shape: ModelShape, stage: int, micro_batch: int, dtype: torch.dtype = torch.float32) -> TensorSpec:
    """Stage 0 takes token ids ``long [B, T]``; later stages hidden states ``dtype [B, T, H]``.

    The gradient a stage sends back upstream has its input's spec (stage 0 sends none).
    """
    if stage < 0:
        raise ModelError(f"stage index {stage} is negative")
    if stage == 0:
        return TensorSpec(torch.long, (micro_batch, shape.seq_len))
    return TensorSpec(dtype, (micro_batch, shape.seq_len, shape.hidden))


def stage_output_spec(
    shape: ModelShape, stage: int, num_stages: int, micro_batch: int, dtype: torch.dtype = torch.float32
) -> TensorSpec:
    """The last stage outputs the scalar loss (float32); the others hidden states ``[B, T, H]``.

    The gradient a stage receives from downstream has its output's spec.
    """
    if not 0 <= stage < num_stages:
        raise ModelError(f"stage index {stage} is out of range for {num_stages} stages")
    if stage == num_stages - 1:
        return TensorSpec(torch.float32, ())
    return TensorSpec(dtype, (micro_batch, shape.seq_len, shape.hidden))


def causal_lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy: position t predicts label t+1; ``IGNORE_INDEX`` is skipped.

    Computed in float32 whatever the logits' dtype, as transformers does, so a half-precision
    stage does not lose the loss to rounding.
    """
    shift_logits = logits[:, :-1, :].float()
    shift_labels = labels[:, 1:].to(shift_logits.device)
    return F.cross_entropy(
        shift_logits.reshape(-1, shift_logits.size(-1)), shift_labels.reshape(-1), ignore_index=IGNORE_INDEX
    )


class _Gpt2Body(nn.Module):
    """The part of ``GPT2LMHeadModel.transformer`` one stage owns (attributes keep their names)."""

    wte: nn.Embedding
    wpe: nn.Embedding
    drop: nn.Dropout
    ln_f: nn.LayerNorm

    def __init__(self, src: Any, start: int, end: int, first: bool, last: bool) -> None:
        super().__init__()
        self.h = nn.ModuleDict({str(i): src.h[i] for i in range(start, end)})
        if first:
            self.wte, self.wpe, self.drop = src.wte, src.wpe, src.drop
        if last:
            self.ln_f = src.ln_f


class _LlamaBody(nn.Module):
    """The part of ``LlamaForCausalLM.model`` one stage owns (attributes keep their names)."""

    embed_tokens: nn.Embedding
    norm: nn.Module

    def __init__(self, src: Any, start: int, end: int, first: bool, last: bool) -> None:
        super().__init__()
        self.layers = nn.ModuleDict({str(i): src.layers[i] for i in range(start, end)})
        # Rotary embeddings have no weights (their buffers are not persistent), so every stage
        # computes its own cos/sin rather than receiving them over the wire.
        self.rotary_emb: nn.Module = src.rotary_emb
        if first:
            self.embed_tokens = src.embed_tokens
        if last:
            self.norm = src.norm


class StageModule(nn.Module):
    """One pipeline stage of a GPT-2 or Llama causal LM, with the full model's parameter names.

    The owned submodules are deep copies, so the source model is left untouched and several
    stages built from one model share no tensors (a stage's gradients are its own).
    """

    transformer: _Gpt2Body
    model: _LlamaBody
    lm_head: nn.Linear

    def __init__(self, model: PreTrainedModel, ranges: Sequence[tuple[int, int]], stage: int) -> None:
        super().__init__()
        config = model.config
        family = config.model_type
        if family not in ("gpt2", "llama"):
            raise ModelError(f"model type {family!r} cannot be staged; use a gpt2 or llama model")
        attention = getattr(config, "_attn_implementation", None)
        if attention != ATTN_IMPLEMENTATION:
            # The stage passes no mask and leaves causality to the kernel (see _forward_gpt2).
            raise ModelError(
                f"the model's attention is {attention!r}; a stage computes with {ATTN_IMPLEMENTATION!r} "
                f"(build it with models.build.make_config)"
            )
        layers = config.num_hidden_layers
        check_ranges(layers, ranges)
        if not 0 <= stage < len(ranges):
            raise ModelError(f"stage index {stage} is out of range for {len(ranges)} stages")
        check_tied_stages(bool(getattr(config, "tie_word_embeddings", False)), len(ranges))
        self.family = family
        self.stage = stage
        self.num_stages = len(ranges)
        self.layer_range: tuple[int, int] = (ranges[stage][0], ranges[stage][1])
        self.hidden_size: int = config.hidden_size
        self.is_first = stage == 0
        self.is_last = stage == self.num_stages - 1
        self.config = config

        start, end = self.layer_range
        # Containers named like the full model's (`transformer` / `model`), blocks in a dict keyed
        # by their global index, so state_dict() keys match the full model's exactly.
        src: Any = model.transformer if family == "gpt2" else model.model
        if family == "gpt2":
            self.transformer = _Gpt2Body(src, start, end, self.is_first, self.is_last)
        else:
            self.model = _LlamaBody(src, start, end, self.is_first, self.is_last)
        if self.is_last:
            self.lm_head = model.lm_head
        # One deepcopy of everything owned, after assembly: shared objects (the config the blocks
        # hold; a tied head's weight, which is the embedding's parameter) stay shared among this
        # stage's modules, and nothing is shared with `model`. A tied weight is then one
        # parameter, listed once by named_parameters() (under the embedding's name, registered
        # first), so the stage's flat vector holds it once and a shard's step moves both ends.
        for name, child in copy.deepcopy(dict(self.named_children())).items():
            setattr(self, name, child)
        self.layers_run = LayerRunner()
        """How the decoder layers run (``set_layer_options``): plain by default."""
        self.train(model.training)

    @classmethod
    def from_shape(cls, shape: ModelShape, seed: int, ranges: Sequence[tuple[int, int]], stage: int) -> StageModule:
        """The stage of the model ``build_model(shape, seed)`` builds, so every peer agrees on it."""
        return cls(build_model(shape, seed), ranges, stage)

    def _check_input(self, x: torch.Tensor) -> None:
        # These checks guard programming errors; tensors from peers are validated against
        # stage_input_spec() by the data path before they get here.
        if self.is_first:
            if x.dtype != torch.long or x.dim() != 2:
                raise ModelError(f"stage 0 takes token ids long [B, T], got {x.dtype} {tuple(x.shape)}")
        elif not x.is_floating_point() or x.dim() != 3 or x.size(-1) != self.hidden_size:
            raise ModelError(
                f"stage {self.stage} takes hidden states float [B, T, {self.hidden_size}], "
                f"got {x.dtype} {tuple(x.shape)}"
            )
        limit = self.config.max_position_embeddings
        if x.size(1) > limit:
            raise ModelError(f"sequence of {x.size(1)} tokens is longer than the model's {limit} positions")

    def set_layer_options(self, *, checkpointing: bool = False, compile: bool = False) -> None:
        """Run each decoder layer under activation checkpointing and/or compiled (``layer_runner``);
        the weights, their names and what the stage computes stay as they are."""
        self.layers_run = LayerRunner(checkpointing=checkpointing, compile=compile)

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        """Stage 0 takes ids ``[B, T]``, the others hidden states ``[B, T, H]``.

        The last stage returns the scalar loss when given ``labels`` (the micro-batch's input ids;
        shifted here), or logits ``[B, T, V]`` without; other stages return hidden states.
        """
        self._check_input(x)
        where = f"stage {self.stage}"
        self.layers_run.try_compile(lambda: self._forward_checked(x, labels), list(self.parameters()), where)
        return self._forward_checked(x, labels)

    def _forward_checked(self, x: torch.Tensor, labels: torch.Tensor | None) -> torch.Tensor:
        seq = x.size(1)
        position_ids = torch.arange(seq, device=x.device).unsqueeze(0)
        forward_body = self._forward_gpt2 if self.family == "gpt2" else self._forward_llama
        hidden = forward_body(x, position_ids)
        if not self.is_last:
            return hidden
        logits = self.lm_head(hidden)
        if labels is None:
            return logits
        return causal_lm_loss(logits, labels)

    # No attention mask is passed: transformers' sdpa attention then calls
    # scaled_dot_product_attention with is_causal=True, which the flash and memory-efficient
    # kernels take without a T x T mask (an explicit mask would force the math kernel). The
    # sequences are unpadded, so causal is the whole mask; __init__ refuses any other kernel,
    # since eager attention without a mask would not be causal at all.

    def _forward_gpt2(self, x: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        body = self.transformer
        hidden = body.drop(body.wte(x) + body.wpe(position_ids)) if self.is_first else x
        for block in body.h.values():
            hidden = self.layers_run.call(block, hidden)
        return body.ln_f(hidden) if self.is_last else hidden

    def _forward_llama(self, x: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        body = self.model
        hidden = body.embed_tokens(x) if self.is_first else x
        position_embeddings = body.rotary_emb(hidden, position_ids)
        for block in body.layers.values():
            hidden = self.layers_run.call(
                block, hidden, position_ids=position_ids, position_embeddings=position_embeddings
            )
        return body.norm(hidden) if self.is_last else hidden


def full_state_dict_keys(shape: ModelShape) -> set[str]:
    """The state-dict keys of the full model of ``shape`` (built on the meta device: no memory)."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(make_config(shape))
    return set(model.state_dict())


def merge_stage_state_dicts(
    parts: Sequence[Mapping[str, torch.Tensor]], shape: ModelShape | None = None
) -> dict[str, torch.Tensor]:
    """One full-model state dict from the stages' ones (in stage order).

    A key held by two stages is an error (they would disagree on which tensor wins); with
    ``shape``, so is a key that the full model lacks or has and no stage gave. With a tied
    ``shape``, the head is the embedding's tensor: a stage's flat vector (its ``named_parameters``,
    ``cell_compute.unflatten_parameters``) holds the shared weight once, under the embedding's
    name, and the full model's state dict (what ``load_state_dict`` and the export's key check
    expect) names it twice; ``from_pretrained`` of a tied config loads that as one weight.
    """
    merged: dict[str, torch.Tensor] = {}
    owner: dict[str, int] = {}
    for stage, part in enumerate(parts):
        for key, tensor in part.items():
            if key in merged:
                raise ModelError(f"parameter {key!r} is held by both stage {owner[key]} and stage {stage}")
            merged[key] = tensor
            owner[key] = stage
    if shape is not None and shape.tied:
        _tie_head(merged, EMBEDDING_KEYS[shape.family])
    if shape is not None:
        expected = full_state_dict_keys(shape)
        missing = sorted(expected - set(merged))
        extra = sorted(set(merged) - expected)
        if missing or extra:
            raise ModelError(
                f"merged stage weights do not match the {shape.family} model: "
                f"{len(missing)} missing {missing[:5]}, {len(extra)} unexpected {extra[:5]}"
            )
    return merged


def _tie_head(merged: dict[str, torch.Tensor], embedding_key: str) -> None:
    """Give a tied model's merged state dict its head: the embedding's very tensor."""
    embedding = merged.get(embedding_key)
    if embedding is None:
        return  # reported as missing by the key check
    head = merged.get(HEAD_KEY)
    if head is not None and head is not embedding and not torch.equal(head, embedding):
        raise ModelError(
            f"the model's embeddings are tied, but the stages give {HEAD_KEY} and {embedding_key} "
            f"different values; a tied model has one weight: give the embedding alone"
        )
    merged[HEAD_KEY] = embedding


@lru_cache(maxsize=64)
def stage_parameter_shapes(
    shape: ModelShape, ranges: tuple[tuple[int, int], ...], stage: int
) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """The names and shapes of the stage's parameters in ``named_parameters()`` order: the layout
    of its flat vector (``cell_compute.flatten_parameters``). Built on the meta device, so it
    costs no memory whatever the model's size; cached, since a peer asks it for every slice."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        module = StageModule(AutoModelForCausalLM.from_config(make_config(shape)), ranges, stage)
    return tuple((name, tuple(p.shape)) for name, p in module.named_parameters())


def stage_sizes(shape: ModelShape, ranges: Sequence[tuple[int, int]]) -> list[int]:
    """Each stage's flat vector length (its parameter count), computed without weights."""
    plan = tuple((int(a), int(b)) for a, b in ranges)
    return [sum(math.prod(dims) for _, dims in stage_parameter_shapes(shape, plan, i)) for i in range(len(plan))]
