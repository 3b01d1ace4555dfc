"""daemon/node/dial_back.py: which hosts a member may have us dial (only the one it is seen at,
only a public one unless the run is explicitly local), how often, and the dial itself against a
real listener on 127.0.0.1."""

from __future__ import annotations

import asyncio
import ipaddress
from types import SimpleNamespace
from typing import Any

import pytest

from swarmd.node.dial_back import (
    MAX_REMEMBERED,
    MULTISTREAM,
    PER_HOST_INTERVAL_S,
    PER_SENDER_INTERVAL_S,
    PUBLIC,
    DialBackService,
    RecentDials,
    Scope,
    dial,
    dial_targets,
    embedded_ipv4,
    host_of,
    local_scopes,
    scope,
    tcp_target,
)
from swarmd.peers.wire import rpc
from swarmd.peers.wire.errors import Busy, OverQuota
from swarmd.peers.wire.messages import MAX_DIAL_ADDRS, DialedBack

pytestmark = pytest.mark.timeout(20)

TEREDO_LOOPBACK = "2001:0:4136:e378:8000:63bf:80ff:fffe"
"""Teredo, server 65.54.227.120, client 127.0.0.1 (stored inverted: 80ff:fffe)."""
TEREDO_PUBLIC = "2001:0:4136:e378:8000:63bf:f7f7:f7f7"
"""Teredo, client 8.8.8.8."""

SCOPES = [
    ("8.8.8.8", "public"),
    ("2001:4860:4860::8888", "public"),
    ("127.0.0.1", "loopback"),
    ("127.8.9.10", "loopback"),
    ("::1", "loopback"),
    ("0.0.0.0", "special"),
    ("::", "special"),
    ("169.254.169.254", "link-local"),
    ("169.254.1.1", "link-local"),
    ("fe80::1", "link-local"),
    ("10.0.0.1", "private"),
    ("172.16.5.4", "private"),
    ("192.168.1.5", "private"),
    ("100.64.0.1", "private"),
    ("100.127.255.254", "private"),
    ("fd00::1", "private"),
    ("fec0::1", "private"),
    ("224.0.0.1", "special"),
    ("ff02::1", "special"),
    ("240.0.0.1", "special"),
    ("255.255.255.255", "special"),
    ("192.0.2.1", "special"),
    ("198.51.100.7", "special"),
    ("203.0.113.9", "special"),
    ("2001:db8::1", "special"),
    ("198.18.0.1", "special"),
    ("0.1.2.3", "special"),
    ("::ffff:127.0.0.1", "loopback"),
    ("::ffff:10.1.2.3", "private"),
    ("::ffff:169.254.169.254", "link-local"),
    ("::ffff:0.0.0.0", "special"),
    ("::ffff:8.8.8.8", "public"),
    ("64:ff9b::7f00:1", "loopback"),
    ("64:ff9b::a9fe:a9fe", "link-local"),
    ("64:ff9b::c0a8:105", "private"),
    ("64:ff9b::808:808", "public"),
    ("64:ff9b:1:7f00:0:100::", "loopback"),
    ("64:ff9b:1:a00:0:100::", "private"),
    ("2002:7f00:1::1", "loopback"),
    ("2002:a9fe:a9fe::1", "link-local"),
    ("2002:808:808::1", "public"),
    (TEREDO_LOOPBACK, "loopback"),
    (TEREDO_PUBLIC, "public"),
]


@pytest.mark.parametrize(("host", "where"), SCOPES)
def test_every_form_of_an_address_has_the_scope_of_the_host_it_leads_to(host: str, where: str) -> None:
    assert scope(host) == where


def test_an_ipv6_form_of_an_ipv4_address_is_unwrapped() -> None:
    forms = ["::ffff:127.0.0.1", "64:ff9b::7f00:1", "64:ff9b:1:7f00:0:100::", "2002:7f00:1::1", TEREDO_LOOPBACK]
    assert {str(embedded_ipv4(ipaddress.IPv6Address(f))) for f in forms} == {"127.0.0.1"}
    assert embedded_ipv4(ipaddress.IPv6Address("2001:4860:4860::8888")) is None


