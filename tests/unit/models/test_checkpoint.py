"""Atomic safetensors checkpoints and the export that transformers loads, with its tokenizer."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import torch

from swarmd.models.bpe_tokenizer import BpeTokenizer, train_bpe
from swarmd.models.checkpoint import (
    MODEL_FILE,
    CheckpointError,
    export_pretrained,
    load_safetensors,
    save_safetensors_atomic,
)
from swarmd.models.tokenizer import ByteTokenizer

if TYPE_CHECKING:
    from transformers import PretrainedConfig

pytestmark = pytest.mark.timeout(60)


def _tensors(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"a.weight": torch.randn(4, 8, generator=g), "a.bias": torch.randn(8, generator=g)}


def test_save_and_load_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "ckpt" / "stage0.safetensors"
    tensors = _tensors(0)
    tensors["view"] = tensors["a.weight"].t()  # not contiguous
    tensors["tied"] = tensors["a.weight"]  # shares memory, as tied embeddings do
    save_safetensors_atomic(tensors, path, metadata={"version": "12"})
    loaded, metadata = load_safetensors(path)
    assert metadata == {"version": "12"}
    assert set(loaded) == set(tensors)
    for key, tensor in tensors.items():
        assert torch.equal(loaded[key], tensor)
    assert os.listdir(path.parent) == [path.name]


def test_crash_before_rename_keeps_the_old_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "stage0.safetensors"
    save_safetensors_atomic(_tensors(0), path, metadata={"version": "1"})

    def crash(src: object, dst: object) -> None:
        raise KeyboardInterrupt("simulated crash")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(KeyboardInterrupt):
        save_safetensors_atomic(_tensors(1), path, metadata={"version": "2"})
    monkeypatch.undo()
    loaded, metadata = load_safetensors(path)
    assert metadata == {"version": "1"} and torch.equal(loaded["a.weight"], _tensors(0)["a.weight"])
    assert os.listdir(tmp_path) == [path.name]  # no temporary file left behind


def test_write_error_is_a_checkpoint_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def full_disk(src: object, dst: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", full_disk)
    with pytest.raises(CheckpointError, match="No space left"):
        save_safetensors_atomic(_tensors(0), tmp_path / "x.safetensors")
    monkeypatch.undo()
    assert os.listdir(tmp_path) == []


def test_truncated_missing_and_garbage_files_are_checkpoint_errors(tmp_path: Path) -> None:
    path = tmp_path / "stage0.safetensors"
    save_safetensors_atomic(_tensors(0), path)
    whole = path.read_bytes()
    for cut in (len(whole) - 1, len(whole) // 2, 10, 0):
        path.write_bytes(whole[:cut])
        with pytest.raises(CheckpointError, match="corrupt or truncated"):
            load_safetensors(path)
    path.write_bytes(b"\xff" * 64)
    with pytest.raises(CheckpointError, match="corrupt or truncated"):
        load_safetensors(path)
    with pytest.raises(CheckpointError, match="no checkpoint at"):
        load_safetensors(tmp_path / "missing.safetensors")


def _tiny_configs() -> dict[str, PretrainedConfig]:
    from transformers import GPT2Config, LlamaConfig

    return {
        "gpt2": GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=256, n_positions=32, tie_word_embeddings=False),
        "llama": LlamaConfig(
            num_hidden_layers=2,
            hidden_size=32,
            intermediate_size=64,
            num_attention_heads=2,
            num_key_value_heads=2,
            vocab_size=256,
            max_position_embeddings=32,
            tie_word_embeddings=False,
        ),
    }


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_export_loads_with_from_pretrained_and_generates(tmp_path: Path, family: str) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    config = _tiny_configs()[family]
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    out = tmp_path / "export"
    export_pretrained(config, model.state_dict(), out, corpus_sha256="ab" * 32, run_id="run-1")
    assert {"config.json", MODEL_FILE, "README.md", "tokenizer.json", "tokenizer_config.json"} <= set(os.listdir(out))
    assert not [p for p in os.listdir(tmp_path) if p != "export"]  # no temporary folder left

    loaded = AutoModelForCausalLM.from_pretrained(out)
    expected = model.state_dict()
    got = loaded.state_dict()
    assert set(got) == set(expected)
    for key in expected:
        assert torch.equal(got[key], expected[key]), key

    prompt = torch.tensor([ByteTokenizer().encode("def ")])
    generated = loaded.generate(prompt, max_new_tokens=8, do_sample=False)
    new = generated[0, prompt.shape[1] :].tolist()
    assert len(new) == 8 and all(0 <= t < 256 for t in new)
    assert isinstance(ByteTokenizer().decode(new), str)
    hf_tokenizer = AutoTokenizer.from_pretrained(out)
    assert hf_tokenizer.decode(generated[0]) == ByteTokenizer().decode(generated[0].tolist())
    assert "ab" * 32 in (out / "README.md").read_text()


def test_export_refuses_a_non_empty_folder_unless_overwrite(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    config = _tiny_configs()["gpt2"]
    state = AutoModelForCausalLM.from_config(config).state_dict()
    out = tmp_path / "export"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(CheckpointError, match="not empty"):
        export_pretrained(config, state, out)
    assert os.listdir(out) == ["keep.txt"]
    export_pretrained(config, state, out, overwrite=True)
    assert "keep.txt" not in os.listdir(out) and MODEL_FILE in os.listdir(out)
    assert sorted(os.listdir(tmp_path)) == ["export"]


def test_export_refuses_weights_that_do_not_fit_the_config(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    config = _tiny_configs()["gpt2"]
    state = AutoModelForCausalLM.from_config(config).state_dict()
    del state["lm_head.weight"]
    state["transformer.wte.weight"] = torch.zeros(10, 32)
    with pytest.raises(CheckpointError, match=r"missing \['lm_head.weight'\].*wrong shape"):
        export_pretrained(config, state, tmp_path / "export")
    assert os.listdir(tmp_path) == []


@pytest.fixture(scope="module")
def bpe(tmp_path_factory: pytest.TempPathFactory) -> BpeTokenizer:
    from swarmd.models.data.corpus import load_corpus

    texts = [d for d in load_corpus("builtin").decode().split("\n\n") if d.strip()]
    return train_bpe(texts, 320, tmp_path_factory.mktemp("tok") / "tokenizer.json")


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_export_with_a_bpe_tokenizer_sets_eos_and_says_so(tmp_path: Path, family: str, bpe: BpeTokenizer) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    config = _tiny_configs()[family]
    config.vocab_size = 384  # the tokenizer's 320 ids, rounded up as a run's shape would
    model = AutoModelForCausalLM.from_config(config)
    out = tmp_path / "export"
    export_pretrained(config, model.state_dict(), out, tokenizer=bpe)
    saved = AutoConfig.from_pretrained(out)
    assert saved.eos_token_id == saved.bos_token_id == bpe.eot_id == 0
    hf = AutoTokenizer.from_pretrained(out)
    text = "The for statement\n    x = 1"
    assert hf(text)["input_ids"] == bpe.encode(text) and hf.eos_token_id == 0
    card = (out / "README.md").read_text()
    assert bpe.sha256 is not None and bpe.sha256 in card and "`<|endoftext|>` = id 0" in card
    assert "ids are plain bytes" not in card
    loaded = AutoModelForCausalLM.from_pretrained(out)
    generated = loaded.generate(torch.tensor([bpe.encode("def ")]), max_new_tokens=4, do_sample=False)
    assert all(0 <= t < 384 for t in generated[0].tolist())


def test_export_with_the_byte_tokenizer_keeps_no_special_ids(tmp_path: Path, bpe: BpeTokenizer) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM

    config = _tiny_configs()["gpt2"]  # GPT-2's config says eos = bos = 50256, outside 256 bytes
    state = AutoModelForCausalLM.from_config(config).state_dict()
    export_pretrained(config, state, tmp_path / "bytes")
    saved = AutoConfig.from_pretrained(tmp_path / "bytes")
    assert saved.eos_token_id is None and saved.bos_token_id is None
    assert "Tokenizer: bytes." in (tmp_path / "bytes" / "README.md").read_text()
    with pytest.raises(CheckpointError, match="320 ids, more than the model's vocabulary of 256"):
        export_pretrained(config, state, tmp_path / "small", tokenizer=bpe)
