"""peers/records/run_spec.py: the model table's optional keys (grouped-query attention, rotary
settings, tied embeddings, sizes), their bounds, and an old spec that signs as before."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from swarmd.errors import RecordError
from swarmd.models.presets import DEFAULT_RUN
from swarmd.peers.records.envelope import canonical_json
from swarmd.peers.records.identity import Identity
from swarmd.peers.records.run_id import derive_run_id
from swarmd.peers.records.run_spec import load_spec_file, parse_spec_body, sign_run_spec, verify_run_spec

pytestmark = pytest.mark.timeout(30)

SPEC_TOML = """\
name = "toml-run"
stages = 1

[model]
family = "llama"
layers = 4
hidden = 64
heads = 8
tied = true
kv_heads = 2
rope_theta = 500000
vocab = 1000
seq_len = 32

[model.rope_scaling]
rope_type = "linear"
factor = 2

[data]
corpus = "builtin"

[batch]
sequences = 16
micro_batch = 2

[optimizer]
name = "sgd"
lr = 0.1
weight_decay = 0
max_staleness = 2
"""


@pytest.fixture(scope="module")
def creator() -> Identity:
    return Identity.generate()


def body(**changes: Any) -> dict[str, Any]:
    """DEFAULT_RUN with ``section__key=value`` (or top-level ``key=value``) changes."""
    b = copy.deepcopy(DEFAULT_RUN)
    for name, value in changes.items():
        section, _, key = name.partition("__")
        if key:
            b[section][key] = value
        else:
            b[section] = value
    return b


LLAMA_MODEL: dict[str, Any] = {
    "family": "llama",
    "layers": 4,
    "hidden": 64,
    "heads": 8,
    "kv_heads": 2,
    "vocab": 1000,
    "seq_len": 32,
    "rope_theta": 500000.0,
    "intermediate": 96,
    "positions": 128,
    "norm_eps": 1e-5,
    "rope_scaling": {
        "rope_type": "llama3",
        "factor": 32.0,
        "high_freq_factor": 4.0,
        "low_freq_factor": 1.0,
        "original_max_position_embeddings": 64,
    },
}


def test_the_default_run_signs_byte_for_byte_as_before_the_optional_model_keys(creator: Identity) -> None:
    spec = parse_spec_body(copy.deepcopy(DEFAULT_RUN))
    assert canonical_json(spec.to_body()) == canonical_json(DEFAULT_RUN)
    assert spec.to_body()["model"] == {
        "family": "gpt2",
        "layers": 4,
        "hidden": 128,
        "heads": 4,
        "vocab": 256,
        "seq_len": 128,
    }
    signed = sign_run_spec(creator, spec)
    assert json.loads(signed.raw)["body"] == canonical_json(DEFAULT_RUN).decode()
    assert signed.run_id == derive_run_id(DEFAULT_RUN["name"], creator.public_key)


def test_the_optional_model_keys_are_signed_and_round_trip(creator: Identity) -> None:
    b = body(model=copy.deepcopy(LLAMA_MODEL))
    spec = parse_spec_body(b)
    assert (spec.model.kv_heads, spec.model.rope_theta, spec.model.positions) == (2, 500000.0, 128)
    assert spec.model.rope_scaling_table() == LLAMA_MODEL["rope_scaling"]
    assert spec.to_body() == b
    signed = sign_run_spec(creator, spec)
    assert verify_run_spec(signed.raw, signed.run_id).spec == spec
    # tied with one stage is a valid run (embedding and head in one module).
    one_stage = parse_spec_body(body(model={**LLAMA_MODEL, "tied": True}, stages=1))
    assert one_stage.model.tied and one_stage.to_body()["model"]["tied"] is True


def test_optional_model_keys_at_their_defaults_stay_out_of_the_body() -> None:
    b = body(model__tied=False, model__positions=128, model__norm_eps=1e-5)
    assert parse_spec_body(b).to_body() == DEFAULT_RUN


def test_tied_embeddings_across_stages_are_refused_naming_both() -> None:
    with pytest.raises(RecordError, match="model.tied is true but stages is 2.*set stages = 1, or model.tied = false"):
        parse_spec_body(body(model__tied=True))


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"kv_heads": 0}, "'kv_heads' = 0 is outside"),
        ({"kv_heads": 3}, "kv_heads 3 does not divide heads 8"),
        ({"rope_theta": 0}, "rope_theta = 0.0 must be above 0"),
        ({"rope_theta": 2e9}, "'rope_theta' = 2000000000.0 is outside"),
        ({"tied": 1}, "field 'tied' has type int"),
        ({"intermediate": 0}, "'intermediate' = 0 is outside"),
        ({"intermediate": 1_000_001}, "'intermediate' = 1000001 is outside"),
        ({"positions": 16}, "positions 16 is fewer than seq_len 32"),
        ({"positions": 10_000_001}, "'positions' = 10000001 is outside"),
        ({"norm_eps": 0}, r"norm_eps = 0.0 must be in \(0, 1\)"),
        ({"norm_eps": 1}, r"norm_eps = 1.0 must be in \(0, 1\)"),
        ({"rope_scaling": "llama3"}, "field 'rope_scaling' has type str"),
        ({"rope_scaling": {"rope_type": "longrope", "factor": 2.0}}, "'longrope' is not one of"),
        ({"rope_scaling": {"rope_type": "linear", "factor": 2.0, "scale": 1.0}}, "rope_scaling: unknown fields"),
        ({"rope_scaling": {"rope_type": "linear", "factor": [2.0]}}, "field 'factor' has type list"),
        ({"rope_scaling": {"rope_type": "linear"}}, r"lacks \['factor'\]"),
        ({"rope_scaling": {**LLAMA_MODEL["rope_scaling"], "original_max_position_embeddings": 64.5}}, "has type float"),
    ],
)
def test_bad_optional_model_keys_are_refused_naming_the_field(changes: dict[str, Any], match: str) -> None:
    with pytest.raises(RecordError, match=match):
        parse_spec_body(body(model={**LLAMA_MODEL, **changes}))


def test_gpt2_refuses_what_only_llama_has() -> None:
    with pytest.raises(RecordError, match="gpt2 has no grouped-query attention"):
        parse_spec_body(body(model__kv_heads=2))
    with pytest.raises(RecordError, match="gpt2 has learned positions"):
        parse_spec_body(body(model__rope_theta=500000.0))


def test_a_toml_file_with_the_optional_model_keys(tmp_path: Path) -> None:
    path = tmp_path / "llama.toml"
    path.write_text(SPEC_TOML)
    spec = load_spec_file(path)
    assert (spec.model.kv_heads, spec.model.rope_theta, spec.model.tied) == (2, 500000.0, True)
    assert spec.model.rope_scaling_table() == {"rope_type": "linear", "factor": 2}
