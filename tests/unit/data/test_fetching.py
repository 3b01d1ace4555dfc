"""Fetching a run's file by its digest: from sources and members, every copy checked, bad ones refused."""

from __future__ import annotations

import asyncio
import functools
import hashlib
import http.server
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from swarmd.data.fetching import DataUnavailable, Fetcher, Wanted
from swarmd.data.serving import FileServer
from swarmd.data.store import FileStore
from swarmd.peers.records.identity import Identity
from swarmd.peers.records.run_id import derive_run_id
from swarmd.peers.wire.errors import NotHolder, NotMember, Unreachable
from swarmd.peers.wire.file_messages import MAX_CHUNK_BYTES, FileFetch
from swarmd.peers.wire.protocol import Request

pytestmark = pytest.mark.timeout(60)

RUN_ID = derive_run_id("files", Identity.generate().public_key)
SHARD = bytes(range(256)) * 40_000 + b"tail"  # over one chunk: fetched in two
DIGEST = hashlib.sha256(SHARD).hexdigest()
WANTED = Wanted(DIGEST, "train-00000.bin", len(SHARD), "train shard 0")


def holder(tmp_path: Path, name: str, data: bytes) -> FileServer:
    """A member's file server holding ``data`` under the shard's digest (a data folder's copy)."""
    store = FileStore(tmp_path / name / "cache", 1 << 30)
    store.open()
    path = tmp_path / name / "train-00000.bin"
    path.write_bytes(data)
    store.offer(DIGEST, path)
    return FileServer(store, lambda peer: peer == "asker")


class Members:
    """Members' file servers behind the request/answer interface the fetcher sends through."""

    def __init__(self, servers: dict[str, FileServer], holds: dict[str, list[str]]) -> None:
        self.servers, self.holds = servers, holds
        self.asked: list[str] = []

    def holders(self) -> list[tuple[str, list[str]]]:
        return sorted(self.holds.items())

    async def send(self, peer: str, request: Request[Any], blobs: list[bytes], timeout_s: float) -> Any:
        self.asked.append(peer)
        server = self.servers.get(peer)
        if server is None:
            raise Unreachable(f"{peer} is down")
        assert isinstance(request, FileFetch) and request.length == MAX_CHUNK_BYTES
        return await server.handle("asker", request, blobs)


def fetcher_for(tmp_path: Path, members: Members, sources: tuple[str, ...] = ()) -> Fetcher:
    store = FileStore(tmp_path / "asker-cache", 1 << 30)
    store.open()
    return Fetcher(RUN_ID, store, members.send, members.holders, sources)


def test_a_copy_with_a_flipped_byte_is_refused_and_fetched_from_another_holder(tmp_path: Path) -> None:
    bad = holder(tmp_path, "bad", SHARD)
    assert bad.store.find(DIGEST) is not None  # checked, then a byte rots on its disk (or it lies)
    with (tmp_path / "bad" / "train-00000.bin").open("r+b") as f:
        f.seek(1234)
        f.write(bytes([SHARD[1234] ^ 0x01]))
    members = Members(
        {"bad": bad, "good": holder(tmp_path, "good", SHARD)},
        {"bad": ["dataset"], "good": ["shards"]},  # the bad one is asked first: it says it holds all
    )
    fetcher = fetcher_for(tmp_path, members)
    path = asyncio.run(fetcher.get(WANTED))
    assert path.read_bytes() == SHARD
    assert members.asked[0] == "bad" and "good" in members.asked
    assert fetcher.counters.refused == 1 and fetcher.counters.files["member"] == 1
    assert fetcher.store.has(DIGEST)
    assert [p.name for p in (tmp_path / "asker-cache").iterdir() if p.name.startswith(".fetch")] == []


def test_sources_come_first_and_a_source_that_is_down_costs_one_try(tmp_path: Path) -> None:
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    (mirror / "train-00000.bin").write_bytes(SHARD)
    members = Members({"m": holder(tmp_path, "m", SHARD)}, {"m": ["dataset"]})
    fetcher = fetcher_for(tmp_path, members, (str(tmp_path / "gone"), str(mirror)))
    assert asyncio.run(fetcher.get(WANTED)).read_bytes() == SHARD
    assert fetcher.counters.files["source"] == 1 and members.asked == [] and fetcher.counters.failed == 1
    # The folder that is down sits out a while: the next file does not try it again.
    other = Wanted(hashlib.sha256(b"x").hexdigest(), "train-00001.bin", 1, "train shard 1")
    (mirror / "train-00001.bin").write_bytes(b"x")
    asyncio.run(fetcher.get(other))
    assert fetcher.counters.failed == 1


@pytest.fixture
def http_mirror(tmp_path: Path) -> Iterator[str]:
    root = tmp_path / "www"
    root.mkdir()
    (root / "train-00000.bin").write_bytes(SHARD)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_an_http_mirror_serves_and_a_missing_file_is_the_next_sources_turn(tmp_path: Path, http_mirror: str) -> None:
    members = Members({"m": holder(tmp_path, "m", SHARD)}, {"m": ["shards"]})
    fetcher = fetcher_for(tmp_path, members, (http_mirror,))
    assert asyncio.run(fetcher.get(WANTED)).read_bytes() == SHARD
    assert fetcher.counters.files["source"] == 1
    missing = Wanted(hashlib.sha256(b"nothing").hexdigest(), "absent.bin", 100, "the absent file")
    with pytest.raises(DataUnavailable, match=r"HTTP 404.*member m.*NOT_HOLDER|HTTP 404.*member m"):
        asyncio.run(fetcher.get(missing))


def test_nobody_holding_it_is_said_and_ensure_gives_up_at_its_deadline(tmp_path: Path) -> None:
    members = Members({}, {"x": ["dataset"]})
    fetcher = fetcher_for(tmp_path, members)
    with pytest.raises(DataUnavailable, match="cannot fetch train shard 0 .*member x"):
        asyncio.run(fetcher.ensure(WANTED, deadline_s=0.5))


def test_callers_of_one_file_share_one_fetch(tmp_path: Path) -> None:
    members = Members({"m": holder(tmp_path, "m", SHARD)}, {"m": ["dataset"]})
    fetcher = fetcher_for(tmp_path, members)

    async def both() -> list[Path]:
        return list(await asyncio.gather(fetcher.get(WANTED), fetcher.get(WANTED)))

    first, second = asyncio.run(both())
    assert first == second and members.asked == ["m", "m"]  # one fetch of two chunks


def test_the_server_sends_only_to_members_and_only_what_it_holds(tmp_path: Path) -> None:
    server = holder(tmp_path, "h", SHARD)
    request = FileFetch(run_id=RUN_ID, sha256=DIGEST, offset=MAX_CHUNK_BYTES, length=MAX_CHUNK_BYTES)
    answer, blobs = asyncio.run(server.handle("asker", request, []))
    assert answer.size == len(SHARD) and blobs[0] == SHARD[MAX_CHUNK_BYTES:]
    with pytest.raises(NotMember):
        asyncio.run(server.handle("stranger", request, []))
    other = FileFetch(run_id=RUN_ID, sha256="ab" * 32, offset=0, length=10)
    with pytest.raises(NotHolder):
        asyncio.run(server.handle("asker", other, []))
