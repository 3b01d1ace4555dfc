"""Training text and the deterministic sequences cut from it.

A run names its corpus (``"builtin"`` or a local file that is on every machine) and pins its
SHA-256 (:func:`corpus_digest`), so every peer can check it trains on the same bytes. The
sequences are addressed by a data index: :meth:`Dataset.sequence` of the same index is the
same tokens on every machine and in every process, so a task pool can hand out indices
instead of data, and a lost micro-batch is recomputed bit for bit.

The order of windows is a permutation computed from the seed with fixed 64-bit integer
arithmetic (SplitMix64, then a stable sort), not from NumPy's or PyTorch's random generators,
whose streams are not promised to stay the same across their releases.
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
import torch

from swarmd.errors import SwarmdError

logger = logging.getLogger(__name__)

BUILTIN = "builtin"
"""The corpus name of the text that ships with the package (see ``data/LICENSE-corpus.txt``)."""

BUILTIN_RESOURCE = "data/builtin_corpus.txt.gz"

BUILTIN_SHA256 = "71f2ff5d99bdc1f9c48c5c2353ad138201c5ca1c377e0226857ef8fa89b8bcee"
"""SHA-256 of the built-in corpus, uncompressed (466,273 bytes)."""

MAX_CORPUS_BYTES = 2 * 1024**3
"""Largest corpus that is loaded, uncompressed: it is held in memory whole."""

EVAL_FRACTION = 0.02
"""Share of windows, at the end of the corpus, held out for evaluation by default."""


class CorpusError(SwarmdError):
    """A corpus is missing, unreadable, too large or too short for the run."""


def load_corpus(name: str, *, max_bytes: int = MAX_CORPUS_BYTES) -> bytes:
    """The bytes of corpus ``name``: ``"builtin"``, or the path of a local file (``.gz`` is unpacked).

    Raises CorpusError naming the path when the file is missing, unreadable, empty, or larger
    than ``max_bytes`` once unpacked.
    """
    if name == BUILTIN:
        resource = importlib.resources.files("swarmd.models").joinpath(BUILTIN_RESOURCE)
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


class Dataset:
    """Sequences of ``seq_len`` byte tokens, addressed by data index, the same on every machine.

    The corpus is cut into non-overlapping windows of ``seq_len`` bytes (stride ``seq_len``;
    the tail shorter than a window is unused). Indices ``0 .. len-1`` visit every window of
    ``windows`` once, in an order drawn from ``seed``; index ``len + i`` starts the next epoch,
    with a fresh order drawn from ``(seed, epoch)``.
    """

    def __init__(self, data: bytes, seq_len: int, seed: int, *, windows: range | None = None) -> None:
        if seq_len < 1:
            raise ValueError(f"seq_len must be at least 1, got {seq_len}")
        total = len(data) // seq_len
        if total < 1:
            raise CorpusError(
                f"the corpus is {len(data)} bytes, shorter than one sequence of {seq_len}; "
                "use a longer corpus or a shorter seq_len"
            )
        if windows is None:
            windows = range(total)
        if windows.step != 1 or len(windows) < 1 or windows.start < 0 or windows.stop > total:
            raise ValueError(f"windows must be a non-empty range with step 1 within 0..{total}, got {windows}")
        self._tokens = np.frombuffer(data, dtype=np.uint8)
        self.seq_len = seq_len
        """Tokens per sequence."""
        self.seed = seed
        """Seed of the window order."""
        self.windows = windows
        """Which windows of the corpus this dataset draws from (window ``w`` starts at byte ``w * seq_len``)."""
        self._orders: dict[int, np.ndarray] = {}

    def __len__(self) -> int:
        """Sequences per epoch: the number of windows."""
        return len(self.windows)

    def window(self, index: int) -> int:
        """The corpus window that data index ``index`` reads."""
        if index < 0:
            raise IndexError(f"data index must be non-negative, got {index}")
        epoch, position = divmod(index, len(self.windows))
        return self.windows.start + int(self._order(epoch)[position])

    def sequence(self, index: int) -> torch.Tensor:
        """The tokens of data index ``index``: a LongTensor of shape ``[seq_len]`` with values 0-255."""
        start = self.window(index) * self.seq_len
        return torch.from_numpy(self._tokens[start : start + self.seq_len].astype(np.int64))

    def batch(self, indices: list[int] | range) -> torch.Tensor:
        """The sequences of ``indices``, stacked: a LongTensor of shape ``[len(indices), seq_len]``."""
        if len(indices) == 0:
            return torch.empty((0, self.seq_len), dtype=torch.long)
        return torch.stack([self.sequence(i) for i in indices])

    def _order(self, epoch: int) -> np.ndarray:
        order = self._orders.get(epoch)
        if order is None:
            order = _permutation(len(self.windows), self.seed, epoch)
            # Training walks the epochs forward and may look one back (re-queued tasks): keep two.
            if len(self._orders) >= 2:
                self._orders.pop(min(self._orders))
            self._orders[epoch] = order
        return order

    def micro_batch(self, index: int, size: int) -> torch.Tensor:
        """Micro-batch ``index`` of ``size`` sequences: data indices ``[index*size, (index+1)*size)``.

        The one convention every trainer shares (swarm workers and the single-process
        reference), so that their losses can be compared at equal tokens and any micro-batch
        can be recomputed from its index alone.
        """
        if index < 0 or size < 1:
            raise CorpusError(f"micro-batch {index} of size {size}: the index must be >= 0 and the size >= 1")
        return self.batch(range(index * size, (index + 1) * size))


def train_eval_split(
    data: bytes, seq_len: int, seed: int, *, eval_fraction: float = EVAL_FRACTION
) -> tuple[Dataset, Dataset]:
    """A training and an evaluation Dataset over disjoint windows: the last ``eval_fraction`` is held out.

    The held-out windows are the last ones of the corpus (at least one), so no training window
    shares a byte with an evaluation window.
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
    cut = total - held_out
    return Dataset(data, seq_len, seed, windows=range(cut)), Dataset(data, seq_len, seed, windows=range(cut, total))


_MASK64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64's output function over uint64 values (wrapping arithmetic, the same everywhere)."""
    with np.errstate(over="ignore"):
        z = x + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def _permutation(n: int, seed: int, epoch: int) -> np.ndarray:
    """A permutation of ``range(n)`` that depends only on ``(n, seed, epoch)``."""
    key = hashlib.sha256(f"swarmd-dataset:{seed}:{epoch}".encode()).digest()
    offset = np.uint64(int.from_bytes(key[:8], "little"))
    with np.errstate(over="ignore"):
        keys = _splitmix64(np.arange(n, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15) + offset) & _MASK64
    # A stable sort breaks the (vanishingly rare) ties by position, so the result is unique.
    return np.argsort(keys, kind="stable")
