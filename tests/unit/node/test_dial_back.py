"""daemon/node/dial_back.py: which announced addresses a member may have us dial, and the dial
itself against a real listener on 127.0.0.1."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from swarmd.node.dial_back import (
    MULTISTREAM,
    PER_SENDER_INTERVAL_S,
    DialBackService,
    dial,
    dial_targets,
    own_scopes,
    scope,
    tcp_target,
)
from swarmd.peers.wire.errors import OverQuota
from swarmd.peers.wire.messages import MAX_DIAL_ADDRS

pytestmark = pytest.mark.timeout(20)


def test_only_direct_tcp_addresses_are_targets() -> None:
    assert tcp_target("/ip4/1.2.3.4/tcp/31337/p2p/12D3KooW") == ("1.2.3.4", 31337)
    assert tcp_target("/ip6/::1/tcp/4001") == ("::1", 4001)
    assert tcp_target("/ip4/1.2.3.4/udp/4001/quic") is None
    assert tcp_target("/ip4/1.2.3.4/tcp/4001/p2p/R/p2p-circuit/p2p/X") is None
    assert tcp_target("/dns4/example.org/tcp/4001") is None
    assert tcp_target("/ip4/1.2.3.4/tcp/0") is None


def test_a_member_cannot_have_us_probe_a_network_we_are_not_on() -> None:
    assert [scope(h) for h in ("127.0.0.1", "192.168.1.5", "10.0.0.1", "fe80::1", "8.8.8.8")] == [
        "loopback",
        "private",
        "private",
        "private",
        "public",
    ]
    announced = ["/ip4/192.168.1.1/tcp/80", "/ip4/127.0.0.1/tcp/22", "/ip4/8.8.8.8/tcp/4001"]
    assert [t[1] for t in dial_targets(announced, {"public"})] == ["8.8.8.8"]
    assert [t[1] for t in dial_targets(announced, own_scopes(["/ip4/127.0.0.1/tcp/5"]))] == ["127.0.0.1", "8.8.8.8"]
    many = [f"/ip4/8.8.8.{i}/tcp/4001" for i in range(10)] + ["/ip4/8.8.8.0/tcp/4001"]
    assert len(dial_targets(many, set())) == MAX_DIAL_ADDRS


async def _listener(greeting: bytes) -> tuple[asyncio.Server, int]:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readexactly(1 + len(MULTISTREAM))
        writer.write(greeting)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


def test_a_libp2p_greeting_is_reached_and_anything_else_is_not() -> None:
    async def play() -> list[tuple[bool, str]]:
        good, good_port = await _listener(bytes([len(MULTISTREAM)]) + MULTISTREAM)
        bad, bad_port = await _listener(b"SSH-2.0-OpenSSH_9.2\r\n")
        closed = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        closed_port = closed.sockets[0].getsockname()[1]
        closed.close()
        await closed.wait_closed()
        async with good, bad:
            return [await dial("127.0.0.1", p, 2.0) for p in (good_port, bad_port, closed_port)]

    (ok, _), (ssh, ssh_detail), (refused, refused_detail) = asyncio.run(play())
    assert ok and not ssh and not refused
    assert "not a libp2p host" in ssh_detail and "refused" in refused_detail


def test_the_service_dials_only_the_senders_heartbeat_and_at_most_every_interval() -> None:
    now = [1000.0]

    async def play() -> tuple[object, ...]:
        server, port = await _listener(bytes([len(MULTISTREAM)]) + MULTISTREAM)
        announced = {"member": [f"/ip4/127.0.0.1/tcp/{port}/p2p/member"]}
        service = DialBackService("run", announced.get, lambda: ["/ip4/127.0.0.1/tcp/1"], clock=lambda: now[0])
        request = SimpleNamespace()
        async with server:
            first, _ = await service.handle("member", request, [])  # type: ignore[arg-type]
            with pytest.raises(OverQuota, match="one dial-back every"):
                await service.handle("member", request, [])  # type: ignore[arg-type]
            now[0] += PER_SENDER_INTERVAL_S
            again, _ = await service.handle("member", request, [])  # type: ignore[arg-type]
            stranger, _ = await service.handle("nobody", request, [])  # type: ignore[arg-type]
        return first.reached, again.reached, stranger.addrs

    assert asyncio.run(play()) == ([1], [1], [])
