"""peers/wire/rpc.py under the owner's traffic caps (peers/wire/shaping.py): a request and its
answer are counted on both sides, paced chunk by chunk, and the time a peer waits for its own
cap does not count against its deadlines; over in-memory streams."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

import pytest

from swarmd.peers.wire import framing, rpc
from swarmd.peers.wire.protocol import Answer, Request
from swarmd.peers.wire.shaping import TrafficShaper
from tests.unit.peers.wire.memory_streams import MemoryNet
from tests.unit.peers.wire.test_shaping import ShaperClock

pytestmark = pytest.mark.timeout(60)

RUN = "demo.abcdefghijklmnopqrstuvwx"
MiB = 1024 * 1024


@dataclass(frozen=True, kw_only=True)
class PacedEchoed(Answer):
    BLOBS = (0, 1)


@dataclass(frozen=True, kw_only=True)
class PacedEcho(Request[PacedEchoed]):
    METHOD = "test.shaping.echo"
    BLOBS = (0, 1)


async def echo(sender: str, request: PacedEcho, blobs: list[bytes]) -> tuple[PacedEchoed, list[bytes]]:
    return PacedEchoed(), blobs


def server_with(shaper: TrafficShaper, **options: Any) -> rpc.RpcServer:
    server = rpc.RpcServer(run_id=RUN, shaper=shaper, **options)
    server.register(PacedEcho, echo)
    return server


async def exchange(server: rpc.RpcServer, client: TrafficShaper, blob: bytes, timeout_s: float = 10.0) -> rpc.Frame:
    """One echo from peer "w" to ``server``, the client's bytes through ``client``."""
    net = MemoryNet()
    net.servers["s"] = server
    header, blobs = PacedEcho(run_id=RUN).encode([blob])
    return await net.exchange("w", "s", header, blobs, timeout_s=timeout_s, shaper=client)


def fake_shaper(up_Bps: float = 0.0, down_Bps: float = 0.0) -> tuple[TrafficShaper, ShaperClock]:
    c = ShaperClock()
    shaper = TrafficShaper(clock=c.clock, wall=c.wall, sleep=c.sleep)
    shaper.configure(up_Bps, down_Bps)
    return shaper, c


def test_an_exchange_is_counted_alike_on_both_sides_and_paced_by_each_sides_cap() -> None:
    client, client_time = fake_shaper(up_Bps=MiB)
    served, server_time = fake_shaper(up_Bps=2 * MiB, down_Bps=MiB / 2)
    blob = bytes(range(256)) * (6 * MiB // 256)
    answer, out = asyncio.run(exchange(server_with(served), client, blob))
    assert answer["ok"] is True and out == [blob]

    header = json.dumps(PacedEcho(run_id=RUN).encode([blob])[0], separators=(",", ":")).encode()
    request_bytes = 8 + len(header) + 4 + len(blob)
    mine, theirs = client.status()["by_method"], served.status()["by_method"]
    assert mine["test.shaping.echo"]["sent"] == theirs["test.shaping.echo"]["received"] == request_bytes
    answer_bytes = mine["test.shaping.echo"]["received"]
    assert theirs["test.shaping.echo"]["sent"] == answer_bytes > len(blob)
    assert client.today()[1] == served.today()[1] == request_bytes + answer_bytes

    # Each side waited as its caps say, the bytes past a one-second burst at the rate: the
    # client sent 6 MiB at 1 MiB/s; the server read them at 0.5 MiB/s and answered at 2 MiB/s.
    assert client.status()["waited_s"] == {"sent": pytest.approx(5.0, abs=0.01), "received": 0.0}
    assert served.status()["waited_s"] == {"sent": pytest.approx(2.0, abs=0.01), "received": pytest.approx(10.0)}
    assert client_time.t - 100.0 == pytest.approx(5.0, abs=0.01)
    assert server_time.t - 100.0 == pytest.approx(12.0, abs=0.01)


@pytest.mark.parametrize("capped", ["client", "server"])
def test_a_peer_waiting_for_its_own_upload_cap_is_not_late(capped: str) -> None:
    """A deadline of 1 s (the client's for its request, or the server's for its answer)
    excludes the ~2 s that side's own cap holds the bytes back."""
    client, served = TrafficShaper(), TrafficShaper()
    (client if capped == "client" else served).configure(2 * MiB, 0)
    blob = b"\x01" * (6 * MiB)
    server = server_with(served, timeout_s=1.0 if capped == "server" else 10.0)
    answer, out = asyncio.run(exchange(server, client, blob, timeout_s=1.0 if capped == "client" else 10.0))
    assert answer["ok"] is True and out == [blob]
    assert server.counters.answered == 1  # its answer written in time, not cut off at the end
    assert (client if capped == "client" else served).status()["waited_s"]["sent"] > 1.0


def test_a_reader_waiting_for_its_own_download_cap_does_not_hold_it_against_the_sender(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The server's read of a blob: chunk k due k MiB at ``MIN_RATE_Bps`` (here 4 MiB/s) after
    ``due``, plus what our own cap (2 MiB/s after a 2 MiB burst) held it back. The last 2 MiB
    come at 0.9 s: late by the bare rule (chunk 3 due at 0.75 s), in time with the 0.5 s we
    waited for our cap before it (due at 1.25 s)."""
    monkeypatch.setattr(framing, "MIN_RATE_Bps", 4 * MiB)
    shaper = TrafficShaper()
    shaper.configure(0, 2 * MiB)

    async def read() -> tuple[bytes, float]:
        reader, loop = asyncio.StreamReader(), asyncio.get_running_loop()
        reader.feed_data(b"\x03" * (2 * MiB))
        loop.call_later(0.9, reader.feed_data, b"\x04" * (2 * MiB))
        async with asyncio.timeout(None) as deadline:
            return await framing.read_paced(reader, 4 * MiB, shaper, "x", deadline, loop.time())

    blob, waited_s = asyncio.run(read())
    assert blob == b"\x03" * (2 * MiB) + b"\x04" * (2 * MiB) and 0.5 <= waited_s < 1.0
    assert shaper.status()["by_method"]["x"]["received"] == 4 + 4 * MiB
