"""models/build.py and models/stages.py: layer splits, and a stage chain that equals the full model."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, PreTrainedModel

from swarmd.errors import SwarmdError
from swarmd.models.build import ModelError, ModelShape, build_model, make_config
from swarmd.models.cell_compute import flatten_parameters, unflatten_parameters
from swarmd.models.stages import (
    EMBEDDING_KEYS,
    StageModule,
    full_state_dict_keys,
    merge_stage_state_dicts,
    split_layers,
    stage_input_spec,
    stage_output_spec,
    stage_sizes,
)

pytestmark = pytest.mark.timeout(60)

FAMILIES = ["gpt2", "llama"]
# One stage, two even, three uneven, two uneven: every boundary kind (first/middle/last).
PLANS = [
    [(0, 4)],
    [(0, 2), (2, 4)],
    [(0, 1), (1, 3), (3, 4)],
    [(0, 3), (3, 4)],
]


def _shape(family: str) -> ModelShape:
    return ModelShape(family=family, layers=4, hidden=32, heads=4, vocab=256, seq_len=16)


def _batch(seed: int = 1, batch: int = 3, seq: int = 16) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (batch, seq), generator=gen)


def _assert_valid_split(layers: int, stages: int, ranges: list[tuple[int, int]]) -> None:
    assert len(ranges) == stages
    assert ranges[0][0] == 0 and ranges[-1][1] == layers
    for (_, end), (start, _) in itertools.pairwise(ranges):
        assert end == start
    assert all(end - start >= 1 for start, end in ranges)


# ---- split_layers ----


@pytest.mark.parametrize(
    ("layers", "stages", "weights", "expected"),
    [
        (4, 1, None, [(0, 4)]),
        (4, 2, None, [(0, 2), (2, 4)]),
        (10, 3, None, [(0, 4), (4, 7), (7, 10)]),
        (4, 4, None, [(0, 1), (1, 2), (2, 3), (3, 4)]),
        (8, 2, [3.0, 1.0], [(0, 6), (6, 8)]),
        (12, 3, [1.0, 2.0, 3.0], [(0, 2), (2, 6), (6, 12)]),
        (5, 3, [100.0, 1.0, 1.0], [(0, 3), (3, 4), (4, 5)]),  # the one-layer minimum wins
    ],
)
def test_split_layers_cases(
    layers: int, stages: int, weights: list[float] | None, expected: list[tuple[int, int]]
) -> None:
    assert split_layers(layers, stages, weights) == expected


@pytest.mark.parametrize(
    ("layers", "stages", "weights", "needle"),
    [
        (3, 4, None, "3 layers into 4 stages"),
        (0, 1, None, "0"),
        (4, 0, None, "0 stages"),
        (4, 2, [1.0], "1 stage weights for 2 stages"),
        (4, 2, [1.0, 0.0], "stage 1 weight is 0.0"),
        (4, 2, [1.0, -2.0], "stage 1 weight is -2.0"),
        (4, 2, [float("nan"), 1.0], "stage 0 weight is nan"),
        (4, 2, [float("inf"), 1.0], "stage 0 weight is inf"),
    ],
)
def test_split_layers_rejects_bad_input(layers: int, stages: int, weights: list[float] | None, needle: str) -> None:
    with pytest.raises(ModelError, match=needle) as info:
        split_layers(layers, stages, weights)
    # Callers may catch either the swarmd base or the plain ValueError.
    assert isinstance(info.value, SwarmdError) and isinstance(info.value, ValueError)


def test_split_layers_brute_force() -> None:
    weight_choices = [0.5, 1.0, 2.0, 3.0]
    for layers in range(1, 11):
        for stages in range(1, min(layers, 4) + 1):
            even = split_layers(layers, stages)
            _assert_valid_split(layers, stages, even)
            sizes = [end - start for start, end in even]
            assert max(sizes) - min(sizes) <= 1
            assert sizes == sorted(sizes, reverse=True)  # extra layers go to the earlier stages
            for weights in itertools.product(weight_choices, repeat=stages):
                ranges = split_layers(layers, stages, list(weights))
                _assert_valid_split(layers, stages, ranges)
                total = sum(Fraction(w) for w in weights)
                quotas = [layers * Fraction(w) / total for w in weights]
                if all(q >= 1 for q in quotas):
                    # Largest remainder: each stage within one layer of its exact share.
                    for (start, end), q in zip(ranges, quotas, strict=True):
                        assert abs((end - start) - q) < 1, (layers, weights, ranges)
                # A faster device never gets fewer layers than a slower one.
                for (i, wi), (j, wj) in itertools.permutations(enumerate(weights), 2):
                    if wi > wj:
                        assert ranges[i][1] - ranges[i][0] >= ranges[j][1] - ranges[j][0], (layers, weights)


# ---- build_model / ModelShape ----


@pytest.mark.parametrize("family", FAMILIES)
def test_build_model_is_seeded(family: str) -> None:
    shape = _shape(family)
    torch.manual_seed(123)
    before = torch.rand(1)
    a, b, c = build_model(shape, 7), build_model(shape, 7), build_model(shape, 8)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert sa.keys() == sb.keys() == sc.keys()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert any(not torch.equal(sa[k], sc[k]) for k in sa if sa[k].dim() > 1)
    # Building a model neither reads nor moves the caller's RNG.
    torch.manual_seed(123)
    assert torch.equal(torch.rand(1), before)


@pytest.mark.parametrize("family", FAMILIES)
def test_config_is_untied_sdpa_and_dropout_free(family: str) -> None:
    model = build_model(_shape(family), 0)
    assert model.config.tie_word_embeddings is False
    assert model.config._attn_implementation == "sdpa"
    head = model.lm_head.weight
    embedding = model.get_input_embeddings().weight
    assert head.data_ptr() != embedding.data_ptr()
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert all(m.p == 0.0 for m in model.modules() if isinstance(m, torch.nn.Dropout))


def test_model_shape_validation() -> None:
    d = _shape("gpt2").to_dict()
    assert ModelShape.from_dict(d) == _shape("gpt2")
    with pytest.raises(ModelError, match="unknown keys"):
        ModelShape.from_dict({**d, "experts": 8})
    with pytest.raises(ModelError, match="lacks keys"):
        ModelShape.from_dict({k: v for k, v in d.items() if k != "heads"})
    with pytest.raises(ModelError, match="family 'bert'"):
        ModelShape.from_dict({**d, "family": "bert"})
    with pytest.raises(ModelError, match="not divisible by 5 heads"):
        ModelShape.from_dict({**d, "heads": 5})
    with pytest.raises(ModelError, match="layers must be a positive integer"):
        ModelShape.from_dict({**d, "layers": True})
    with pytest.raises(ModelError, match="must be even"):
        ModelShape(family="llama", layers=1, hidden=12, heads=4, vocab=8, seq_len=8)


# ---- stage chain == full model ----


def _chain_loss_and_grads(
    stages: list[StageModule], ids: torch.Tensor, micro_batch: int, shape: ModelShape
) -> torch.Tensor:
    """Forward then backward through the stages exactly as the pipeline runs them."""
    inputs: list[torch.Tensor] = []
    outputs: list[torch.Tensor] = []
    x = ids
    for stage in stages:
        spec = stage_input_spec(shape, stage.stage, micro_batch)
        assert (x.dtype, tuple(x.shape)) == spec
        if stage.stage > 0:
            # What arrives over the wire: a leaf that collects the gradient to send back.
            x = x.detach().requires_grad_()
        inputs.append(x)
        out = stage(x, labels=ids) if stage.is_last else stage(x)
        assert (out.dtype, tuple(out.shape)) == stage_output_spec(shape, stage.stage, len(stages), micro_batch)
        outputs.append(out)
        x = out
    loss = outputs[-1]
    loss.backward()
    for i in range(len(stages) - 2, -1, -1):
        grad = inputs[i + 1].grad
        assert grad is not None
        assert (grad.dtype, tuple(grad.shape)) == stage_input_spec(shape, i + 1, micro_batch)
        outputs[i].backward(grad)
    return loss.detach()


def _prefixed(name: str) -> Callable[[str], str]:
    return lambda message: f"{name}: {message}"


@pytest.mark.parametrize("plan", PLANS, ids=lambda p: "-".join(f"{a}:{b}" for a, b in p))
@pytest.mark.parametrize("family", FAMILIES)
def test_stage_chain_matches_full_model(family: str, plan: list[tuple[int, int]]) -> None:
    _check_chain_matches_full_model(_shape(family), plan)


@pytest.mark.parametrize("plan", PLANS, ids=lambda p: "-".join(f"{a}:{b}" for a, b in p))
def test_grouped_query_attention_and_rope_theta_chain_like_the_full_model(plan: list[tuple[int, int]]) -> None:
    shape = ModelShape(**{**_shape("llama").to_dict(), "kv_heads": 2, "rope_theta": 500.0, "positions": 64})
    _check_chain_matches_full_model(shape, plan)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_tied_single_stage_matches_the_full_model(family: str) -> None:
    shape = ModelShape(**{**_shape(family).to_dict(), "tied": True})
    _check_chain_matches_full_model(shape, [(0, 4)])
    stage = StageModule.from_shape(shape, 0, [(0, 4)], 0)
    embedding = stage.get_submodule(EMBEDDING_KEYS[family].removesuffix(".weight")).weight
    # One parameter, listed once under the embedding's name: the flat vector holds it once.
    assert stage.lm_head.weight is embedding
    names = [name for name, _ in stage.named_parameters()]
    assert EMBEDDING_KEYS[family] in names and "lm_head.weight" not in names
    assert stage_sizes(shape, [(0, 4)]) == [sum(p.numel() for p in stage.parameters())]


@pytest.mark.parametrize("family", FAMILIES)
def test_a_tied_model_is_not_cut_into_stages(family: str) -> None:
    shape = ModelShape(**{**_shape(family).to_dict(), "tied": True})
    with pytest.raises(ModelError, match="cannot be cut into 2 stages.*use stages = 1, or tied = false"):
        StageModule.from_shape(shape, 0, [(0, 2), (2, 4)], 1)


def _check_chain_matches_full_model(shape: ModelShape, plan: list[tuple[int, int]]) -> None:
    model = build_model(shape, 3)
    stages = [StageModule(model, plan, i) for i in range(len(plan))]
    ids = _batch()

    loss = _chain_loss_and_grads(stages, ids, ids.size(0), shape)
    reference = model(ids, labels=ids).loss
    reference.backward()
    # The tolerance, not bit-identity: the same ops on the same numbers, but the attention
    # kernel's sums may run in another order (docs/data-path.md, "Where determinism is kept").
    torch.testing.assert_close(loss, reference.detach(), atol=1e-5, rtol=0)

    full_grads = {name: p.grad for name, p in model.named_parameters()}
    seen: set[str] = set()
    for stage in stages:
        for name, p in stage.named_parameters():
            assert name not in seen, f"{name} owned by two stages"
            seen.add(name)
            assert p.grad is not None, f"stage {stage.stage}: {name} got no gradient"
            full = full_grads[name]
            assert full is not None
            torch.testing.assert_close(p.grad, full, atol=1e-5, rtol=1e-4, msg=_prefixed(name))
    assert seen == set(full_grads), "every parameter of the full model is owned by exactly one stage"


@pytest.mark.parametrize("family", FAMILIES)
def test_stages_attend_causally_through_sdpa_without_a_mask(family: str, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[bool, bool]] = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def spy(*args: object, **kwargs: object) -> torch.Tensor:
        calls.append((kwargs.get("attn_mask") is None, bool(kwargs.get("is_causal"))))
        return sdpa(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    shape = _shape(family)
    model = build_model(shape, 3)
    first, last = (StageModule(model, [(0, 2), (2, 4)], i) for i in range(2))
    ids = _batch()
    logits = last(first(ids))
    # No mask, is_causal: what the flash and memory-efficient kernels take.
    assert calls == [(True, True)] * shape.layers
    # And causal it is: a later token changes no earlier position's logits.
    changed = ids.clone()
    changed[:, 10] = (changed[:, 10] + 1) % 256
    after = last(first(changed))
    torch.testing.assert_close(after[:, :10], logits[:, :10], atol=1e-6, rtol=0)
    assert not torch.allclose(after[:, 10:], logits[:, 10:])


def test_a_stage_refuses_a_model_with_another_attention_kernel() -> None:
    config = make_config(_shape("llama"))
    config._attn_implementation = "eager"  # which, without a mask, would attend to the future
    with pytest.raises(ModelError, match="attention is 'eager'; a stage computes with 'sdpa'"):
        StageModule(AutoModelForCausalLM.from_config(config), [(0, 4)], 0)


@pytest.mark.parametrize("family", FAMILIES)
def test_stage_ownership_and_outputs(family: str) -> None:
    shape = _shape(family)
    plan = [(0, 1), (1, 3), (3, 4)]
    first, middle, last = (StageModule.from_shape(shape, 0, plan, i) for i in range(3))
    embed = "transformer.wte.weight" if family == "gpt2" else "model.embed_tokens.weight"
    blocks = "transformer.h." if family == "gpt2" else "model.layers."
    assert embed in first.state_dict() and "lm_head.weight" not in first.state_dict()
    assert {k.split(".")[2] for k in middle.state_dict()} == {"1", "2"}
    assert all(k.startswith(blocks) for k in middle.state_dict())
    assert "lm_head.weight" in last.state_dict() and embed not in last.state_dict()

    ids = _batch(seq=10)  # shorter than seq_len: allowed, positions start at 0
    hidden = middle(first(ids))
    assert hidden.shape == (3, 10, shape.hidden)
    assert last(hidden).shape == (3, 10, shape.vocab)  # logits without labels
    assert last(hidden, labels=ids).dim() == 0

    with pytest.raises(ModelError, match="token ids"):
        first(hidden)
    with pytest.raises(ModelError, match="hidden states"):
        middle(ids)
    with pytest.raises(ModelError, match="longer than"):
        first(_batch(seq=17))
    with pytest.raises(ModelError, match="cover 3 of 4 layers"):
        StageModule.from_shape(shape, 0, [(0, 1), (1, 3)], 0)
    with pytest.raises(ModelError, match="does not follow on"):
        StageModule.from_shape(shape, 0, [(0, 2), (1, 4)], 0)


def test_stage_does_not_share_tensors_with_source() -> None:
    model = build_model(_shape("gpt2"), 0)
    stage = StageModule(model, [(0, 4)], 0)
    source_ptrs = {p.data_ptr() for p in model.parameters()}
    assert not any(p.data_ptr() in source_ptrs for p in stage.parameters())


# ---- checkpoints ----


@pytest.mark.parametrize("family", FAMILIES)
def test_merged_stage_state_dicts_load_into_full_model(
    family: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shape = _shape(family)
    model = build_model(shape, 5)
    plan = split_layers(shape.layers, 3, [1.0, 2.0, 1.0])
    parts = [StageModule.from_shape(shape, 5, plan, i).state_dict() for i in range(len(plan))]
    merged = merge_stage_state_dicts(parts, shape)

    full = model.state_dict()
    assert merged.keys() == full.keys() == full_state_dict_keys(shape)
    assert all(torch.equal(merged[k], full[k]) for k in full)

    fresh = AutoModelForCausalLM.from_config(make_config(shape))
    fresh.load_state_dict(merged, strict=True)
    ids = _batch()
    torch.testing.assert_close(fresh(ids, labels=ids).loss, model(ids, labels=ids).loss, atol=1e-6, rtol=0)

    # The export path: a safetensors file plus config that from_pretrained reads, offline.
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    make_config(shape).save_pretrained(tmp_path)
    save_file({k: v.contiguous() for k, v in merged.items()}, str(tmp_path / "model.safetensors"))
    loaded: PreTrainedModel = AutoModelForCausalLM.from_pretrained(tmp_path)
    loaded_sd = loaded.state_dict()
    assert all(torch.equal(loaded_sd[k], full[k]) for k in full)


def test_merge_rejects_duplicate_and_missing_keys() -> None:
    shape = _shape("llama")
    plan = [(0, 2), (2, 4)]
    parts = [StageModule.from_shape(shape, 0, plan, i).state_dict() for i in range(2)]
    with pytest.raises(ModelError, match="held by both stage 0 and stage 1"):
        merge_stage_state_dicts([parts[0], parts[0]])
    with pytest.raises(ModelError, match="missing"):
        merge_stage_state_dicts(parts[:1], shape)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_tied_stages_flat_vector_exports_a_model_that_loads_tied(
    family: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shape = ModelShape(**{**_shape(family).to_dict(), "tied": True, "kv_heads": 2 if family == "llama" else 0})
    stage = StageModule.from_shape(shape, 5, [(0, 4)], 0)
    with torch.no_grad():  # a trained head: the shared weight moved, for both of its ends
        stage.get_submodule(EMBEDDING_KEYS[family].removesuffix(".weight")).weight.add_(0.5)
    # What the export path holds: the stage's flat vector as a state dict, without lm_head.weight.
    part = unflatten_parameters(stage, flatten_parameters(stage))
    assert "lm_head.weight" not in part
    merged = merge_stage_state_dicts([part], shape)
    assert merged.keys() == full_state_dict_keys(shape)
    assert merged["lm_head.weight"] is merged[EMBEDDING_KEYS[family]]
    # A stage's own state_dict names the shared weight twice; that merges the same.
    assert merge_stage_state_dicts([stage.state_dict()], shape).keys() == merged.keys()

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    make_config(shape).save_pretrained(tmp_path)
    save_file({k: v.clone().contiguous() for k, v in merged.items()}, str(tmp_path / "model.safetensors"))
    loaded: PreTrainedModel = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert loaded.lm_head.weight is loaded.get_input_embeddings().weight
    ids = _batch()
    torch.testing.assert_close(loaded(ids, labels=ids).loss, stage(ids, labels=ids), atol=1e-5, rtol=0)


def test_merge_refuses_a_tied_head_that_differs_from_the_embedding() -> None:
    shape = ModelShape(**{**_shape("gpt2").to_dict(), "tied": True})
    part = dict(StageModule.from_shape(shape, 0, [(0, 4)], 0).state_dict())
    part["lm_head.weight"] = part["lm_head.weight"] + 1
    with pytest.raises(ModelError, match="tied, but the stages give lm_head.weight and transformer.wte.weight"):
        merge_stage_state_dicts([part], shape)
