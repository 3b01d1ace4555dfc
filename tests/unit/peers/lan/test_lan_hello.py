"""LanDiscovery's hello exchange between two hosts on 127.0.0.1, with mDNS off.

mDNS itself is tested only inside network namespaces (tests/integration/test_lan_mdns.py):
it would multicast on this machine's real interfaces.
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable, Iterator

import pytest
from zeroconf import service_type_name

from swarmd.peers.lan.discovery import LanDiscovery
from swarmd.peers.lan.hello import LanDiscoveryError
from swarmd.peers.lan.mdns import mdns_service_type
from swarmd.peers.records.identity import Identity

WAIT_S = 10.0


class Hellos:
    """The hellos one LanDiscovery reported, with a wait on a condition (never a sleep)."""

    def __init__(self) -> None:
        self.received: list[tuple[str, bytes]] = []
        self._cond = threading.Condition()

    def __call__(self, peer_id: str, payload: bytes) -> None:
        with self._cond:
            self.received.append((peer_id, payload))
            self._cond.notify_all()

    def wait_for(self, peer_id: str, timeout: float = WAIT_S) -> bytes:
        with self._cond:
            ok = self._cond.wait_for(lambda: any(p == peer_id for p, _ in self.received), timeout)
            assert ok, f"no hello from {peer_id} in {timeout} s; got {self.received}"
            return next(payload for p, payload in self.received if p == peer_id)


Factory = Callable[..., tuple[LanDiscovery, Identity, Hellos]]


@pytest.fixture(autouse=True)
def collect_stopped_hosts() -> Iterator[None]:
    """A stopped py-libp2p host leaves its sockets in reference cycles. When the collector
    finalized them during a later test (when it ran depended on the tests before), that test's
    new connection died ("No valid connections available"): so they are collected here, at
    the end of the test that made them. A daemon makes its LAN host once, so it never meets this."""
    yield
    gc.collect()


@pytest.fixture
def make_lan() -> Iterator[Factory]:
    started: list[LanDiscovery] = []

    def make(
        get_hello: Callable[[], bytes] | None = None, max_hello_bytes: int = 16384
    ) -> tuple[LanDiscovery, Identity, Hellos]:
        identity = Identity.generate()
        hellos = Hellos()
        lan = LanDiscovery(
            identity,
            "test-run",
            "/ip4/127.0.0.1/tcp/0",
            get_hello=get_hello or (lambda: f"hello from {identity.peer_id}".encode()),
            on_hello=hellos,
            use_mdns=False,
            max_hello_bytes=max_hello_bytes,
        )
        lan.start(timeout=10)
        started.append(lan)
        return lan, identity, hellos

    yield make
    for lan in started:
        lan.stop(timeout=5)


@pytest.mark.timeout(30)
def test_hello_reaches_both_sides(make_lan: Factory) -> None:
    a, id_a, hellos_a = make_lan()
    b, id_b, hellos_b = make_lan()
    assert a.listen_maddrs[0].startswith("/ip4/127.0.0.1/tcp/")
    assert a.listen_maddrs[0].endswith(f"/p2p/{id_a.peer_id}")  # py-libp2p uses our key

    a.hello_peer(b.listen_maddrs[0])

    assert hellos_a.wait_for(id_b.peer_id) == f"hello from {id_b.peer_id}".encode()
    # b answered and, having learnt of a, said hello back.
    assert hellos_b.wait_for(id_a.peer_id) == f"hello from {id_a.peer_id}".encode()


@pytest.mark.timeout(30)
def test_oversized_hello_is_rejected(make_lan: Factory) -> None:
    a, _, hellos_a = make_lan(max_hello_bytes=1024)
    b, _, _ = make_lan(get_hello=lambda: b"x" * 2000, max_hello_bytes=4096)
    with pytest.raises(LanDiscoveryError, match="max_hello_bytes=1024"):
        a.hello_peer(b.listen_maddrs[0])
    assert hellos_a.received == []


@pytest.mark.timeout(30)
def test_callback_errors_do_not_kill_the_thread(make_lan: Factory) -> None:
    calls = []

    def flaky_hello() -> bytes:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("first hello breaks")
        return b"second"

    a, _, hellos_a = make_lan()
    b, id_b, _ = make_lan(get_hello=flaky_hello)
    with pytest.raises(LanDiscoveryError):
        a.hello_peer(b.listen_maddrs[0])
    a.hello_peer(b.listen_maddrs[0])
    assert hellos_a.wait_for(id_b.peer_id) == b"second"


@pytest.mark.timeout(30)
def test_on_hello_error_is_contained() -> None:
    def broken(peer_id: str, payload: bytes) -> None:
        raise ValueError("callee bug")

    ids = Identity.generate(), Identity.generate()
    a = LanDiscovery(ids[0], "r", "/ip4/127.0.0.1/tcp/0", lambda: b"a", broken, use_mdns=False)
    b = LanDiscovery(ids[1], "r", "/ip4/127.0.0.1/tcp/0", lambda: b"b", broken, use_mdns=False)
    a.start()
    b.start()
    try:
        a.hello_peer(b.listen_maddrs[0])  # on_hello raises; hello_peer still succeeds
        a.hello_peer(b.listen_maddrs[0])  # and the host still serves
    finally:
        a.stop()
        b.stop()


@pytest.mark.timeout(30)
def test_stop_is_bounded_and_idempotent() -> None:
    lan = LanDiscovery(Identity.generate(), "r", "/ip4/127.0.0.1/tcp/0", lambda: b"", lambda p, d: None)
    lan.stop()  # never started: nothing to do
    lan2 = LanDiscovery(
        Identity.generate(), "r", "/ip4/127.0.0.1/tcp/0", lambda: b"", lambda p, d: None, use_mdns=False
    )
    before = {t.ident for t in threading.enumerate()}
    lan2.start()
    ours = [t for t in threading.enumerate() if t.name == "swarmd-lan" and t.ident not in before]
    assert len(ours) == 1
    started = time.monotonic()
    lan2.stop(timeout=3)
    assert time.monotonic() - started < 3 + 1  # a bound on stop(), not a speed figure
    assert not ours[0].is_alive()
    lan2.stop(timeout=1)
    with pytest.raises(LanDiscoveryError, match="not running"):
        lan2.hello_peer("/ip4/127.0.0.1/tcp/1/p2p/12D3KooWBAB3DSLQa5pBTVnDtGzEqHamy4Bqwj3H9wkDXh4cz1VF")


@pytest.mark.timeout(30)
def test_unreachable_peer_fails_within_timeout(make_lan: Factory) -> None:
    a, _, _ = make_lan()
    peer = Identity.generate().peer_id
    with pytest.raises(LanDiscoveryError, match=peer):
        a.hello_peer(f"/ip4/127.0.0.1/tcp/1/p2p/{peer}", timeout=3)  # port 1: nobody listens


@pytest.mark.timeout(30)
def test_bad_addresses_are_reported(make_lan: Factory) -> None:
    with pytest.raises(LanDiscoveryError, match="not a multiaddr"):
        LanDiscovery(Identity.generate(), "r", "tcp://127.0.0.1:0", lambda: b"", lambda p, d: None)
    a, _, _ = make_lan()
    with pytest.raises(LanDiscoveryError, match="not a peer multiaddr"):
        a.hello_peer("/ip4/127.0.0.1/tcp/4001")  # no /p2p/<id>
    # 192.0.2.0/24 is TEST-NET-1: never an address of this machine, so listening must fail.
    lan = LanDiscovery(Identity.generate(), "r", "/ip4/192.0.2.1/tcp/0", lambda: b"", lambda p, d: None, use_mdns=False)
    with pytest.raises(LanDiscoveryError, match="failed to start"):
        lan.start(timeout=10)


def test_service_type_is_private_to_the_run_and_valid() -> None:
    service_type = mdns_service_type("test-run")
    assert service_type == mdns_service_type("test-run")
    assert service_type != mdns_service_type("other-run")
    assert service_type.startswith("_p2p-") and service_type.endswith("._udp.local.")
    assert len(service_type.split(".")[0].lstrip("_")) <= 15  # RFC 6763 service label limit
    assert service_type_name(service_type, strict=True) == service_type
