"""The manifest of a prepared dataset (``manifest.json``): its tokenizer, token dtype and shards.

``swarmd data prepare`` writes it last, beside the shards; a run spec pins its SHA-256
(:func:`manifest_digest`), and through it every shard's SHA-256 and the tokenizer's. The bytes
of a manifest may come from any peer, so :meth:`Manifest.parse` trusts nothing: a size cap,
exactly the keys of this format, hex digests, file names that are plain basenames, counts within
bounds and totals that add up. An error names the field, the value and the limit.

The format (version 1), canonical JSON (sorted keys, two-space indent, UTF-8)::

    {"format": "swarmd-token-shards", "version": 1,
     "tokenizer": {"kind": "bpe", "file": "tokenizer.json", "sha256": HEX, "vocab": 32000, "eos_id": 0},
     "dtype": "uint16",
     "train": [{"file": "train-00000.bin", "sha256": HEX, "tokens": 33554415}, ...],
     "validation": [{"file": "val-00000.bin", "sha256": HEX, "tokens": 1048576}],
     "documents": {"train": 81234, "validation": 410},
     "tokens": {"train": 1000000000, "validation": 1048576},
     "sources": ["https://example.org/data/run1"]}

A shard is raw little-endian tokens of ``dtype``, no header (as nanoGPT's ``.bin``): the
manifest carries what llm.c's 1 KiB header does (count, dtype, version) and its digest, so a
shard can be read at any token with one ``pread`` and checked against its digest alone. The
``bytes`` tokenizer has no file: ``file`` and ``sha256`` are null, ``vocab`` 256, ``eos_id`` null.
``sources`` are folders or http(s) URLs where a file is also found at ``SOURCE + "/" + file``.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from swarmd.errors import SwarmdError

FORMAT = "swarmd-token-shards"
VERSION = 1
MANIFEST_FILE = "manifest.json"

MAX_MANIFEST_BYTES = 128 * 1024 * 1024
"""Largest manifest parsed: a million shard entries take about 110 MB (a 100B-token dataset in
shards of 32M tokens has about 3,000: 330 kB)."""
MAX_SHARDS = 1_000_000
"""Most shards, training and validation together."""
MAX_SHARD_TOKENS = 2**36
"""Most tokens in one shard (256 GiB of uint32): a count beyond is a corrupt manifest."""
MAX_VOCAB = 262_144
"""Largest vocabulary a run may use (Gemma's 256k fits); ids above 65,536 are stored as uint32."""
MAX_SOURCES = 64
MAX_SOURCE_CHARS = 2048
MAX_FILE_NAME = 128

DTYPES = ("uint8", "uint16", "uint32")
KINDS = ("bytes", "bpe")

_SAFE_NAME = re.compile(r"[A-Za-z0-9._-]+")
_HEX64 = re.compile(r"[0-9a-f]{64}")


class ManifestError(SwarmdError):
    """A data manifest is malformed, over a limit, or inconsistent."""


def dtype_for_vocab(vocab: int) -> str:
    """The smallest unsigned dtype that holds every id of a vocabulary of ``vocab`` ids."""
    if vocab <= 256:
        return "uint8"
    return "uint16" if vocab <= 65_536 else "uint32"


@dataclass(frozen=True)
class ShardEntry:
    """One shard file: its name beside the manifest, its SHA-256 and its token count."""

    file: str
    sha256: str
    tokens: int


@dataclass(frozen=True)
class TokenizerEntry:
    """The tokenizer the tokens were made with."""

    kind: str
    """``bytes`` or ``bpe``."""
    file: str | None
    """The tokenizer file beside the manifest (``tokenizer.json``); None for bytes."""
    sha256: str | None
    """SHA-256 of that file (what a run spec pins); None for bytes."""
    vocab: int
    """Number of token ids."""
    eos_id: int | None
    """The id that separates documents; None when there is none (bytes)."""


@dataclass(frozen=True)
class Manifest:
    tokenizer: TokenizerEntry
    dtype: str
    """Token dtype of every shard, little-endian: ``uint8``, ``uint16`` or ``uint32``."""
    train: tuple[ShardEntry, ...]
    validation: tuple[ShardEntry, ...]
    """The held-out shards (may be empty)."""
    documents: dict[str, int]
    """Documents in each split: ``{"train": n, "validation": n}``."""
    sources: tuple[str, ...] = ()
    """Folders or http(s) URLs where the files are also found (``SOURCE/FILE``)."""

    def __post_init__(self) -> None:
        _check(self)

    @property
    def tokens(self) -> dict[str, int]:
        """Tokens in each split."""
        return {"train": sum(e.tokens for e in self.train), "validation": sum(e.tokens for e in self.validation)}

    def to_json(self) -> bytes:
        """The canonical bytes of this manifest: equal manifests give equal bytes (and digests)."""
        t = self.tokenizer
        body = {
            "format": FORMAT,
            "version": VERSION,
            "tokenizer": {"kind": t.kind, "file": t.file, "sha256": t.sha256, "vocab": t.vocab, "eos_id": t.eos_id},
            "dtype": self.dtype,
            "train": [_entry_json(e) for e in self.train],
            "validation": [_entry_json(e) for e in self.validation],
            "documents": dict(self.documents),
            "tokens": self.tokens,
            "sources": list(self.sources),
        }
        return (json.dumps(body, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode("utf-8")

    @classmethod
    def parse(cls, raw: bytes) -> Manifest:
        """A manifest from untrusted bytes; ManifestError naming the field and value when anything is off."""
        if len(raw) > MAX_MANIFEST_BYTES:
            raise ManifestError(f"a data manifest of {len(raw)} bytes is over the limit of {MAX_MANIFEST_BYTES}")
        try:
            body = json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicates)
        except (UnicodeDecodeError, ValueError, RecursionError) as e:
            raise ManifestError(f"a data manifest is not UTF-8 JSON: {e}") from None
        _keys(body, "manifest", _TOP_KEYS)
        if body["format"] != FORMAT:
            raise ManifestError(f"manifest format = {body['format']!r}: not {FORMAT!r}")
        if body["version"] != VERSION or isinstance(body["version"], bool):
            raise ManifestError(
                f"manifest version = {body['version']!r}: this swarmd reads version {VERSION}; upgrade swarmd"
            )
        tok = body["tokenizer"]
        _keys(tok, "tokenizer", _TOKENIZER_KEYS)
        documents, tokens, sources = body["documents"], body["tokens"], body["sources"]
        _keys(documents, "documents", _SPLITS)
        _keys(tokens, "tokens", _SPLITS)
        if not isinstance(sources, list):
            raise ManifestError(f"manifest sources = {sources!r}: must be a list of folders or URLs")
        manifest = cls(
            tokenizer=TokenizerEntry(
                kind=tok["kind"], file=tok["file"], sha256=tok["sha256"], vocab=tok["vocab"], eos_id=tok["eos_id"]
            ),
            dtype=body["dtype"],
            train=_entries(body["train"], "train"),
            validation=_entries(body["validation"], "validation"),
            documents=dict(documents),
            sources=tuple(sources),
        )
        for split in sorted(_SPLITS):
            _int(tokens[split], f"tokens.{split}", 0, MAX_SHARDS * MAX_SHARD_TOKENS)
        if tokens != manifest.tokens:
            raise ManifestError(f"manifest tokens = {tokens}: not the sums of its shards' tokens, {manifest.tokens}")
        return manifest


def manifest_digest(raw: bytes) -> str:
    """SHA-256 of a manifest's bytes, hex: what a run spec pins."""
    return hashlib.sha256(raw).hexdigest()


def source_url(source: str, file: str) -> str:
    """Where ``file`` is found under ``source`` (a folder or an http(s) URL)."""
    return source.rstrip("/") + "/" + file


_TOP_KEYS = {"format", "version", "tokenizer", "dtype", "train", "validation", "documents", "tokens", "sources"}
_TOKENIZER_KEYS = {"kind", "file", "sha256", "vocab", "eos_id"}
_SPLITS = {"train", "validation"}
_SHARD_KEYS = {"file", "sha256", "tokens"}


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise ManifestError(f"manifest key {key!r} appears twice")
        seen[key] = value
    return seen


def _entry_json(entry: ShardEntry) -> dict[str, object]:
    return {"file": entry.file, "sha256": entry.sha256, "tokens": entry.tokens}


def _keys(value: Any, what: str, keys: set[str]) -> None:
    """Exactly ``keys``: a missing one is a broken manifest, an unknown one a format this swarmd does not know."""
    if not isinstance(value, dict):
        raise ManifestError(f"manifest {what} must be an object, got {type(value).__name__}")
    if missing := sorted(keys - set(value)):
        raise ManifestError(f"manifest {what} lacks {missing}")
    if unknown := sorted(set(value) - keys):
        raise ManifestError(f"manifest {what} has unknown keys {unknown[:5]}: written by a newer swarmd? upgrade")


def _entries(value: Any, split: str) -> tuple[ShardEntry, ...]:
    if not isinstance(value, list):
        raise ManifestError(f"manifest {split} must be a list of shards, got {type(value).__name__}")
    if len(value) > MAX_SHARDS:
        raise ManifestError(f"manifest {split} lists {len(value)} shards, over the limit of {MAX_SHARDS}")
    entries = []
    for i, item in enumerate(value):
        _keys(item, f"{split}[{i}]", _SHARD_KEYS)
        entries.append(ShardEntry(file=item["file"], sha256=item["sha256"], tokens=item["tokens"]))
    return tuple(entries)


def _int(value: object, what: str, low: int, high: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise ManifestError(f"manifest {what} = {value!r}: must be an integer from {low} to {high}")
    return value


def _name(value: object, what: str) -> None:
    if (
        not isinstance(value, str)
        or not 1 <= len(value) <= MAX_FILE_NAME
        or not _SAFE_NAME.fullmatch(value)
        or value in {".", ".."}
        or ".." in value
    ):
        raise ManifestError(
            f"manifest {what} = {value!r}: a file name must be 1 to {MAX_FILE_NAME} of A-Z a-z 0-9 . _ -, without '..'"
        )


def _digest(value: object, what: str) -> None:
    if not isinstance(value, str) or not _HEX64.fullmatch(value):
        raise ManifestError(f"manifest {what} = {value!r}: must be a SHA-256, 64 lowercase hex digits")


def check_sources(sources: Sequence[object]) -> None:
    """Refuse sources that are not folders or http(s) URLs, or too many (ManifestError naming the first)."""
    if len(sources) > MAX_SOURCES:
        raise ManifestError(f"manifest lists {len(sources)} sources, over the limit of {MAX_SOURCES}")
    for i, source in enumerate(sources):
        _source(source, i)


def _source(value: object, index: int) -> None:
    what = f"sources[{index}]"
    if not isinstance(value, str) or not 1 <= len(value) <= MAX_SOURCE_CHARS:
        raise ManifestError(f"manifest {what} = {value!r}: must be a folder or URL of 1 to {MAX_SOURCE_CHARS} chars")
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise ManifestError(f"manifest {what} = {value!r}: control characters are not allowed")
    if "://" in value:
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.netloc or parts.query or parts.fragment:
            raise ManifestError(
                f"manifest {what} = {value!r}: a URL source must be http:// or https:// with a host, "
                "and no query or fragment"
            )


def _check(m: Manifest) -> None:
    t = m.tokenizer
    if t.kind not in KINDS:
        raise ManifestError(f"manifest tokenizer.kind = {t.kind!r}: must be one of {list(KINDS)}")
    _int(t.vocab, "tokenizer.vocab", 1, MAX_VOCAB)
    if t.eos_id is not None:
        _int(t.eos_id, "tokenizer.eos_id", 0, t.vocab - 1)
    if t.kind == "bytes":
        if (t.file, t.sha256, t.vocab, t.eos_id) != (None, None, 256, None):
            raise ManifestError(
                f"manifest tokenizer: kind 'bytes' has file null, sha256 null, vocab 256, eos_id null; "
                f"got {t.file!r}, {t.sha256!r}, {t.vocab!r}, {t.eos_id!r}"
            )
    else:
        _name(t.file, "tokenizer.file")
        _digest(t.sha256, "tokenizer.sha256")
    if m.dtype not in DTYPES or m.dtype != dtype_for_vocab(t.vocab):
        raise ManifestError(
            f"manifest dtype = {m.dtype!r}: a vocabulary of {t.vocab} ids is stored as {dtype_for_vocab(t.vocab)!r}"
        )
    if not m.train:
        raise ManifestError("manifest train lists no shard: a dataset needs at least one")
    if len(m.train) + len(m.validation) > MAX_SHARDS:
        raise ManifestError(f"manifest lists {len(m.train) + len(m.validation)} shards, over the limit of {MAX_SHARDS}")
    names: set[str] = {t.file} if t.file else set()
    for split, entries in (("train", m.train), ("validation", m.validation)):
        for i, e in enumerate(entries):
            _name(e.file, f"{split}[{i}].file")
            _digest(e.sha256, f"{split}[{i}].sha256")
            _int(e.tokens, f"{split}[{i}].tokens", 1, MAX_SHARD_TOKENS)
            if e.file in names or e.file == MANIFEST_FILE:
                raise ManifestError(f"manifest {split}[{i}].file = {e.file!r}: named twice in the manifest")
            names.add(e.file)
    for split, entries in (("train", m.train), ("validation", m.validation)):
        count = m.documents.get(split)
        tokens = sum(e.tokens for e in entries)
        _int(count, f"documents.{split}", 1 if entries else 0, max(tokens, 0))
    check_sources(m.sources)
