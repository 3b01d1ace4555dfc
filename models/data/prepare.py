"""Text inputs turned into a prepared dataset: token shards, the tokenizer and ``manifest.json`` in one folder.

:func:`prepare` streams the inputs (``swarmd.models.data.text_inputs``) in bounded memory:
documents are gathered in batches of about :data:`BATCH_CHARS` characters, encoded with the
tokenizer's batch encoder (on every core), and each document, preceded by the end-of-text token
as llm.c's and nanoGPT's preparation scripts do (none for bytes), goes whole to one shard. Which
one is decided by the SHA-256 of its text: one part of the hash puts it in the held-out split
(the ``validation_fraction`` of documents, up to ``validation_max_tokens`` tokens; a document
repeated in the input is always on the same side), another picks one of several open training
shards, so that every shard is a sample of the whole input, whatever its order.

The folder is self-contained: the shards (``train-00000.bin``, ``val-00000.bin``: raw
little-endian tokens), a copy of the tokenizer file, and ``manifest.json``, written last and
atomically; a folder without a manifest is not a dataset. The same inputs, in the same order,
with the same tokenizer and settings, give byte-identical files.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import re
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from swarmd.errors import SwarmdError
from swarmd.models.data.manifest import (
    MANIFEST_FILE,
    MAX_SHARD_TOKENS,
    MAX_VOCAB,
    Manifest,
    TokenizerEntry,
    check_sources,
    dtype_for_vocab,
)
from swarmd.models.data.shard_writer import ShardWriter
from swarmd.models.data.text_inputs import check_inputs, documents, total_bytes
from swarmd.models.files import write_atomically
from swarmd.models.tokenizer import Tokenizer

logger = logging.getLogger(__name__)

DEFAULT_SHARD_TOKENS = 1 << 25
"""Tokens per shard (64 MiB of uint16): minutes of a swarm's training each, so that a peer holds
one or two and fetches the next while it trains; MosaicML streaming's default is 64 MiB too."""
DEFAULT_VALIDATION_FRACTION = 0.005
DEFAULT_VALIDATION_MAX_TOKENS = 10_000_000
"""Held-out tokens at most: every peer that scores fetches them all (20 MB of uint16)."""
MAX_VALIDATION_FRACTION = 0.5
OPEN_SHARDS = 8
"""Training shards written at once, among which documents are spread by hash."""
BATCH_CHARS = 2 * 1024 * 1024
"""Characters encoded in one batch: large enough to keep every core busy, small enough to bound memory."""
BATCH_DOCUMENTS = 8192
TOKENIZER_FILE = "tokenizer.json"
_OUTPUT_FILE = re.compile(r"\.?(train|val)-\d{5,}\.bin(\.partial)?")
"""A shard of an earlier prepare (or a partial one), which ``overwrite`` removes."""

Progress = Callable[[int, int], None]
"""``progress(bytes of input read, bytes of input in all)``."""


class PrepareError(SwarmdError):
    """A dataset cannot be prepared: bad settings, an output folder in the way, no documents."""


@dataclass(frozen=True)
class PrepareResult:
    folder: Path
    manifest: Manifest
    manifest_sha256: str
    documents: int
    tokens: int
    input_bytes: int
    seconds: float

    @property
    def shards(self) -> int:
        return len(self.manifest.train) + len(self.manifest.validation)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


def prepare(
    inputs: Sequence[str | Path],
    tokenizer: Tokenizer,
    out_dir: str | Path,
    *,
    shard_tokens: int = DEFAULT_SHARD_TOKENS,
    validation_fraction: float = DEFAULT_VALIDATION_FRACTION,
    validation_max_tokens: int = DEFAULT_VALIDATION_MAX_TOKENS,
    text_field: str = "text",
    sources: Sequence[str] = (),
    overwrite: bool = False,
    open_shards: int = OPEN_SHARDS,
    progress: Progress | None = None,
) -> PrepareResult:
    """Prepare ``inputs`` into ``out_dir`` (module doc); PrepareError or InputError naming what is wrong."""
    started = time.monotonic()
    _check_settings(tokenizer, shard_tokens, validation_fraction, validation_max_tokens, open_shards)
    paths = check_inputs(inputs)
    out = Path(out_dir).expanduser()
    _clear_output(out, overwrite)
    dtype = dtype_for_vocab(tokenizer.vocab_size)
    check_sources(sources)  # before any token is written: a typo should not cost an hour of work
    entry = TokenizerEntry(
        kind=tokenizer.kind,
        file=TOKENIZER_FILE if tokenizer.raw is not None else None,
        sha256=tokenizer.sha256,
        vocab=tokenizer.vocab_size,
        eos_id=tokenizer.eot_id,
    )

    split = _Split(
        ShardWriter(out, "train", dtype, shard_tokens, open_shards),
        ShardWriter(out, "val", dtype, shard_tokens, 1),
        tokenizer.eot_id,
        validation_fraction,
        validation_max_tokens,
    )
    total = total_bytes(paths)
    try:
        # Batch k+1 is encoded (tokenizers lets go of the GIL, and uses every core) while this
        # thread hashes and writes batch k and reads batch k+2: the order stays the input's.
        with ThreadPoolExecutor(1, thread_name_prefix="encode") as encoder:
            pending: tuple[list[str], Future[list[np.ndarray]], int] | None = None
            for batch, read in _batches(_all_documents(paths, text_field)):
                encoding = encoder.submit(tokenizer.encode_batch, batch)
                if pending is not None:
                    split.add(pending[0], pending[1].result())
                    if progress is not None:
                        progress(pending[2], total)
                pending = (batch, encoding, read)
            if pending is not None:
                split.add(pending[0], pending[1].result())
        if progress is not None:
            progress(total, total)
        train_entries, held_out_entries = split.train.finish(), split.held_out.finish()
    except BaseException:
        split.train.abort()
        split.held_out.abort()
        raise
    train, held_out = split.train, split.held_out
    if not train_entries:
        raise PrepareError(
            f"the inputs hold no document for training ({held_out.documents} held out): "
            "give more text, or a smaller --validation-fraction"
        )
    if tokenizer.raw is not None:
        write_atomically(out / TOKENIZER_FILE, tokenizer.raw)
    manifest = Manifest(
        tokenizer=entry,
        dtype=dtype,
        train=tuple(train_entries),
        validation=tuple(held_out_entries),
        documents={"train": train.documents, "validation": held_out.documents},
        sources=tuple(sources),
    )
    raw = manifest.to_json()
    write_atomically(out / MANIFEST_FILE, raw)
    seconds = time.monotonic() - started
    tokens = manifest.tokens["train"] + manifest.tokens["validation"]
    logger.info(
        "prepared %s: %d documents, %d tokens in %d shards, %.0f tokens/s",
        out,
        train.documents + held_out.documents,
        tokens,
        len(train_entries) + len(held_out_entries),
        tokens / max(seconds, 1e-9),
    )
    return PrepareResult(
        folder=out,
        manifest=manifest,
        manifest_sha256=hashlib.sha256(raw).hexdigest(),
        documents=train.documents + held_out.documents,
        tokens=tokens,
        input_bytes=total,
        seconds=seconds,
    )


