"""daemon/node/relay.py: what a relay forwards and refuses, whom the target believes a request speaks
for, and how the router falls over between the direct path and a relay (in-memory streams
through the real RPC servers here; tests/integration/test_relay_netns.py runs real libp2p)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from swarmd.node.relay import RelayService, Router
from swarmd.peers.wire import rpc
from swarmd.peers.wire.errors import (
    BadRequest,
    NotHolder,
    NotMember,
    NotRelay,
    Unavailable,
    Unreachable,
)
from swarmd.peers.wire.messages import CellForward, Forward, Probe, Probed
from swarmd.peers.wire.protocol import Ack
from tests.unit.peers.wire.memory_streams import MemoryNet

pytestmark = pytest.mark.timeout(30)

RUN = "demo.abcdefghijklmnopqrstuvwx"


def forward(**changes: Any) -> CellForward:
    fields: dict[str, Any] = {
        "run_id": RUN,
        "pipeline": 0,
        "stage": 1,
        "epoch": "e1",
        "share_id": 4,
        "share_first": 32,
        "share_count": 8,
        "round_end": False,
        "attempt": 1,
        "micro_batch": 33,
        "version": 2,
    }
    return CellForward(**{**fields, **changes})


class Swarm:
    """Peers w (asks), r (the relay of the plan) and h (the target), on a memory network."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, relay_in_plan: bool = True) -> None:
        self.net = MemoryNet()
        monkeypatch.setattr(rpc, "exchange", self.net.exchange)
        self.seen: list[tuple[str, Any]] = []
        self.refuse = False
        target = rpc.RpcServer(run_id=RUN, is_relay=lambda peer: peer == "r")
        target.register(CellForward, self.cell_forward)
        target.register(Probe, self.probe)
        self.relay = RelayService("r", lambda peer: relay_in_plan and peer == "r", lambda peer: peer in {"w", "h"})
        self.relay.p2p = "r"  # what the memory network takes as the sender
        relay_server = rpc.RpcServer(run_id=RUN)
        relay_server.register(Forward, self.relay.handle)
        self.net.servers.update(h=target, r=relay_server)

    async def cell_forward(self, sender: str, request: CellForward, blobs: list[bytes]) -> tuple[Ack, list[bytes]]:
        self.seen.append((sender, request))
        if self.refuse:
            raise NotHolder("cell (0, 1) is not held here")
        return Ack(), []

    async def probe(self, sender: str, request: Probe, blobs: list[bytes]) -> tuple[Probed, list[bytes]]:
        return Probed(bytes=len(blobs[0])), []

    def ask_relay(self, request: Any, blobs: list[bytes], to: str = "h") -> Any:
        header, _ = request.encode(blobs)
        return asyncio.run(rpc.call("w", "r", Forward(run_id=RUN, to=to, header=json.dumps(header)), blobs))


def test_a_relay_forwards_for_the_asker_and_the_target_believes_it(monkeypatch: pytest.MonkeyPatch) -> None:
    swarm = Swarm(monkeypatch)
    router = Router("w", lambda: ["r"], lambda: None, mode="always")
    answer, blobs = asyncio.run(router.call("w", "h", forward(), [b"x" * 10]))
    assert answer == Ack() and blobs == []
    assert swarm.seen == [("w", forward())]  # the target's handler sees the asker, not the relay
    assert [c[1:] for c in swarm.net.calls] == [("r", "relay.forward"), ("h", "relay.relayed")]
    assert swarm.relay.counters.forwarded == 1 and swarm.relay.counters.forwarded_bytes == 10
    assert router.counters.relayed == 1


def test_the_targets_refusal_comes_back_through_the_relay_as_the_targets(monkeypatch: pytest.MonkeyPatch) -> None:
    swarm = Swarm(monkeypatch)
    swarm.refuse = True
    router = Router("w", lambda: ["r"], lambda: None, mode="always")
    with pytest.raises(NotHolder) as caught:
        asyncio.run(router.call("w", "h", forward(), [b"x"]))
    assert caught.value.peer_id == "h" and caught.value.detail == "cell (0, 1) is not held here"


@pytest.mark.parametrize(
    ("request_", "to", "error", "why"),
    [
        (Probe(run_id=RUN), "h", BadRequest, "relays do not forward 'probe'"),
        (forward(), "nobody", NotMember, "not a live member"),
        (forward(), "r", BadRequest, "the relay or the asker"),
        (forward(), "w", BadRequest, "the relay or the asker"),
    ],
)
def test_a_relay_refuses_what_it_must_not_forward(
    monkeypatch: pytest.MonkeyPatch, request_: Any, to: str, error: type[Exception], why: str
) -> None:
    swarm = Swarm(monkeypatch)
    with pytest.raises(error, match=why) as caught:
        swarm.ask_relay(request_, [b"x"], to=to)
    assert caught.value.peer_id == "r"  # type: ignore[attr-defined]
    assert [c[1] for c in swarm.net.calls] == ["r"] and swarm.relay.counters.refused == 1