def test_only_direct_tcp_addresses_are_targets() -> None:
    assert tcp_target("/ip4/1.2.3.4/tcp/31337/p2p/12D3KooW") == ("1.2.3.4", 31337)
    assert tcp_target("/ip6/::1/tcp/4001") == ("::1", 4001)
    assert tcp_target("/ip4/1.2.3.4/udp/4001/quic") is None
    assert tcp_target("/ip4/1.2.3.4/tcp/4001/p2p/R/p2p-circuit/p2p/X") is None
    assert tcp_target("/dns4/example.org/tcp/4001") is None
    assert tcp_target("/ip4/1.2.3.4/tcp/0") is None
    assert str(host_of("/ip4/1.2.3.4/udp/4001/quic-v1")) == "1.2.3.4"
    assert str(host_of("/ip6/::ffff:1.2.3.4/tcp/4001")) == "1.2.3.4"  # seen mapped: its IPv4
    assert host_of("/ip4/5.6.7.8/tcp/4001/p2p/R/p2p-circuit") is None  # the relay's host, not the peer's
    assert host_of("/dns4/example.org/tcp/4001") is None


def _dialled(announced: list[str], seen: str | None, allowed: frozenset[Scope] = PUBLIC) -> list[tuple[str, int]]:
    dial, _ = dial_targets(announced, seen, allowed)
    return [(host, port) for _, host, port in dial]


def test_only_the_host_a_member_is_seen_at_is_dialled_on_its_announced_ports() -> None:
    announced = [
        "/ip4/8.8.8.8/tcp/31337/p2p/member",
        "/ip4/9.9.9.9/tcp/31337",  # a third party: never
        "/ip4/127.0.0.1/tcp/22",
        "/ip4/8.8.8.8/tcp/31337",  # the same target twice: once
        "/ip4/8.8.8.8/tcp/4001",
    ]
    seen = "/ip4/8.8.8.8/tcp/53117"  # the member's ephemeral port: not dialled
    assert _dialled(announced, seen) == [("8.8.8.8", 31337), ("8.8.8.8", 4001)]
    dial, skipped = dial_targets(announced, seen, PUBLIC)
    assert [why for _, why in skipped] == ["not dialled: you are seen at 8.8.8.8, not there"] * 2
    assert _dialled(["/ip6/2001:4860:4860::8888/tcp/31337"], "/ip6/2001:4860:4860:0:0:0:0:8888/tcp/9") == [
        ("2001:4860:4860::8888", 31337)
    ]
    assert _dialled(["/ip4/8.8.8.8/tcp/31337"], "/ip6/::ffff:8.8.8.8/tcp/9") == [("8.8.8.8", 31337)]
    assert _dialled(["/ip4/8.8.4.4/tcp/31337"], "/ip4/8.8.8.8/udp/9/quic-v1") == []


@pytest.mark.parametrize(("host", "where"), [(h, w) for h, w in SCOPES if w != "public"])
def test_a_public_run_never_dials_a_host_that_is_not_public_even_where_it_is_seen(host: str, where: str) -> None:
    proto = "ip6" if ":" in host else "ip4"
    announced, seen = [f"/{proto}/{host}/tcp/31337"], f"/{proto}/{host}/tcp/50000"
    assert _dialled(announced, seen) == []
    _, skipped = dial_targets(announced, seen, PUBLIC)
    assert skipped and skipped[0][1].startswith("not dialled")


@pytest.mark.parametrize("host", ["::ffff:8.8.8.8", "64:ff9b::808:808", "2002:808:808::1", TEREDO_PUBLIC])
def test_an_ipv6_form_of_an_ipv4_address_is_never_dialled(host: str) -> None:
    everything: frozenset[Scope] = frozenset({"public", "private", "loopback", "link-local"})
    assert _dialled([f"/ip6/{host}/tcp/31337"], f"/ip6/{host}/tcp/50000", everything) == []


