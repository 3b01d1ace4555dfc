"""``swarmd run create``: a spec file's local files pinned by digest in the signed spec."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig

from swarmd.cli.run_create import create
from swarmd.errors import RunSpecError
from swarmd.models.initial_weights import InitialWeights
from swarmd.models.presets import PRESETS, materialize
from swarmd.system.state_dir import load_cached_spec, local_files_path, prepare_state_dir

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def preset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("preset")
    return materialize(PRESETS["tiny-llama-bpe"], folder)


def test_a_prepared_dataset_is_pinned_by_its_manifest_and_tokenizer(tmp_path: Path, preset: Path) -> None:
    run_id, _ = create(preset, prepare_state_dir(tmp_path / "state"))
    signed = load_cached_spec(tmp_path / "state", run_id)
    assert signed is not None
    data = preset.parent / "data"
    assert signed.spec.manifest_sha256 == hashlib.sha256((data / "manifest.json").read_bytes()).hexdigest()
    assert signed.spec.tokenizer_sha256 == hashlib.sha256((data / "tokenizer.json").read_bytes()).hexdigest()
    assert signed.spec.model.kv_heads == 2 and signed.spec.eval_every == 20
    recorded = json.loads(local_files_path(tmp_path / "state", run_id).read_text())
    assert recorded == {"manifest": str(data / "manifest.json")}  # the creator's daemon serves it from there


def test_a_tokenizer_the_data_was_not_prepared_with_or_a_vocabulary_too_small_is_refused(
    tmp_path: Path, preset: Path
) -> None:
    spec = json.loads(preset.read_text())
    other = tmp_path / "other-tokenizer.json"
    other.write_text((preset.parent / "tokenizer.json").read_text().replace("endoftext", "endoftexx"))
    spec["data"]["tokenizer"] = str(other)
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps(spec))
    with pytest.raises(RunSpecError, match="is not the tokenizer the manifest .* was prepared with"):
        create(wrong, tmp_path / "state")
    spec = json.loads(preset.read_text())
    spec["model"]["vocab"] = 512
    small = tmp_path / "small.json"
    small.write_text(json.dumps(spec))
    with pytest.raises(RunSpecError, match="vocab = 512 is smaller than the tokenizer's 1024 ids"):
        create(small, tmp_path / "state")


def save_tied_llama(folder: Path) -> None:
    config = LlamaConfig(
        num_hidden_layers=2,
        hidden_size=32,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
        vocab_size=256,
        max_position_embeddings=64,
        tie_word_embeddings=True,
    )
    torch.manual_seed(5)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)


def test_a_checkpoint_gives_the_shape_and_its_initial_weights_manifest(tmp_path: Path) -> None:
    save_tied_llama(tmp_path / "ckpt")
    spec = tmp_path / "run.toml"
    spec.write_text(
        'name = "from-ckpt"\nstages = 2\n[model]\ninit = "ckpt"\nseq_len = 32\n[data]\ncorpus = "builtin"\n'
        '[batch]\nsequences = 8\nmicro_batch = 4\n[optimizer]\nname = "adamw"\nlr = 0.001\n'
        "weight_decay = 0.0\nmax_staleness = 4\n"
    )
    run_id, _ = create(spec, prepare_state_dir(tmp_path / "state"))
    signed = load_cached_spec(tmp_path / "state", run_id)
    assert signed is not None
    model = signed.spec.model
    assert (model.family, model.layers, model.hidden, model.kv_heads, model.tied) == ("llama", 2, 32, 2, False)
    recorded = json.loads(local_files_path(tmp_path / "state", run_id).read_text())
    manifest = Path(recorded["initial"]).read_bytes()
    assert hashlib.sha256(manifest).hexdigest() == signed.spec.init_sha256
    weights = InitialWeights.parse(manifest)
    assert weights.stages == 2 and sum(weights.sizes) > 0 and recorded["init"] == str(tmp_path / "ckpt")
    spec.write_text(spec.read_text().replace("seq_len = 32\n", "seq_len = 32\nhidden = 64\n"))
    with pytest.raises(RunSpecError, match="hidden disagree with the checkpoint .* \\(hidden = 32\\)"):
        create(spec, tmp_path / "state")
