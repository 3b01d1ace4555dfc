"""The corpus, its digest, the deterministic Dataset, and the byte tokenizer."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest
import torch

from swarmd.models.data.corpus import BUILTIN_SHA256, corpus_digest, load_corpus, train_eval_split
from swarmd.models.data.windows import CorpusError, Dataset
from swarmd.models.tokenizer import ByteTokenizer

pytestmark = pytest.mark.timeout(60)

BUILTIN_BYTES = 466_273
PINNED_SHA256 = "71f2ff5d99bdc1f9c48c5c2353ad138201c5ca1c377e0226857ef8fa89b8bcee"


@pytest.fixture(scope="module")
def corpus() -> bytes:
    return load_corpus("builtin")


def test_builtin_corpus_is_the_pinned_text(corpus: bytes) -> None:
    assert len(corpus) == BUILTIN_BYTES
    assert corpus_digest(corpus) == PINNED_SHA256 == BUILTIN_SHA256
    text = corpus.decode("utf-8")
    assert 'The "for" statement' in text or "for_stmt" in text


def test_local_corpus_file_plain_and_gzip(tmp_path: Path) -> None:
    plain = tmp_path / "c.txt"
    plain.write_bytes(b"hello world\n" * 10)
    packed = tmp_path / "c.txt.gz"
    packed.write_bytes(gzip.compress(b"hello world\n" * 10))
    assert load_corpus(str(plain)) == load_corpus(str(packed)) == b"hello world\n" * 10


def test_local_corpus_errors_name_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "nope.txt"
    with pytest.raises(CorpusError, match="nope.txt"):
        load_corpus(str(missing))
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    with pytest.raises(CorpusError, match="empty.txt is empty"):
        load_corpus(str(empty))
    big = tmp_path / "big.txt"
    big.write_bytes(b"x" * 100)
    with pytest.raises(CorpusError, match="100 bytes, over the limit of 50"):
        load_corpus(str(big), max_bytes=50)
    bomb = tmp_path / "bomb.gz"
    bomb.write_bytes(gzip.compress(b"\0" * 10_000))
    with pytest.raises(CorpusError, match="over 1000 bytes"):
        load_corpus(str(bomb), max_bytes=1000)
    broken = tmp_path / "broken.gz"
    broken.write_bytes(b"not gzip at all")
    with pytest.raises(CorpusError, match="broken.gz is not a valid gzip"):
        load_corpus(str(broken))


def test_dataset_is_deterministic_across_objects(corpus: bytes) -> None:
    a = Dataset.from_tokens(corpus, seq_len=64, seed=7)
    b = Dataset.from_tokens(bytes(corpus), seq_len=64, seed=7)
    indices = [0, 1, 5, 100, len(a) - 1, len(a), 3 * len(a) + 11]
    assert torch.equal(a.batch(indices), b.batch(indices))
    other = Dataset.from_tokens(corpus, seq_len=64, seed=8)
    assert not torch.equal(a.batch(range(16)), other.batch(range(16)))


def test_window_order_is_pinned(corpus: bytes) -> None:
    """The order is fixed integer arithmetic: a change here breaks reproducibility between peers."""
    d = Dataset.from_tokens(corpus, 128, 1234)
    assert len(d) == 3642
    assert [d.window(i) for i in range(6)] == [1803, 3011, 1000, 357, 2925, 1748]


def test_sequences_are_bytes_of_the_right_shape(corpus: bytes) -> None:
    d = Dataset.from_tokens(corpus, seq_len=128, seed=0)
    batch = d.batch(range(32))
    assert batch.shape == (32, 128) and batch.dtype == torch.long
    assert int(batch.min()) >= 0 and int(batch.max()) < 256
    w = d.window(5)
    assert bytes(d.sequence(5).tolist()) == corpus[w * 128 : (w + 1) * 128]


def test_an_epoch_covers_every_window_once(corpus: bytes) -> None:
    d = Dataset.from_tokens(corpus, seq_len=128, seed=3)
    assert len(d) == len(corpus) // 128
    first = [d.window(i) for i in range(len(d))]
    assert sorted(first) == list(range(len(d)))  # no window twice: no overlap within an epoch
    second = [d.window(len(d) + i) for i in range(len(d))]
    assert sorted(second) == list(range(len(d))) and second != first


def test_held_out_split_is_disjoint(corpus: bytes) -> None:
    train, held_out = train_eval_split(corpus, seq_len=128, seed=0)
    total = len(corpus) // 128
    assert len(train) + len(held_out) == total
    assert len(held_out) == pytest.approx(total * 0.02, abs=1)
    # Each split is a one-shard dataset over its part of the corpus: the held-out part is the tail.
    cut = len(train) * 128
    for i in range(len(held_out)):
        w = held_out.window(i)
        assert bytes(held_out.sequence(i).tolist()) == corpus[cut + w * 128 : cut + (w + 1) * 128]
    assert sorted(train.window(i) for i in range(len(train))) == list(range(len(train)))
    w = train.window(0)
    assert bytes(train.sequence(0).tolist()) == corpus[w * 128 : (w + 1) * 128]


def test_too_short_corpus_errors_with_numbers() -> None:
    with pytest.raises(CorpusError, match="10 bytes, shorter than one sequence of 64"):
        Dataset.from_tokens(b"x" * 10, seq_len=64, seed=0)
    with pytest.raises(CorpusError, match="needs at least 2"):
        train_eval_split(b"x" * 100, seq_len=64, seed=0)


def test_byte_tokenizer_round_trip() -> None:
    tok = ByteTokenizer()
    text = "héllo wörld ∑ 🙂\n\tend"
    ids = tok.encode(text)
    assert ids == list(text.encode("utf-8")) and all(0 <= i < 256 for i in ids)
    assert tok.decode(ids) == text
    assert tok.decode([0xE2, 0x88]) == "\ufffd"  # a cut multi-byte character does not raise
    with pytest.raises(ValueError, match="0..255"):
        tok.decode([300])


def test_saved_tokenizer_matches_byte_ids(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    ByteTokenizer().save_pretrained_files(tmp_path, model_max_length=128)
    hf = AutoTokenizer.from_pretrained(tmp_path)
    text = "def f(x):\n    return x  # ünïcödé ✓"
    assert hf(text)["input_ids"] == ByteTokenizer().encode(text)
    assert hf.decode(ByteTokenizer().encode(text)) == text
    assert len(hf) == 256