def test_a_run_is_local_only_when_it_listens_on_explicit_non_public_ips_alone() -> None:
    assert local_scopes(["/ip4/127.0.0.1/tcp/0"]) == {"loopback"}
    assert local_scopes(["/ip4/192.168.1.5/tcp/1", "/ip6/::1/tcp/1", "/ip4/100.64.0.7/udp/1/quic-v1"]) == {
        "private",
        "loopback",
    }
    for public in (
        ["/ip4/0.0.0.0/tcp/31337"],  # the default: the internet's connections come in on it
        ["/ip6/::/tcp/31337"],
        ["/ip4/127.0.0.1/tcp/0", "/ip4/0.0.0.0/udp/31337/quic-v1"],
        ["/ip4/127.0.0.1/tcp/0", "/ip4/8.8.8.8/tcp/1"],
        ["/dns4/localhost/tcp/1"],
        ["/ip4/224.0.0.1/tcp/1"],
    ):
        assert local_scopes(public) == frozenset(), public


def test_a_local_run_dials_the_seen_host_in_the_scopes_it_listens_in_and_no_other() -> None:
    loopback = PUBLIC | local_scopes(["/ip4/127.0.0.1/tcp/0"])
    announced = ["/ip4/127.0.0.1/tcp/4001", "/ip4/192.168.1.7/tcp/4001", "/ip4/169.254.169.254/tcp/80"]
    assert _dialled(announced, "/ip4/127.0.0.1/tcp/50000", loopback) == [("127.0.0.1", 4001)]
    assert _dialled(announced, "/ip4/192.168.1.7/tcp/50000", loopback) == []  # seen, but not our scope
    assert _dialled(announced, "/ip4/169.254.169.254/tcp/50000", loopback) == []
    lan = PUBLIC | local_scopes(["/ip4/192.168.1.5/tcp/0"])
    assert _dialled(announced, "/ip4/192.168.1.7/tcp/50000", lan) == [("192.168.1.7", 4001)]
    assert _dialled(announced, "/ip4/127.0.0.1/tcp/50000", lan) == []


def test_a_relayed_or_unknown_member_is_told_so_and_nothing_is_dialled() -> None:
    announced = ["/ip4/8.8.8.8/tcp/31337"]
    relayed = "/ip4/8.8.8.8/tcp/4001/p2p/12D3KooWRelay/p2p-circuit"
    for seen, why in ((relayed, "came through a relay"), (None, "not known here")):
        dial, skipped = dial_targets(announced, seen, PUBLIC)
        assert dial == [] and skipped[0][0] == announced[0] and why in skipped[0][1]
    dial, skipped = dial_targets([], relayed, PUBLIC)
    assert dial == [] and skipped == [(relayed, skipped[0][1])] and "relay" in skipped[0][1]


def test_at_most_max_dial_addrs_are_dialled_and_refusals_do_not_crowd_them_out() -> None:
    others = [f"/ip4/9.9.9.{i}/tcp/4001" for i in range(10)]
    mine = [f"/ip4/8.8.8.8/tcp/{4000 + i}" for i in range(10)]
    dial, skipped = dial_targets(others + mine, "/ip4/8.8.8.8/tcp/9", PUBLIC)
    assert len(dial) == MAX_DIAL_ADDRS and skipped == []
    dial, skipped = dial_targets(others + mine[:1], "/ip4/8.8.8.8/tcp/9", PUBLIC)
    assert len(dial) == 1 and len(skipped) == MAX_DIAL_ADDRS - 1


def test_recent_dials_are_bounded_and_refuse_when_full_rather_than_forget() -> None:
    recent = RecentDials(30.0, limit=2)
    assert recent.take("a", 0.0) is None and recent.take("b", 1.0) is None
    assert recent.take("a", 10.0) == 10.0  # refused, nothing recorded
    with pytest.raises(Busy, match="2 dial-backs in the last 30 s"):
        recent.take("c", 20.0)
    assert recent.take("c", 30.0) is None and len(recent) == 2  # a expired; b remains
    assert recent.take("a", 31.0) is None and len(recent) == 2
    assert MAX_REMEMBERED >= 256


async def _listener(greeting: bytes, connections: list[int] | None = None) -> tuple[asyncio.Server, int]:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if connections is not None:
            connections.append(1)
        await reader.readexactly(1 + len(MULTISTREAM))
        writer.write(greeting)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


LIBP2P = bytes([len(MULTISTREAM)]) + MULTISTREAM


def test_a_libp2p_greeting_is_reached_and_anything_else_is_not() -> None:
    async def play() -> list[tuple[bool, str]]:
        good, good_port = await _listener(LIBP2P)
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


