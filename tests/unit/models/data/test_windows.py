"""The sharded Dataset: pinned orders, locality, shards ahead, epochs, and one shard as before."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys

import numpy as np
import pytest

from swarmd.models.data.corpus import load_corpus
from swarmd.models.data.windows import CACHED_WINDOW_ORDERS, CorpusError, Dataset, memory_reader

pytestmark = pytest.mark.timeout(60)

# Shards of different sizes, one too short for a window, one whose tail is unused.
SHARD_TOKENS = [1000, 640, 30, 2048, 704, 1280]
SEQ = 64


def _shards() -> list[np.ndarray]:
    base = 0
    shards = []
    for n in SHARD_TOKENS:
        shards.append(np.arange(base, base + n, dtype=np.uint32))  # each token names its place
        base += 1_000_000
    return shards


def _dataset(seed: int = 5) -> Dataset:
    return Dataset(SHARD_TOKENS, SEQ, seed, memory_reader(_shards()))


def test_an_epoch_reads_every_window_of_every_shard_once() -> None:
    d = _dataset()
    windows = [n // SEQ for n in SHARD_TOKENS]
    assert len(d) == sum(windows) and d.shards == len(SHARD_TOKENS)
    for epoch in range(3):
        seen = [d.locate(epoch * len(d) + i) for i in range(len(d))]
        assert sorted(seen) == [(s, w) for s, n in enumerate(windows) for w in range(n)]
    for i in (0, 7, len(d) + 3):
        shard, w = d.locate(i)
        expected = np.arange(shard * 1_000_000 + w * SEQ, shard * 1_000_000 + (w + 1) * SEQ)
        assert d.sequence(i).tolist() == expected.tolist()
        assert d.window(i) == int(d.first_window[shard]) + w


def test_consecutive_indices_stay_in_one_shard_until_it_is_used_up() -> None:
    d = _dataset()
    for epoch in range(2):
        shards = [d.shard_of(epoch * len(d) + i) for i in range(len(d))]
        runs = [s for i, s in enumerate(shards) if i == 0 or s != shards[i - 1]]
        assert runs == [s for s in d.shard_order(epoch) if SHARD_TOKENS[s] >= SEQ]  # one run per shard
    assert d.shard_order(0) != d.shard_order(1)  # a fresh shard order each epoch


def test_shards_ahead_follow_the_reading_order_into_the_next_epoch() -> None:
    d = _dataset()
    order0 = [s for s in d.shard_order(0) if SHARD_TOKENS[s] >= SEQ]
    order1 = [s for s in d.shard_order(1) if SHARD_TOKENS[s] >= SEQ]
    first = d.shard_of(0)
    assert d.shards_ahead(0, 2) == order0[1:3]
    last_index = len(d) - 1
    current = d.shard_of(last_index)
    ahead = d.shards_ahead(last_index, 3)
    assert ahead == [s for s in order1 if s != current][:3]
    # No more than the other shards with windows, however many are asked for.
    assert sorted(d.shards_ahead(0, 100)) == sorted(s for s in order0 if s != first)
    assert d.shards_ahead(5, 0) == []
    # What shards_ahead names is what training then reads.
    index = 0
    while d.shard_of(index) == first:
        index += 1
    assert d.shard_of(index) == d.shards_ahead(0, 1)[0]


def test_one_shard_gives_the_order_of_the_single_buffer_dataset() -> None:
    """The window order the dataset had before shards (written out again below), for the built-in corpus."""
    corpus = load_corpus("builtin")
    for seq_len, seed in ((128, 1234), (64, 7), (256, 0)):
        now = Dataset.from_tokens(corpus, seq_len, seed)
        total = len(corpus) // seq_len
        assert len(now) == total
        for index in (0, 1, 2, 99, total - 1, total, 2 * total + 17):
            window = _single_buffer_window(total, seed, index)
            assert now.window(index) == window
            assert bytes(now.sequence(index).tolist()) == corpus[window * seq_len : (window + 1) * seq_len]


def _single_buffer_window(total: int, seed: int, index: int) -> int:
    """The window of ``index`` as the one-buffer Dataset computed it: SplitMix64 keys, stable argsort."""
    epoch, position = divmod(index, total)
    key = hashlib.sha256(f"swarmd-dataset:{seed}:{epoch}".encode()).digest()
    mask = (1 << 64) - 1
    keys = []
    for i in range(total):
        z = (i * 0x9E3779B97F4A7C15 + int.from_bytes(key[:8], "little") + 0x9E3779B97F4A7C15) & mask
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
        keys.append((z ^ (z >> 31), i))
    return sorted(keys)[position][1]


def test_the_orders_are_pinned_across_processes() -> None:
    """A fresh interpreter (another PYTHONHASHSEED) picks the same shards and windows, for shards
    and for the built-in corpus held whole (one shard: the default run's order)."""
    code = (
        "import numpy as np; from swarmd.models.data.windows import Dataset, memory_reader;"
        "from swarmd.models.data.corpus import load_corpus;"
        f"t = {SHARD_TOKENS!r};"
        "d = Dataset(t, 64, 5, memory_reader([np.zeros(n, np.uint8) for n in t]));"
        "c = Dataset.from_tokens(load_corpus('builtin'), 128, 1234);"
        "print([d.locate(i) for i in range(0, 3 * len(d), 5)], d.shards_ahead(40, 3),"
        " [c.window(i) for i in range(8)], c.sequence(3).tolist()[:8])"
    )
    runs = {
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "PYTHONHASHSEED": seed},
        ).stdout
        for seed in ("1", "2")
    }
    d = _dataset()
    c = Dataset.from_tokens(load_corpus("builtin"), 128, 1234)
    corpus = f"{[c.window(i) for i in range(8)]} {c.sequence(3).tolist()[:8]}"
    assert runs == {f"{[d.locate(i) for i in range(0, 3 * len(d), 5)]} {d.shards_ahead(40, 3)} {corpus}\n"}


