"""The sequences of a run's data, addressed by data index, the same on every machine.

:meth:`Dataset.sequence` of the same index is the same tokens on every machine and in every
process, so a task pool can hand out indices instead of data, and a lost micro-batch is
recomputed bit for bit.

The data is a list of shards, known by their token counts and read through a callback
(``read(shard, start, count)``), so a dataset far larger than memory costs O(shards) here. Each
shard is cut into non-overlapping windows of ``seq_len`` tokens (a tail shorter than a window is
unused). A data index maps to tokens in four steps::

    index -> (epoch, position)          divmod by the windows of an epoch
    epoch -> the epoch's shard order    a permutation of the shards drawn from (seed, epoch)
    position -> shard, k-th of it       the shards' windows laid end to end in that order
    (epoch, shard), k -> window         a permutation of the shard's windows from (seed, epoch, shard)

Consecutive indices therefore stay in one shard until it is used up: the swarm walks through
the data together, so a peer reads one or two shards at a time and fetches the next ones
(:meth:`Dataset.shards_ahead`) before they are needed. This is MosaicML streaming's idea
(shuffle shards, then samples within a shard) without its blocks and its node-dependent parts:
here the order may depend on nothing but the seed.

The orders are permutations computed with fixed 64-bit integer arithmetic (SplitMix64, then a
stable sort), not NumPy's or PyTorch's random generators, whose streams are not promised to stay
the same across their releases. A dataset of one shard gives the windows of the single in-memory
buffer this class held before it had shards, in the same order: the default run is unchanged.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence

import numpy as np
import torch

from swarmd.errors import SwarmdError

ReadTokens = Callable[[int, int, int], np.ndarray]
"""``read(shard, start, count)``: tokens ``[start, start + count)`` of ``shard``, any integer dtype."""

MAX_SHARDS = 1_000_000
"""Most shards a dataset may have (the manifest's limit too)."""

CACHED_WINDOW_ORDERS = 8
"""Shards whose window order is kept: a share spans one or two, and a re-queued one looks back."""

CACHED_EPOCHS = 2
"""Epochs whose shard order is kept: the current one, and the next (:meth:`Dataset.shards_ahead`)."""


class CorpusError(SwarmdError):
    """A corpus is missing, unreadable, too large or too short for the run."""


class Dataset:
    """Sequences of ``seq_len`` tokens from shards, addressed by data index, the same on every machine.

    Indices ``0 .. len-1`` visit every window of every shard once (one epoch); index ``len + i``
    starts the next epoch, with fresh orders drawn from ``(seed, epoch)``.
    """

    def __init__(self, shard_tokens: Sequence[int], seq_len: int, seed: int, read: ReadTokens) -> None:
        if seq_len < 1:
            raise ValueError(f"seq_len must be at least 1, got {seq_len}")
        if not 1 <= len(shard_tokens) <= MAX_SHARDS:
            raise CorpusError(f"a dataset needs 1 to {MAX_SHARDS} shards, got {len(shard_tokens)}")
        tokens = np.array([int(t) for t in shard_tokens], dtype=np.int64)
        if (tokens < 0).any():
            raise ValueError(f"shard token counts must be >= 0, got {int(tokens.min())}")
        self.seq_len = seq_len
        """Tokens per sequence."""
        self.seed = seed
        """Seed of the shard and window orders."""
        self.read = read
        """Where tokens come from (module doc)."""
        self.shard_windows = tokens // seq_len
        """Windows of each shard, in shard (file) order."""
        self.first_window = np.concatenate(([0], np.cumsum(self.shard_windows)[:-1])).astype(np.int64)
        """Dataset-wide number of each shard's first window (shard 0's windows are numbered first)."""
        self._total = int(self.shard_windows.sum())
        if self._total < 1:
            raise CorpusError(
                f"the dataset's {len(tokens)} shard(s) hold {int(tokens.sum())} tokens and none holds one "
                f"sequence of {seq_len}; use more data or a shorter seq_len"
            )
        self._epochs: OrderedDict[int, tuple[np.ndarray, np.ndarray]] = OrderedDict()
        self._window_orders: OrderedDict[tuple[int, int], np.ndarray] = OrderedDict()
        # Cells read micro-batches from worker threads: the caches' LRU moves must not interleave.
        self._lock = threading.Lock()

    @classmethod
    def from_tokens(cls, data: bytes | np.ndarray, seq_len: int, seed: int) -> Dataset:
        """A dataset of one shard held in memory: ``data``'s bytes (byte tokens) or an integer array."""
        is_bytes = not isinstance(data, np.ndarray)
        tokens = np.frombuffer(data, dtype=np.uint8) if not isinstance(data, np.ndarray) else data
        unit = "bytes" if is_bytes else "tokens"
        if seq_len >= 1 and len(tokens) < seq_len:
            raise CorpusError(
                f"the corpus is {len(tokens)} {unit}, shorter than one sequence of {seq_len}; "
                "use a longer corpus or a shorter seq_len"
            )
        return cls([len(tokens)], seq_len, seed, memory_reader([tokens]))

    def __len__(self) -> int:
        """Sequences per epoch: the number of windows of all shards."""
        return self._total

    @property
    def shards(self) -> int:
        """Number of shards."""
        return len(self.shard_windows)

    def locate(self, index: int) -> tuple[int, int]:
        """``(shard, window within that shard)`` that data index ``index`` reads."""
        if index < 0:
            raise IndexError(f"data index must be non-negative, got {index}")
        epoch, position = divmod(int(index), self._total)
        order, ends = self._epoch(epoch)
        k = int(np.searchsorted(ends, position, side="right"))
        shard = int(order[k])
        within = position - (int(ends[k]) - int(self.shard_windows[shard]))
        return shard, int(self._window_order(epoch, shard)[within])

    def shard_of(self, index: int) -> int:
        """The shard data index ``index`` reads."""
        if index < 0:
            raise IndexError(f"data index must be non-negative, got {index}")
        epoch, position = divmod(int(index), self._total)
        order, ends = self._epoch(epoch)
        return int(order[int(np.searchsorted(ends, position, side="right"))])

    def window(self, index: int) -> int:
        """The dataset-wide window that data index ``index`` reads (``first_window[shard]`` + its window)."""
        shard, within = self.locate(index)
        return int(self.first_window[shard]) + within

    def sequence(self, index: int) -> torch.Tensor:
        """The tokens of data index ``index``: a LongTensor of shape ``[seq_len]``."""
        shard, within = self.locate(index)
        tokens = self.read(shard, within * self.seq_len, self.seq_len)
        if len(tokens) != self.seq_len:
            raise CorpusError(
                f"shard {shard} gave {len(tokens)} tokens at window {within}, not {self.seq_len}: "
                "its file is shorter than its token count says"
            )
        return torch.from_numpy(np.asarray(tokens).astype(np.int64))

    def batch(self, indices: list[int] | range) -> torch.Tensor:
        """The sequences of ``indices``, stacked: a LongTensor of shape ``[len(indices), seq_len]``."""
        if len(indices) == 0:
            return torch.empty((0, self.seq_len), dtype=torch.long)
        return torch.stack([self.sequence(i) for i in indices])

    def micro_batch(self, index: int, size: int) -> torch.Tensor:
        """Micro-batch ``index`` of ``size`` sequences: data indices ``[index*size, (index+1)*size)``.

        The one convention every trainer shares (swarm workers and the single-process
        reference), so that their losses can be compared at equal tokens and any micro-batch
        can be recomputed from its index alone.
        """
        if index < 0 or size < 1:
            raise CorpusError(f"micro-batch {index} of size {size}: the index must be >= 0 and the size >= 1")
        return self.batch(range(index * size, (index + 1) * size))

    def shard_order(self, epoch: int) -> list[int]:
        """The shards in the order epoch ``epoch`` reads them (shards without a window included)."""
        return [int(s) for s in self._epoch(epoch)[0]]

    def shards_ahead(self, index: int, n: int) -> list[int]:
        """The next ``n`` distinct shards training reads after the shard of data index ``index``.

        In reading order, crossing into the next epoch; the shard of ``index`` itself and shards
        without a window are left out, so fewer than ``n`` come back when the dataset has fewer
        other shards. What a peer fetches ahead of the indices it is handed.
        """
        if index < 0:
            raise IndexError(f"data index must be non-negative, got {index}")
        epoch, position = divmod(int(index), self._total)
        order, ends = self._epoch(epoch)
        k = int(np.searchsorted(ends, position, side="right"))
        current = int(order[k])
        found: list[int] = []
        # The rest of this epoch, then the next one whole: every shard with a window is met by then.
        candidates = (int(s) for e, start in ((epoch, k + 1), (epoch + 1, 0)) for s in self._epoch(e)[0][start:])
        for shard in candidates:
            if len(found) >= n:
                break
            if shard != current and self.shard_windows[shard] > 0 and shard not in found:
                found.append(shard)
        return found

    def _epoch(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """The epoch's shard order, and where each shard's windows end in it (cumulative)."""
        with self._lock:
            cached = self._epochs.get(epoch)
            if cached is None:
                order = _permutation(self.shards, f"swarmd-dataset-shards:{self.seed}:{epoch}")
                cached = (order, np.cumsum(self.shard_windows[order]))
                self._epochs[epoch] = cached
                while len(self._epochs) > CACHED_EPOCHS:
                    self._epochs.popitem(last=False)
            else:
                self._epochs.move_to_end(epoch)
            return cached

    def _window_order(self, epoch: int, shard: int) -> np.ndarray:
        key = (epoch, shard)
        with self._lock:
            order = self._window_orders.get(key)
            if order is None:
                # Shard 0 keeps the key of the one-buffer dataset, so that one shard gives its order.
                name = f"swarmd-dataset:{self.seed}:{epoch}" + (f":{shard}" if shard else "")
                order = _permutation(int(self.shard_windows[shard]), name)
                self._window_orders[key] = order
                while len(self._window_orders) > CACHED_WINDOW_ORDERS:
                    self._window_orders.popitem(last=False)
            else:
                self._window_orders.move_to_end(key)
            return order


def memory_reader(shards: Sequence[np.ndarray]) -> ReadTokens:
    """A ``read`` over token arrays held in memory (a corpus, tests)."""

    def read(shard: int, start: int, count: int) -> np.ndarray:
        return shards[shard][start : start + count]

    return read


_MASK64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64's output function over uint64 values (wrapping arithmetic, the same everywhere)."""
    with np.errstate(over="ignore"):
        z = x + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def _permutation(n: int, name: str) -> np.ndarray:
    """A permutation of ``range(n)`` that depends only on ``(n, name)``."""
    key = hashlib.sha256(name.encode()).digest()
    offset = np.uint64(int.from_bytes(key[:8], "little"))
    with np.errstate(over="ignore"):
        keys = _splitmix64(np.arange(n, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15) + offset) & _MASK64
    # A stable sort breaks the (vanishingly rare) ties by position, so the result is unique.
    order = np.argsort(keys, kind="stable")
    # int32 halves a cached order's memory; a shard never has 2**31 windows (MAX_SHARD_TOKENS).
    return order.astype(np.int32) if n < 2**31 else order