def _service(announced: dict[str, list[str]], seen: dict[str, str], listen_on: list[str], now: list[float]) -> Any:
    return DialBackService("run", announced.get, seen.get, listen_on, clock=lambda: now[0])


async def _ask(service: DialBackService, sender: str) -> DialedBack:
    answer, _ = await service.handle(sender, SimpleNamespace(), [])  # type: ignore[arg-type]
    return answer


def test_a_local_run_dials_its_member_back_once_an_interval_a_sender_and_a_host() -> None:
    now = [1000.0]

    async def play() -> dict[str, Any]:
        connections: list[int] = []
        server, port = await _listener(LIBP2P, connections)
        addrs = [f"/ip4/127.0.0.1/tcp/{port}/p2p/x"]
        announced = {"a": addrs, "b": addrs, "c": addrs}
        seen = {p: "/ip4/127.0.0.1/tcp/50000" for p in announced}
        service = _service(announced, seen, ["/ip4/127.0.0.1/tcp/0"], now)
        out: dict[str, Any] = {}
        async with server:
            out["first"] = await _ask(service, "a")
            with pytest.raises(OverQuota, match="one dial-back every 30 s"):
                await _ask(service, "a")
            out["same host"] = await _ask(service, "b")  # another key on the same host: not dialled
            now[0] += max(PER_SENDER_INTERVAL_S, PER_HOST_INTERVAL_S)
            out["later"] = await _ask(service, "c")
            out["stranger"] = await _ask(service, "nobody")
        out["connections"] = len(connections)
        return out

    out = asyncio.run(play())
    assert out["first"].reached == [1] and out["later"].reached == [1]
    assert out["same host"].reached == [0] and "this host was dialled back 0 s ago" in out["same host"].details[0]
    assert out["stranger"].reached == [0] and "not known here" in out["stranger"].details[0]
    assert out["connections"] == 2


def test_a_public_run_does_not_knock_on_its_own_loopback_for_anyone() -> None:
    now = [1000.0]

    async def play() -> tuple[DialedBack, DialedBack, int]:
        connections: list[int] = []
        server, port = await _listener(LIBP2P, connections)
        announced = {"m": [f"/ip4/127.0.0.1/tcp/{port}"], "r": [f"/ip4/127.0.0.1/tcp/{port}"]}
        seen = {"m": "/ip4/127.0.0.1/tcp/50000", "r": "/ip4/8.8.8.8/tcp/1/p2p/Relay/p2p-circuit"}
        service = _service(announced, seen, ["/ip4/0.0.0.0/tcp/31337"], now)
        async with server:
            loopback, relayed = await _ask(service, "m"), await _ask(service, "r")
        return loopback, relayed, len(connections)

    loopback, relayed, connections = asyncio.run(play())
    assert connections == 0
    assert loopback.reached == [0] and "a loopback address" in loopback.details[0]
    assert relayed.reached == [0] and "through a relay" in relayed.details[0]


def test_the_rpc_server_remembers_where_each_speaker_was_last_seen_within_bounds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(rpc, "MAX_SEEN", 3)
    server = rpc.RpcServer()
    served: list[str] = []

    async def serve(peer: str, reader: Any, writer: Any) -> None:
        served.append(peer)

    monkeypatch.setattr(server, "serve", serve)

    async def play() -> None:
        for peer, addr in [("a", "/ip4/8.8.8.8/tcp/1"), ("b", "/ip4/9.9.9.9/tcp/2"), ("a", "/ip4/8.8.4.4/tcp/3")]:
            await server._serve_p2p(SimpleNamespace(peer_id=peer, addr=addr), None, None)  # type: ignore[arg-type]
        for peer in ("c", "d"):
            await server._serve_p2p(SimpleNamespace(peer_id=peer, addr=f"/ip4/1.1.1.1/tcp/{ord(peer)}"), None, None)  # type: ignore[arg-type]

    asyncio.run(play())
    assert served == ["a", "b", "a", "c", "d"]
    assert server.seen_at("a") == "/ip4/8.8.4.4/tcp/3"  # the latest stream; refreshed, so b went first
    assert server.seen_at("b") is None and server.seen_at("d") == "/ip4/1.1.1.1/tcp/100"