def test_the_orders_are_pinned_values() -> None:
    """Fixed integer arithmetic: a change here breaks reproducibility between peers."""
    d = _dataset(seed=5)
    assert d.shard_order(0) == PINNED_ORDER
    assert [d.locate(i) for i in range(4)] == PINNED_FIRST


PINNED_ORDER = [4, 1, 5, 0, 3, 2]
PINNED_FIRST = [(4, 0), (4, 5), (4, 9), (4, 10)]


def test_seed_changes_the_order() -> None:
    a, b = _dataset(seed=1), _dataset(seed=2)
    assert [a.locate(i) for i in range(len(a))] != [b.locate(i) for i in range(len(b))]


def test_cached_orders_stay_bounded() -> None:
    many = [SEQ * 3] * 50
    d = Dataset(many, SEQ, 0, memory_reader([np.zeros(n, np.uint16) for n in many]))
    for i in range(0, 3 * len(d), 2):
        d.sequence(i)
    assert len(d._window_orders) <= CACHED_WINDOW_ORDERS and len(d._epochs) <= 2


def test_bad_shapes_are_refused() -> None:
    with pytest.raises(CorpusError, match="none holds one sequence of 64"):
        Dataset([10, 63], SEQ, 0, memory_reader([np.zeros(10), np.zeros(63)]))
    with pytest.raises(CorpusError, match="1 to 1000000 shards, got 0"):
        Dataset([], SEQ, 0, memory_reader([]))
    with pytest.raises(ValueError, match="seq_len"):
        Dataset([100], 0, 0, memory_reader([np.zeros(100)]))
    with pytest.raises(IndexError):
        _dataset().sequence(-1)
    short = Dataset([128], SEQ, 0, memory_reader([np.zeros(100, np.uint8)]))  # the file holds less
    with pytest.raises(CorpusError, match="shorter than its token count"):
        short.batch(range(2))
