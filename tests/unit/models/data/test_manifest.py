"""The data manifest: canonical bytes, a round trip, and every malformed field refused by name."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from swarmd.models.data.manifest import (
    MAX_MANIFEST_BYTES,
    Manifest,
    ManifestError,
    ShardEntry,
    TokenizerEntry,
    dtype_for_vocab,
    manifest_digest,
    source_url,
)

pytestmark = pytest.mark.timeout(30)

HEX = "ab" * 32


def _manifest(**changes: Any) -> Manifest:
    fields: dict[str, Any] = {
        "tokenizer": TokenizerEntry(kind="bpe", file="tokenizer.json", sha256="cd" * 32, vocab=4096, eos_id=0),
        "dtype": "uint16",
        "train": (ShardEntry("train-00000.bin", HEX, 1000), ShardEntry("train-00001.bin", "ef" * 32, 900)),
        "validation": (ShardEntry("val-00000.bin", "01" * 32, 50),),
        "documents": {"train": 40, "validation": 2},
        "sources": ("https://example.org/data", "/srv/shared/data"),
    }
    fields.update(changes)
    return Manifest(**fields)


def test_round_trip_and_canonical_bytes() -> None:
    m = _manifest()
    raw = m.to_json()
    again = Manifest.parse(raw)
    assert again == m and again.to_json() == raw
    assert manifest_digest(raw) == manifest_digest(again.to_json())
    body = json.loads(raw)
    assert body["format"] == "swarmd-token-shards" and body["version"] == 1
    assert body["tokens"] == {"train": 1900, "validation": 50} == m.tokens
    # The same content, its keys in another order and spaced otherwise, parses to the same manifest.
    shuffled = json.dumps(dict(reversed(list(body.items())))).encode()
    assert Manifest.parse(shuffled).to_json() == raw


def test_bytes_tokenizer_and_no_validation() -> None:
    m = _manifest(
        tokenizer=TokenizerEntry(kind="bytes", file=None, sha256=None, vocab=256, eos_id=None),
        dtype="uint8",
        validation=(),
        documents={"train": 3, "validation": 0},
        sources=(),
    )
    assert Manifest.parse(m.to_json()) == m


def test_dtype_follows_the_vocabulary() -> None:
    assert [dtype_for_vocab(v) for v in (256, 257, 65_536, 65_537, 262_144)] == [
        "uint8",
        "uint16",
        "uint16",
        "uint32",
        "uint32",
    ]
    assert source_url("https://h/x/", "a.bin") == "https://h/x/a.bin" == source_url("https://h/x", "a.bin")


def _edit(path: list[Any], value: Any) -> Callable[[dict[str, Any]], None]:
    def apply(body: dict[str, Any]) -> None:
        target = body
        for key in path[:-1]:
            target = target[key]
        if value is _DELETE:
            del target[path[-1]]
        else:
            target[path[-1]] = value

    return apply


_DELETE = object()

MALFORMED = [
    (["format"], "other", "format"),
    (["version"], 2, "version"),
    (["version"], True, "version"),
    (["dtype"], "uint32", "dtype"),
    (["dtype"], "float32", "dtype"),
    (["extra"], 1, "unknown keys"),
    (["sources"], _DELETE, "lacks"),
    (["tokenizer", "kind"], "wordpiece", "tokenizer.kind"),
    (["tokenizer", "vocab"], 0, "tokenizer.vocab"),
    (["tokenizer", "vocab"], 262_145, "tokenizer.vocab"),
    (["tokenizer", "vocab"], 4096.0, "tokenizer.vocab"),
    (["tokenizer", "eos_id"], 4096, "tokenizer.eos_id"),
    (["tokenizer", "eos_id"], -1, "tokenizer.eos_id"),
    (["tokenizer", "sha256"], "AB" * 32, "tokenizer.sha256"),
    (["tokenizer", "sha256"], None, "tokenizer.sha256"),
    (["tokenizer", "file"], "../tokenizer.json", "tokenizer.file"),
    (["tokenizer", "extra"], 1, "unknown keys"),
    (["train"], [], "no shard"),
    (["train"], {"file": "x"}, "list of shards"),
    (["train", 0, "file"], "/etc/passwd", "train[0].file"),
    (["train", 0, "file"], "..", "train[0].file"),
    (["train", 0, "file"], "a..b", "train[0].file"),
    (["train", 0, "file"], "x" * 129, "train[0].file"),
    (["train", 0, "file"], "shard 1.bin", "train[0].file"),
    (["train", 0, "file"], "train-00001.bin", "named twice"),
    (["train", 0, "file"], "tokenizer.json", "named twice"),
    (["train", 0, "sha256"], "zz" * 32, "train[0].sha256"),
    (["train", 0, "sha256"], "ab" * 31, "train[0].sha256"),
    (["train", 0, "tokens"], 0, "train[0].tokens"),
    (["train", 0, "tokens"], 2**40, "train[0].tokens"),
    (["train", 0, "tokens"], "1000", "train[0].tokens"),
    (["train", 0, "size"], 1, "unknown keys"),
    (["validation", 0, "tokens"], -5, "validation[0].tokens"),
    (["documents", "train"], 0, "documents.train"),
    (["documents", "train"], 5000, "documents.train"),
    (["documents", "validation"], 0, "documents.validation"),
    (["tokens", "train"], 1899, "not the sums"),
    (["sources"], "https://x", "sources"),
    (["sources"], ["ftp://example.org/x"], "sources[0]"),
    (["sources"], ["https://"], "sources[0]"),
    (["sources"], ["https://h/x?token=1"], "sources[0]"),
    (["sources"], ["/srv/a\nb"], "sources[0]"),
    (["sources"], [7], "sources[0]"),
    (["sources"], ["/srv"] * 65, "over the limit of 64"),
]


@pytest.mark.parametrize(("path", "value", "named"), MALFORMED, ids=[f"{p}={str(v)[:20]}" for p, v, _ in MALFORMED])
def test_every_malformed_field_is_refused_by_name(path: list[Any], value: Any, named: str) -> None:
    body = json.loads(_manifest().to_json())
    _edit(path, value)(body)
    with pytest.raises(ManifestError, match=named.replace("[", r"\[").replace("]", r"\]")):
        Manifest.parse(json.dumps(body).encode())


def test_bytes_kind_with_a_file_is_refused() -> None:
    body = json.loads(_manifest().to_json())
    body["tokenizer"] = {"kind": "bytes", "file": "tokenizer.json", "sha256": HEX, "vocab": 256, "eos_id": None}
    body["dtype"] = "uint8"
    with pytest.raises(ManifestError, match="kind 'bytes' has file null"):
        Manifest.parse(json.dumps(body).encode())


@pytest.mark.parametrize(
    ("raw", "named"),
    [
        (b"\xff\xfe", "not UTF-8 JSON"),
        (b"{", "not UTF-8 JSON"),
        (b"[1, 2]", "must be an object"),
        (b'{"format": 1, "format": 2}', "appears twice"),
        (b"[" * 100_000 + b"]" * 100_000, "not UTF-8 JSON"),
        (b" " * (MAX_MANIFEST_BYTES + 1), "over the limit"),
    ],
    ids=["bad-utf8", "truncated", "a-list", "duplicate-key", "deep", "too-big"],
)
def test_bytes_that_are_no_manifest_are_refused(raw: bytes, named: str) -> None:
    with pytest.raises(ManifestError, match=named):
        Manifest.parse(raw)


def test_too_many_shards_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    import swarmd.models.data.manifest as manifest

    monkeypatch.setattr(manifest, "MAX_SHARDS", 1000)  # the rule, without a million entries to build
    body = json.loads(_manifest().to_json())
    body["train"] = [{"file": "a", "sha256": HEX, "tokens": 1}] * 1001
    with pytest.raises(ManifestError, match="1001 shards, over the limit of 1000"):
        Manifest.parse(json.dumps(body).encode())
