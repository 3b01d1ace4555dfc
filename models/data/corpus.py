"""Training text held in memory: the built-in corpus or a local file, read as byte tokens.

A run names its corpus (``"builtin"`` or a local file that is on every machine) and pins its
SHA-256 (:func:`corpus_digest`), so every peer can check it trains on the same bytes.
:func:`train_eval_split` cuts it into a training and a held-out :class:`Dataset`
(``swarmd.models.data.windows``), whose sequences are addressed by data index.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.resources
import logging
import math
from pathlib import Path
from typing import IO

import numpy as np

from swarmd.models.data.windows import CorpusError, Dataset, memory_reader

logger = logging.getLogger(__name__)

BUILTIN = "builtin"
"""The corpus name of the text that ships with the package (see ``data/LICENSE-corpus.txt``)."""

BUILTIN_RESOURCE = "builtin_corpus.txt.gz"

BUILTIN_SHA256 = "71f2ff5d99bdc1f9c48c5c2353ad138201c5ca1c377e0226857ef8fa89b8bcee"
"""SHA-256 of the built-in corpus, uncompressed (466,273 bytes)."""

MAX_CORPUS_BYTES = 2 * 1024**3
"""Largest corpus that is loaded, uncompressed: it is held in memory whole."""

EVAL_FRACTION = 0.02
"""Share of windows, at the end of the corpus, held out for evaluation by default."""


def load_corpus(name: str, *, max_bytes: int = MAX_CORPUS_BYTES) -> bytes:
    """The bytes of corpus ``name``: ``"builtin"``, or the path of a local file (``.gz`` is unpacked).

    Raises CorpusError naming the path when the file is missing, unreadable, empty, or larger
    than ``max_bytes`` once unpacked.
    """
    if name == BUILTIN:
        resource = importlib.resources.files("swarmd.models.data").joinpath(BUILTIN_RESOURCE)
        try:
            with resource.open("rb") as raw:
                data = _read_gzip_bounded(raw, max_bytes, f"built-in corpus {resource}")
        except OSError as e:
            raise CorpusError(f"cannot read the built-in corpus {resource}: {e}; reinstall swarmd") from e
        return data

    path = Path(name).expanduser()
    if not path.is_file():
        raise CorpusError(f"corpus file {path} does not exist or is not a file; give an existing path or 'builtin'")
    try:
        if path.suffix == ".gz":
            with path.open("rb") as raw:
                data = _read_gzip_bounded(raw, max_bytes, f"corpus file {path}")
        else:
            size = path.stat().st_size
            if size > max_bytes:
                raise CorpusError(
                    f"corpus file {path} is {size} bytes, over the limit of {max_bytes}; use a smaller file"
                )
            data = path.read_bytes()
    except OSError as e:
        raise CorpusError(f"cannot read corpus file {path}: {e}") from e
    if not data:
        raise CorpusError(f"corpus file {path} is empty")
    logger.debug("loaded corpus %s: %d bytes", path, len(data))
    return data


def _read_gzip_bounded(raw: IO[bytes], max_bytes: int, what: str) -> bytes:
    """Unpack a gzip stream, refusing to produce more than ``max_bytes`` (a gzip bomb stops early)."""
    chunks: list[bytes] = []
    total = 0
    try:
        with gzip.GzipFile(fileobj=raw, mode="rb") as stream:
            while chunk := stream.read(1 << 20):
                total += len(chunk)
                if total > max_bytes:
                    raise CorpusError(f"{what} unpacks to over {max_bytes} bytes, the limit; use a smaller file")
                chunks.append(chunk)
    except (gzip.BadGzipFile, EOFError) as e:
        raise CorpusError(f"{what} is not a valid gzip file: {e}") from e
    return b"".join(chunks)


def corpus_digest(data: bytes) -> str:
    """SHA-256 of the corpus bytes, hex: what a run spec pins so every peer trains on the same text."""
    return hashlib.sha256(data).hexdigest()


def train_eval_split(
    data: bytes, seq_len: int, seed: int, *, eval_fraction: float = EVAL_FRACTION
) -> tuple[Dataset, Dataset]:
    """A training and an evaluation Dataset over disjoint windows: the last ``eval_fraction`` is held out.

    The held-out windows are the last ones of the corpus (at least one), so no training window
    shares a byte with an evaluation window. Each is a dataset of one shard (its part of the
    corpus), which gives the order this function gave before datasets had shards.
    """
    if not 0.0 < eval_fraction < 1.0:
        raise ValueError(f"eval_fraction must be between 0 and 1, got {eval_fraction}")
    total = len(data) // seq_len if seq_len > 0 else 0
    if total < 2:
        raise CorpusError(
            f"the corpus is {len(data)} bytes, {total} sequence(s) of {seq_len}; "
            "splitting off evaluation data needs at least 2: use a longer corpus or a shorter seq_len"
        )
    held_out = min(total - 1, max(1, math.ceil(total * eval_fraction)))
    cut = (total - held_out) * seq_len
    tokens = np.frombuffer(data, dtype=np.uint8)
    train = Dataset([cut], seq_len, seed, memory_reader([tokens[:cut]]))
    evaluation = Dataset([held_out * seq_len], seq_len, seed, memory_reader([tokens[cut : cut + held_out * seq_len]]))
    return train, evaluation
