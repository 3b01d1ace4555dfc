"""models/shape.py: the optional fields, their defaults, their canonical form and their checks."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from swarmd.models.presets import DEFAULT_RUN
from swarmd.models.shape import ModelError, ModelShape, llama_intermediate_size

pytestmark = pytest.mark.timeout(30)

BASE = {"family": "llama", "layers": 2, "hidden": 64, "heads": 4, "vocab": 256, "seq_len": 32}
LLAMA3_SCALING: dict[str, str | int | float] = {
    "rope_type": "llama3",
    "factor": 32.0,
    "high_freq_factor": 4.0,
    "low_freq_factor": 1.0,
    "original_max_position_embeddings": 8192,
}


def test_the_default_runs_model_table_reads_and_writes_as_before() -> None:
    table = copy.deepcopy(DEFAULT_RUN["model"])
    shape = ModelShape.from_dict(table)
    assert shape.to_dict() == table
    # Byte for byte, in the canonical form a signature covers.
    assert json.dumps(shape.to_dict(), sort_keys=True) == json.dumps(DEFAULT_RUN["model"], sort_keys=True)
    assert (shape.kv_heads, shape.rope_theta, shape.tied, shape.intermediate) == (0, 10000.0, False, 0)
    assert (shape.positions, shape.norm_eps, shape.rope_scaling) == (0, 0.0, ())


def test_defaults_mean_what_swarmd_built_before() -> None:
    llama = ModelShape(**BASE)
    assert llama.key_value_heads == 4
    assert llama.intermediate_size == llama_intermediate_size(64)
    assert llama.max_positions == 32
    assert llama.layer_norm_eps == 1e-6
    gpt2 = ModelShape(**{**BASE, "family": "gpt2"})
    assert (gpt2.intermediate_size, gpt2.layer_norm_eps) == (256, 1e-5)


def test_values_that_mean_the_default_are_stored_as_it() -> None:
    explicit = ModelShape(
        **BASE, kv_heads=4, intermediate=llama_intermediate_size(64), positions=32, norm_eps=1e-6, rope_theta=10000
    )
    assert explicit == ModelShape(**BASE)
    assert explicit.to_dict() == BASE
    assert isinstance(explicit.rope_theta, float)


def test_every_optional_field_round_trips_and_the_shape_stays_hashable() -> None:
    table: dict[str, Any] = {
        **BASE,
        "kv_heads": 2,
        "rope_theta": 500000.0,
        "tied": True,
        "intermediate": 96,
        "positions": 128,
        "norm_eps": 1e-5,
        "rope_scaling": {**LLAMA3_SCALING, "original_max_position_embeddings": 64},
    }
    shape = ModelShape.from_dict(table)
    assert shape.to_dict() == table
    assert ModelShape.from_dict(shape.to_dict()) == shape
    # Stored as sorted pairs whatever order the table came in: one shape, one hash.
    reordered = {**table, "rope_scaling": dict(reversed(list(table["rope_scaling"].items())))}
    assert hash(ModelShape.from_dict(reordered)) == hash(shape)
    assert shape.rope_scaling[0] == ("factor", 32.0)
    assert {shape: 1}[ModelShape.from_dict(table)] == 1


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"kv_heads": 3}, "kv_heads 3 does not divide heads 4"),
        ({"kv_heads": -1}, "kv_heads must be a positive integer"),
        ({"kv_heads": True}, "kv_heads must be a positive integer"),
        ({"family": "gpt2", "kv_heads": 2}, "gpt2 has no grouped-query attention"),
        ({"rope_theta": 0.0}, "rope_theta must be a positive finite number, got 0.0"),
        ({"rope_theta": float("inf")}, "rope_theta must be a positive finite"),
        ({"family": "gpt2", "rope_theta": 5e5}, "gpt2 has learned positions"),
        ({"tied": 1}, "tied must be true or false"),
        ({"intermediate": 2.5}, "intermediate must be a positive integer"),
        ({"positions": 16}, "positions 16 is fewer than seq_len 32"),
        ({"norm_eps": 1.5}, r"norm_eps must be in \(0, 1\)"),
        ({"norm_eps": float("nan")}, "norm_eps must be in"),
        ({"rope_scaling": {"rope_type": "longrope", "factor": 2.0}}, "'longrope' is not one of linear"),
        ({"rope_scaling": {"factor": 2.0}}, "rope_type None is not one of"),
        ({"rope_scaling": {"rope_type": "linear"}}, r"lacks \['factor'\]"),
        ({"rope_scaling": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1.0}}, "rope_theta is a key of model"),
        ({"rope_scaling": {"rope_type": "linear", "factor": "2"}}, "factor must be a positive finite number"),
        ({"rope_scaling": {"rope_type": "linear", "factor": 0.5}}, "factor 0.5 stretches nothing"),
        ({"rope_scaling": {**LLAMA3_SCALING, "original_max_position_embeddings": 8192.0}}, "must be an integer"),
        ({"rope_scaling": dict.fromkeys("abcdefghi", 1.0)}, "9 entries, over 8"),
        ({"rope_scaling": "llama3"}, "must be a table"),
        ({"family": "gpt2", "rope_scaling": {"rope_type": "linear", "factor": 2.0}}, "gpt2 has no rotary"),
    ],
)
def test_bad_optional_fields_are_refused_naming_field_and_value(changes: dict[str, Any], words: str) -> None:
    with pytest.raises(ModelError, match=words):
        ModelShape.from_dict({**BASE, **changes})


def test_from_dict_still_refuses_unknown_and_missing_keys() -> None:
    with pytest.raises(ModelError, match="unknown keys"):
        ModelShape.from_dict({**BASE, "experts": 8})
    with pytest.raises(ModelError, match="lacks keys"):
        ModelShape.from_dict({k: v for k, v in BASE.items() if k != "seq_len"})


def test_llama_3_2_1b_fits() -> None:
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
        rope_scaling=tuple(LLAMA3_SCALING.items()),
    )
    assert shape.rope_scaling_table() == LLAMA3_SCALING
    assert shape.key_value_heads == 8 and shape.head_dim == 64
