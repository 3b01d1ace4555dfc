"""``prepare``: text, JSON lines and parquet in; shards that check, decode back and split cleanly out."""

from __future__ import annotations

import gzip
import json
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from swarmd.models.bpe_tokenizer import BpeTokenizer, train_bpe
from swarmd.models.data.corpus import load_corpus
from swarmd.models.data.manifest import MANIFEST_FILE, Manifest
from swarmd.models.data.prepare import PrepareError, prepare
from swarmd.models.data.shard_files import check_shard, open_prepared
from swarmd.models.data.text_inputs import InputError, documents
from swarmd.models.tokenizer import ByteTokenizer

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def docs() -> list[str]:
    text = load_corpus("builtin").decode("utf-8")
    return [d for d in text.split("\n\n") if d.strip()][:1500]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory, docs: list[str]) -> list[Path]:
    """The documents in three inputs: plain text, gzipped JSON lines, parquet."""
    folder = tmp_path_factory.mktemp("inputs")
    a, b, c = docs[:500], docs[500:1000], docs[1000:]
    text = folder / "a.txt"
    text.write_text("".join(d.strip("\n") + "\n\n" for d in a), encoding="utf-8")
    jsonl = folder / "b.jsonl.gz"
    with gzip.open(jsonl, "wt", encoding="utf-8") as f:
        for d in b:
            f.write(json.dumps({"id": 1, "text": d}) + "\n")
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    parquet = folder / "c.parquet"
    pq.write_table(pa.table({"text": c, "n": list(range(len(c)))}), parquet, row_group_size=100)
    return [text, jsonl, parquet]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory, docs: list[str]) -> BpeTokenizer:
    return train_bpe(docs, 2048, tmp_path_factory.mktemp("tok") / "tokenizer.json")


def _read_docs(inputs: list[Path]) -> list[str]:
    return [d for path in inputs for d, _ in documents(path)]


def _split_documents(tokens: np.ndarray, eot: int) -> list[np.ndarray]:
    """A shard's documents: each starts with the separator."""
    starts = np.flatnonzero(tokens == eot)
    assert starts.size and starts[0] == 0
    return [tokens[s + 1 : e] for s, e in zip(starts, [*starts[1:], len(tokens)], strict=True)]


def test_text_jsonl_and_parquet_become_shards_that_check_and_decode(
    tmp_path: Path, inputs: list[Path], tokenizer: BpeTokenizer
) -> None:
    seen: list[tuple[int, int]] = []
    out = tmp_path / "data"
    result = prepare(
        inputs,
        tokenizer,
        out,
        shard_tokens=20_000,
        validation_fraction=0.05,
        sources=["https://example.org/d"],
        progress=lambda done, total: seen.append((done, total)),
    )
    m = Manifest.parse((out / MANIFEST_FILE).read_bytes())
    assert m == result.manifest and m.dtype == "uint16" and m.tokenizer.eos_id == tokenizer.eot_id == 0
    assert m.tokenizer.sha256 == tokenizer.sha256 and (out / "tokenizer.json").read_bytes() == tokenizer.file_bytes
    assert len(m.train) > 4 and len(m.validation) >= 1 and m.sources == ("https://example.org/d",)
    assert all(e.tokens <= 20_000 for e in (*m.train, *m.validation))
    assert seen and seen[-1][0] == seen[-1][1] == sum(p.stat().st_size for p in inputs)
    decoded: dict[str, list[str]] = {"train": [], "validation": []}
    for split, entries in (("train", m.train), ("validation", m.validation)):
        for entry in entries:
            check_shard(out / entry.file, entry, m.dtype)  # size and SHA-256 as the manifest says
            tokens = np.fromfile(out / entry.file, dtype="<u2")
            decoded[split] += [tokenizer.decode(d.tolist()) for d in _split_documents(tokens, 0)]
    expected = _read_docs(inputs)
    assert Counter(decoded["train"] + decoded["validation"]) == Counter(expected)
    assert m.documents == {"train": len(decoded["train"]), "validation": len(decoded["validation"])}
    assert not set(decoded["train"]) & set(decoded["validation"])  # held out by document
    assert 0.01 < len(decoded["validation"]) / len(expected) < 0.1
    # Shards mix the input: the first training shard holds documents of every input.
    first = {tokenizer.decode(d.tolist()) for d in _split_documents(np.fromfile(out / m.train[0].file, "<u2"), 0)}
    per_input = [set(documents_of) for documents_of in (_read_docs([p]) for p in inputs)]
    assert all(first & part for part in per_input)


