"""Tokenizers: the BPE trained here is the same file everywhere, loads within bounds, and exports for transformers."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from swarmd.models.bpe_tokenizer import BpeTokenizer, load_tokenizer, tokenizer_digest, train_bpe
from swarmd.models.data.corpus import load_corpus
from swarmd.models.tokenizer import ByteTokenizer, TokenizerError

pytestmark = pytest.mark.timeout(120)

SAMPLE = "def f(x):\n    return x  # ünïcödé ✓ 🙂\n\tThe for statement iterates."


@pytest.fixture(scope="module")
def texts() -> list[str]:
    return [d for d in load_corpus("builtin").decode("utf-8").split("\n\n") if d.strip()]


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory, texts: list[str]) -> Path:
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    train_bpe(texts, 1500, path)
    return path


TRAIN = (
    "import sys; from swarmd.models.bpe_tokenizer import train_bpe;"
    "from swarmd.models.data.corpus import load_corpus;"
    "texts = [d for d in load_corpus('builtin').decode().split('\\n\\n') if d.strip()];"
    "print(train_bpe(texts, 1500, sys.argv[1]).sha256)"
)


def test_training_gives_the_same_file_in_another_process(trained: Path, tmp_path: Path) -> None:
    digests = set()
    for seed, threads in (("1", "1"), ("2", "4")):
        out = subprocess.run(
            [sys.executable, "-c", TRAIN, str(tmp_path / f"t{seed}.json")],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "PYTHONHASHSEED": seed, "RAYON_NUM_THREADS": threads},
        )
        digests.add(out.stdout.strip())
    assert digests == {tokenizer_digest(trained)}
    assert tokenizer_digest(trained) == hashlib.sha256(trained.read_bytes()).hexdigest()


def test_a_trained_tokenizer_encodes_any_text_and_decodes_it_back(trained: Path) -> None:
    tok = BpeTokenizer.from_file(trained)
    assert tok.vocab_size == 1500 and tok.eot_token == "<|endoftext|>" and tok.eot_id == 0
    ids = tok.encode(SAMPLE)
    assert tok.decode(ids) == SAMPLE and len(ids) < len(SAMPLE.encode())
    assert tok.encode("\x00\x7f\u0300") and tok.decode(tok.encode("\x00\x7f")) == "\x00\x7f"
    batch = tok.encode_batch([SAMPLE, "", "x"])
    assert [b.tolist() for b in batch] == [ids, [], tok.encode("x")] and batch[0].dtype == np.uint32
    # Text that spells the separator stays text: only preparation puts the separator in.
    assert tok.eot_id not in tok.encode("a <|endoftext|> b")


def test_exported_files_load_with_auto_tokenizer(trained: Path, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    tok = load_tokenizer(trained)
    files = tok.save_pretrained_files(tmp_path / "model", model_max_length=256)
    assert [f.name for f in files] == ["tokenizer.json", "tokenizer_config.json"]
    assert (tmp_path / "model" / "tokenizer.json").read_bytes() == trained.read_bytes()
    hf = AutoTokenizer.from_pretrained(tmp_path / "model")
    assert hf(SAMPLE)["input_ids"] == tok.encode(SAMPLE)
    assert hf.decode(tok.encode(SAMPLE)) == SAMPLE
    assert hf.eos_token == "<|endoftext|>" and hf.eos_token_id == tok.eot_id == 0
    assert hf.model_max_length == 256 and len(hf) == tok.vocab_size


def test_the_byte_tokenizer_is_the_default_name() -> None:
    tok = load_tokenizer("bytes")
    assert isinstance(tok, ByteTokenizer) and tok.kind == "bytes" and tok.eot_id is None and tok.raw is None
    assert [a.tolist() for a in tok.encode_batch(["hé", ""])] == [list("hé".encode()), []]


def test_a_vocabulary_over_the_bound_is_refused(trained: Path, texts: list[str], tmp_path: Path) -> None:
    with pytest.raises(TokenizerError, match="vocabulary of 1500 ids, over the limit of 1000"):
        BpeTokenizer.from_file(trained, max_vocab=1000)
    with pytest.raises(TokenizerError, match="262145 ids: give 257"):
        train_bpe(texts, 262_145, tmp_path / "big.json")
    with pytest.raises(TokenizerError, match="200 ids: give 257"):
        train_bpe(texts, 200, tmp_path / "small.json")
    with pytest.raises(TokenizerError, match="exists"):
        train_bpe(texts, 300, trained)


def test_files_that_are_no_tokenizer_are_refused(trained: Path, tmp_path: Path) -> None:
    with pytest.raises(TokenizerError, match="does not exist"):
        load_tokenizer(tmp_path / "missing.json")
    with pytest.raises(TokenizerError, match=r"over the limit of 100"):
        BpeTokenizer.from_file(trained, max_bytes=100)
    junk = tmp_path / "junk.json"
    junk.write_text('{"model": 1}')
    with pytest.raises(TokenizerError, match="junk.json is not a tokenizers tokenizer.json"):
        load_tokenizer(junk)
    junk.write_bytes(b"\xff\xfe")
    with pytest.raises(TokenizerError, match="is not a tokenizers tokenizer.json"):
        load_tokenizer(junk)
    with pytest.raises(TokenizerError, match="is not a file"):
        load_tokenizer(tmp_path)


def test_end_of_text_of_other_families_is_found(trained: Path) -> None:
    """Llama 3 ends a document with <|end_of_text|>, SentencePiece models with </s>."""
    body = json.loads(trained.read_text())
    vocab = body["model"]["vocab"]
    for name in ("<|end_of_text|>", "</s>"):
        vocab[name] = vocab.pop(body["added_tokens"][0]["content"])
        body["added_tokens"][0]["content"] = name
        tok = BpeTokenizer(json.dumps(body).encode())
        assert tok.eot_token == name and tok.eot_id == 0
    body["added_tokens"][0]["special"] = False
    assert BpeTokenizer(json.dumps(body).encode()).eot_id is None