def test_a_relay_checks_the_inner_request_before_spending_bandwidth_on_it(monkeypatch: pytest.MonkeyPatch) -> None:
    swarm = Swarm(monkeypatch)
    header, _ = forward().encode([b"x"])
    for inner, blobs, why in (
        (dict(header, stage=5000), [b"x"], r"CellForward.stage = 5000"),
        (header, [], "blobs = 0"),
    ):
        request = Forward(run_id=RUN, to="h", header=json.dumps(inner))
        with pytest.raises(BadRequest, match=why):
            asyncio.run(rpc.call("w", "r", request, blobs))
    assert [c[1] for c in swarm.net.calls] == ["r", "r"]


def test_a_peer_the_plan_does_not_name_relays_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    swarm = Swarm(monkeypatch, relay_in_plan=False)
    with pytest.raises(NotRelay, match="not a relay of the plan"):
        swarm.ask_relay(forward(), [b"x"])
    swarm.relay.p2p = None
    with pytest.raises(Unavailable, match="not up yet"):
        swarm.ask_relay(forward(), [b"x"])


def test_a_relay_that_cannot_reach_the_target_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    swarm = Swarm(monkeypatch)
    swarm.net.unreachable = {"h"}
    with pytest.raises(Unavailable, match="could not reach h"):
        swarm.ask_relay(forward(), [b"x"])
    assert swarm.relay.counters.failed == 1 and swarm.relay.counters.forwarded == 0


def test_the_router_goes_direct_and_falls_over_to_a_relay_when_the_target_cannot_be_reached(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    swarm = Swarm(monkeypatch)
    router = Router("w", lambda: ["r"], lambda: None)
    asyncio.run(router.call("w", "h", forward(), [b"x"]))
    assert router.counters.direct == 1 and [c[1] for c in swarm.net.calls] == ["h"]
    swarm.net.unreachable = {"h"}
    with pytest.raises(Unavailable):  # direct fails to open; the relay cannot reach it either
        asyncio.run(router.call("w", "h", forward(), [b"x"]))
    swarm.net.unreachable = set()
    calls = len(swarm.net.calls)
    asyncio.run(router.call("w", "h", forward(), [b"x"]))  # blocked: through the relay, no new dial
    assert [c[1] for c in swarm.net.calls[calls:]] == ["r", "h"] and swarm.net.calls[-1][2] == "relay.relayed"
    assert router.counters.direct_unreachable == 1 and router.counters.relayed == 1


def test_the_router_goes_direct_when_the_relay_is_gone_and_never_relays_in_never_mode(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    swarm = Swarm(monkeypatch)
    swarm.net.unreachable = {"r"}
    router = Router("w", lambda: ["r"], lambda: None, mode="always")
    asyncio.run(router.call("w", "h", forward(), [b"x"]))
    assert router.counters.relay_unreachable == 1 and router.counters.direct == 1
    swarm.net.unreachable = {"h"}
    for router in (Router("w", lambda: ["r"], lambda: None, mode="never"), Router("w", lambda: (), lambda: None)):
        calls = len(swarm.net.calls)
        with pytest.raises(Unreachable):
            asyncio.run(router.call("w", "h", forward(), [b"x"]))
        assert [c[1] for c in swarm.net.calls[calls:]] == ["h"]  # nothing else to try


def test_the_router_reports_direct_transfers_only_for_passive_link_measurement(monkeypatch: pytest.MonkeyPatch) -> None:
    Swarm(monkeypatch)
    seen: list[tuple[str, str, int]] = []
    router = Router("w", lambda: ["r"], lambda: None)
    router.on_transfer = lambda peer, request, nbytes, seconds: seen.append((peer, type(request).__name__, nbytes))
    asyncio.run(router.call("w", "h", forward(), [b"x" * 1000]))
    assert seen == [("h", "CellForward", 1000)] and router.counters.direct == 1
    relayed = Router("w", lambda: ["r"], lambda: None, mode="always")
    relayed.on_transfer = router.on_transfer
    asyncio.run(relayed.call("w", "h", forward(), [b"x" * 1000]))
    assert len(seen) == 1 and relayed.counters.relayed == 1  # a relayed time says nothing of the direct link


def test_a_request_relays_do_not_pass_on_goes_direct_even_in_always_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    # A daemon told to relay everything still sends its probes (and its replication to the
    # standby) direct: a relay refuses them, and a standby that never gets a copy is no standby.
    swarm = Swarm(monkeypatch)
    router = Router("w", lambda: ["r"], lambda: None, mode="always")
    answer, _ = asyncio.run(router.call("w", "h", Probe(run_id=RUN), [b"x" * 100]))
    assert answer.bytes == 100 and [c[1] for c in swarm.net.calls] == ["h"] and router.counters.direct == 1
    swarm.net.unreachable = {"h"}
    with pytest.raises(Unreachable):  # no relay fallback either
        asyncio.run(router.call("w", "h", Probe(run_id=RUN), [b"x"]))
    assert [c[1] for c in swarm.net.calls] == ["h", "h"]