def _check_settings(
    tokenizer: Tokenizer, shard_tokens: int, fraction: float, max_tokens: int, open_shards: int
) -> None:
    if not 1 <= tokenizer.vocab_size <= MAX_VOCAB:
        raise PrepareError(f"a tokenizer of {tokenizer.vocab_size} ids: the limit is {MAX_VOCAB}")
    if not 1 <= shard_tokens <= MAX_SHARD_TOKENS:
        raise PrepareError(f"--shard-tokens {shard_tokens}: give 1 to {MAX_SHARD_TOKENS} tokens per shard")
    if not 0.0 <= fraction <= MAX_VALIDATION_FRACTION:
        raise PrepareError(f"--validation-fraction {fraction}: give 0 (none held out) to {MAX_VALIDATION_FRACTION}")
    if max_tokens < 0:
        raise PrepareError(f"--validation-max-tokens {max_tokens}: must be 0 or more")
    if not 1 <= open_shards <= 256:
        raise PrepareError(f"open_shards {open_shards}: give 1 to 256")


def _clear_output(out: Path, overwrite: bool) -> None:
    """Make ``out`` an empty folder, or with ``overwrite`` remove what an earlier prepare wrote there.

    Only this module's own files go (the manifest first, so a crash never leaves one that names
    shards that are gone); anything else of the owner's stays.
    """
    if out.exists() and not out.is_dir():
        raise PrepareError(f"output {out} exists and is not a folder; choose another path")
    if out.is_dir() and any(out.iterdir()):
        if not overwrite:
            raise PrepareError(f"output folder {out} is not empty; choose another path or pass --overwrite")
        with contextlib.suppress(FileNotFoundError):
            (out / MANIFEST_FILE).unlink()
        for path in out.iterdir():
            if path.is_file() and (_OUTPUT_FILE.fullmatch(path.name) or path.name == TOKENIZER_FILE):
                path.unlink()
    out.mkdir(parents=True, exist_ok=True)


class _Split:
    """Where each document goes: held out or not, and which open training shard (module doc)."""

    def __init__(
        self, train: ShardWriter, held_out: ShardWriter, eot_id: int | None, fraction: float, max_held_out: int
    ) -> None:
        self.train = train
        self.held_out = held_out
        self.separator = None if eot_id is None else np.array([eot_id], dtype=np.uint32)
        self.threshold = int(fraction * 2**64)
        self.max_held_out = max_held_out

    def add(self, texts: list[str], encoded: list[np.ndarray]) -> None:
        slots = len(self.train.slots)
        for text, ids in zip(texts, encoded, strict=True):
            digest = hashlib.sha256(text.encode("utf-8")).digest()
            tokens = ids if self.separator is None else np.concatenate((self.separator, ids))
            held = int.from_bytes(digest[:8], "little") < self.threshold
            if held and self.held_out.tokens + len(tokens) <= self.max_held_out:
                self.held_out.add(tokens, 0)
            else:
                self.train.add(tokens, int.from_bytes(digest[8:16], "little") % slots)


def _all_documents(paths: list[Path], text_field: str) -> Iterator[tuple[str, int]]:
    """The documents of every input in turn, with the bytes of all inputs read so far."""
    before = 0
    for path in paths:
        for text, read in documents(path, text_field=text_field):
            yield text, before + read
        before += path.stat().st_size


def _batches(docs: Iterator[tuple[str, int]]) -> Iterator[tuple[list[str], int]]:
    """Documents in batches of about BATCH_CHARS characters, with the bytes read by the batch's end."""
    batch: list[str] = []
    chars = 0
    read = 0
    for text, read in docs:
        batch.append(text)
        chars += len(text)
        if chars >= BATCH_CHARS or len(batch) >= BATCH_DOCUMENTS:
            yield batch, read
            batch, chars = [], 0
    if batch:
        yield batch, read
