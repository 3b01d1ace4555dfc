"""The sequences of a run's data, addressed by data index, the same on every machine.

:meth:`Dataset.sequence` of the same index is the same tokens on every machine and in every
process, so a task pool can hand out indices instead of data, and a lost micro-batch is
recomputed bit for bit.

The order of windows is a permutation computed from the seed with fixed 64-bit integer
arithmetic (SplitMix64, then a stable sort), not from NumPy's or PyTorch's random generators,
whose streams are not promised to stay the same across their releases.
"""

from __future__ import annotations

import hashlib

import numpy as np
import torch

from swarmd.errors import SwarmdError


class CorpusError(SwarmdError):
    """A corpus is missing, unreadable, too large or too short for the run."""


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
