"""The store of a run's files: copies used only once checked, a cache that never outgrows its bound."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from swarmd.data.store import DataError, FileStore

pytestmark = pytest.mark.timeout(30)


def put(folder: Path, name: str, data: bytes) -> tuple[str, Path]:
    path = folder / name
    path.write_bytes(data)
    return hashlib.sha256(data).hexdigest(), path


def fetched(store: FileStore, data: bytes) -> str:
    """A file as a fetch leaves it: written to a temporary file, then admitted."""
    digest = hashlib.sha256(data).hexdigest()
    store.make_room(len(data), "a test file")
    tmp = store.temporary()
    tmp.write_bytes(data)
    store.admit(digest, tmp)
    store.release(len(data))
    return digest


def test_a_copy_is_used_only_once_its_digest_checks(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "cache", 1 << 20)
    store.open()
    digest, good = put(tmp_path, "good.bin", b"tokens" * 100)
    _, bad = put(tmp_path, "bad.bin", b"tokens" * 99 + b"tokenZ")
    store.offer(digest, bad)
    store.offer(digest, good)
    assert store.knows(digest) and not store.has(digest)
    assert store.find(digest) == good
    assert store.counters.refused_local == 1
    assert store.read(digest, 6, 6) == b"tokens"
    assert store.read(digest, 594, 100) == b"tokens"  # fewer at its end


def test_checked_files_are_remembered_across_restarts_until_they_change(tmp_path: Path) -> None:
    digest, path = put(tmp_path, "shard.bin", b"x" * 5000)
    first = FileStore(tmp_path / "cache", 1 << 20)
    first.open()
    first.offer(digest, path)
    assert first.find(digest) == path
    again = FileStore(tmp_path / "cache", 1 << 20)
    again.open()
    again.offer(digest, path)
    assert again._check(digest, path)  # from the memo: no hashing
    path.write_bytes(b"y" * 5000)  # changed behind our back (same size, new mtime)
    os.utime(path, ns=(0, 12345))
    third = FileStore(tmp_path / "cache", 1 << 20)
    third.open()
    third.offer(digest, path)
    assert third.find(digest) is None and third.counters.refused_local == 1


def test_the_cache_evicts_the_least_recently_used_and_never_a_pinned_file(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "cache", 3000)
    store.open()
    a = fetched(store, b"a" * 1000)
    b = fetched(store, b"b" * 1000)
    store.pin(a)
    c = fetched(store, b"c" * 1000)
    store.touch(b)
    d = fetched(store, b"d" * 1000)  # evicts c: a is pinned, b was used after c
    assert {x: store.has(x) for x in (a, b, c, d)} == {a: True, b: True, c: False, d: True}
    assert not (tmp_path / "cache" / c).exists()
    assert store.cached_bytes() <= 3000 and store.counters.evicted == 1
    store.pin(b)
    store.pin(d)
    with pytest.raises(DataError, match="does not fit the data cache .* raise \\[limits\\] data_cache_gib"):
        store.make_room(1000, "shard 9")
    with pytest.raises(DataError, match="over the whole data cache"):
        store.make_room(4000, "shard 10")


def test_data_folder_copies_are_never_evicted_nor_counted(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "cache", 1500)
    store.open()
    digest, path = put(tmp_path, "mine.bin", b"m" * 1000)
    store.offer(digest, path)
    assert store.find(digest) == path
    fetched(store, b"f" * 1000)
    fetched(store, b"g" * 1000)
    assert path.exists() and store.has(digest) and store.cached_bytes() == 1000


def test_a_cached_copy_that_rotted_is_deleted_and_refused(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "cache", 1 << 20)
    store.open()
    digest = fetched(store, b"z" * 2000)
    store.close()
    cached = tmp_path / "cache" / digest
    data = bytearray(cached.read_bytes())
    data[7] ^= 1
    cached.write_bytes(bytes(data))
    os.utime(cached, ns=(0, 99))
    again = FileStore(tmp_path / "cache", 1 << 20)
    again.open()
    assert again.find(digest) is None and not cached.exists()
    (tmp_path / "cache" / ".fetch-half").write_bytes(b"cut short")
    FileStore(tmp_path / "cache", 1 << 20).open()
    assert not (tmp_path / "cache" / ".fetch-half").exists()


def test_room_reserved_for_a_fetch_in_progress_counts_against_the_bound(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "cache", 3000)
    store.open()
    a = fetched(store, b"a" * 1000)
    store.pin(a)
    store.make_room(1000, "shard 1")  # two fetches at once: each reserves its size first
    store.make_room(1000, "shard 2")
    with pytest.raises(DataError, match="does not fit"):
        store.make_room(1000, "shard 3")
    store.release(1000)
    store.make_room(1000, "shard 3")