def test_the_same_input_gives_the_same_bytes(tmp_path: Path, inputs: list[Path], tokenizer: BpeTokenizer) -> None:
    a = prepare(inputs, tokenizer, tmp_path / "a", shard_tokens=30_000, validation_fraction=0.02)
    b = prepare(inputs, tokenizer, tmp_path / "b", shard_tokens=30_000, validation_fraction=0.02)
    names = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "b").iterdir())
    for name in names:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    assert a.manifest_sha256 == b.manifest_sha256
    assert not [n for n in names if n.startswith(".")]  # no temporary file left


def test_bytes_dataset_holds_the_documents_bytes(tmp_path: Path, inputs: list[Path]) -> None:
    result = prepare(inputs[:1], ByteTokenizer(), tmp_path / "d", shard_tokens=50_000, validation_fraction=0.05)
    m = result.manifest
    assert m.dtype == "uint8" and m.tokenizer.kind == "bytes" and m.tokenizer.file is None
    assert not (tmp_path / "d" / "tokenizer.json").exists()
    docs = _read_docs(inputs[:1])
    data = b"".join((tmp_path / "d" / e.file).read_bytes() for e in (*m.train, *m.validation))
    assert len(data) == sum(len(d.encode()) for d in docs) == result.tokens  # no separators
    assert Counter(data) == Counter(b"".join(d.encode() for d in docs))
    prepared = open_prepared(tmp_path / "d", seq_len=64, seed=1)
    assert prepared.validation is not None and len(prepared.train) == sum(e.tokens // 64 for e in m.train)
    prepared.close()


def test_validation_is_capped_in_tokens_and_can_be_off(
    tmp_path: Path, inputs: list[Path], tokenizer: BpeTokenizer
) -> None:
    capped = prepare(inputs, tokenizer, tmp_path / "c", validation_fraction=0.5, validation_max_tokens=3000)
    assert 0 < capped.manifest.tokens["validation"] <= 3000
    none = prepare(inputs, tokenizer, tmp_path / "n", validation_fraction=0.0)
    assert none.manifest.validation == () and none.manifest.documents["validation"] == 0
    assert none.manifest.tokens["train"] == capped.manifest.tokens["train"] + capped.manifest.tokens["validation"]


def test_a_document_longer_than_a_shard_is_cut(tmp_path: Path, tokenizer: BpeTokenizer) -> None:
    text = tmp_path / "long.txt"
    text.write_text("word " * 5000 + "\n\nshort one\n")
    result = prepare([text], tokenizer, tmp_path / "d", shard_tokens=1000, validation_fraction=0.0)
    sizes = [e.tokens for e in result.manifest.train]
    assert max(sizes) == 1000 and sum(sizes) == result.tokens and result.manifest.documents["train"] == 2


def test_a_non_empty_output_is_refused_unless_overwrite(tmp_path: Path, inputs: list[Path]) -> None:
    out = tmp_path / "d"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(PrepareError, match="not empty; choose another path or pass --overwrite"):
        prepare(inputs[:1], ByteTokenizer(), out)
    first = prepare(inputs[:1], ByteTokenizer(), out, overwrite=True, shard_tokens=10_000)
    second = prepare(inputs[:1], ByteTokenizer(), out, overwrite=True, shard_tokens=100_000)
    assert len(first.manifest.train) > len(second.manifest.train)
    names = sorted(p.name for p in out.iterdir())
    expected = sorted([e.file for e in (*second.manifest.train, *second.manifest.validation)] + ["manifest.json"])
    assert names == sorted([*expected, "notes.txt"])  # the earlier shards are gone, the owner's file stays
    (tmp_path / "file").write_text("x")
    with pytest.raises(PrepareError, match="not a folder"):
        prepare(inputs[:1], ByteTokenizer(), tmp_path / "file")


def test_input_errors_name_the_file_and_line(tmp_path: Path, tokenizer: BpeTokenizer) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n\n{"body": "no text"}\n')
    with pytest.raises(InputError, match=r"bad.jsonl, line 3: no string field 'text'"):
        prepare([bad], tokenizer, tmp_path / "o1")
    with pytest.raises(InputError, match="does not exist"):
        prepare([tmp_path / "missing.txt"], tokenizer, tmp_path / "o2")
    with pytest.raises(InputError, match="unknown kind of file"):
        prepare([bad.rename(tmp_path / "bad.csv")], tokenizer, tmp_path / "o3")
    latin = tmp_path / "latin.txt"
    latin.write_bytes("caf\u00e9\n".encode("latin-1"))
    with pytest.raises(InputError, match="latin.txt, line 1: not UTF-8"):
        prepare([latin], tokenizer, tmp_path / "o4")
    surrogate = tmp_path / "s.jsonl"
    surrogate.write_text('{"text": "a \\ud800 b"}\n')
    with pytest.raises(InputError, match="s.jsonl, line 1: the text holds an invalid"):
        prepare([surrogate], tokenizer, tmp_path / "o5")
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    with pytest.raises(PrepareError, match="no document for training"):
        prepare([empty], tokenizer, tmp_path / "o6")
    with pytest.raises(PrepareError, match="--validation-fraction 0.9"):
        prepare([empty], tokenizer, tmp_path / "o7", validation_fraction=0.9)


def test_parquet_without_pyarrow_names_the_extra(
    tmp_path: Path, inputs: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(InputError, match=r"pip install 'swarmd\[data\]'"):
        prepare(inputs[2:], ByteTokenizer(), tmp_path / "d")


def test_text_documents_split_at_blank_lines_and_keep_the_file(tmp_path: Path) -> None:
    path = tmp_path / "t.txt.gz"
    text = "\n\none\ntwo\n\n  \nthree é\n\n\nfour"
    path.write_bytes(gzip.compress(text.encode()))
    docs = [d for d, _ in documents(path)]
    assert docs == ["one\ntwo\n\n  \n", "three é\n\n\n", "four"]
    assert "".join(docs) == text.lstrip("\n")
    cases = {
        "a\r\n\r\nb\r\n": ["a\r\n\r\n", "b\r\n"],
        "a\n\n   ": ["a\n\n   "],
        "  \n\n \t": [],
        "z" + "é" * 600_000 + "\n\nx": ["z" + "é" * 600_000 + "\n\n", "x"],  # one line over a read, cut inside "é"
    }
    for given, expected in cases.items():
        path.write_bytes(gzip.compress(given.encode()))
        assert [d for d, _ in documents(path)] == expected, given[:20]


def test_a_failed_prepare_leaves_no_shard(tmp_path: Path, tokenizer: BpeTokenizer) -> None:
    text = tmp_path / "a.txt"
    text.write_text("".join(f"document {i} " * 50 + "\n\n" for i in range(300)))
    bad = tmp_path / "b.jsonl"
    bad.write_text('{"text": "fine"}\nnot json\n')
    with pytest.raises(InputError, match="b.jsonl, line 2: not JSON"):
        prepare([text, bad], tokenizer, tmp_path / "out", shard_tokens=500)
    assert list((tmp_path / "out").iterdir()) == []
