"""daemon/relay.py: what a relay forwards and refuses, whom a host believes a request speaks
for, and how the router falls over between the direct path and a relay (the network is
replaced by a recorder here; tests/integration/test_relay_netns.py runs the real thing)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from swarmd import relay as relay_module
from swarmd.errors import SwarmdError
from swarmd.peers.wire.rpc import RpcError, Unreachable
from swarmd.relay import RELAY_METHOD, RelayService, Router, speaker_of

pytestmark = pytest.mark.timeout(30)


def test_only_a_relay_of_the_plan_may_speak_for_another_peer() -> None:
    relays = {"r"}.__contains__
    assert speaker_of("w", {"op": "claim"}, relays) == "w"
    assert speaker_of("r", {"on_behalf_of": "w"}, relays) == "w"
    with pytest.raises(SwarmdError, match="not a relay of the plan"):
        speaker_of("x", {"on_behalf_of": "w"}, relays)
    for bad in ("", 5, "w" * 200):
        with pytest.raises(SwarmdError, match="on_behalf_of"):
            speaker_of("r", {"on_behalf_of": bad}, relays)


class Recorder:
    """Stands in for ``stage_rpc.call``: records each request; peers in ``unreachable`` do not open."""

    def __init__(self, unreachable: set[str] = frozenset()) -> None:  # type: ignore[assignment]
        self.calls: list[tuple[str, str, dict[str, Any]]] = []
        self.unreachable = unreachable

    async def __call__(self, p2p: Any, peer: str, method: str, args: dict[str, Any], blobs: Any,
                       timeout_s: float = 30.0) -> tuple[dict[str, Any], list[bytes]]:  # fmt: skip
        self.calls.append((peer, method, dict(args)))
        if peer in self.unreachable:
            raise Unreachable(f"{method} to {peer}: cannot open a stream")
        return {"answered_by": peer, "for": args.get("on_behalf_of")}, [b"back"]


def service(monkeypatch: pytest.MonkeyPatch, recorder: Recorder, relay: bool = True) -> RelayService:
    monkeypatch.setattr(relay_module, "call", recorder)
    svc = RelayService("r", lambda peer: relay and peer == "r", lambda peer: peer in {"w", "h"})
    svc.p2p = object()
    return svc


def test_a_relay_forwards_stage_requests_for_the_asker(monkeypatch: pytest.MonkeyPatch) -> None:
    recorder = Recorder()
    svc = service(monkeypatch, recorder)
    header = {"method": RELAY_METHOD, "to": "h", "inner": "stage", "op": "claim", "stage": 1}
    answer, blobs = asyncio.run(svc.handle("w", header, [b"x" * 10]))
    assert answer == {"answered_by": "h", "for": "w"} and blobs == [b"back"]
    assert recorder.calls == [("h", "stage", {"op": "claim", "stage": 1, "on_behalf_of": "w"})]
    assert svc.counters.forwarded == 1 and svc.counters.forwarded_bytes == 14


@pytest.mark.parametrize(
    ("header", "why"),
    [
        ({"to": "h", "inner": "replicate"}, "does not forward method"),
        ({"to": "h", "inner": "stage", "on_behalf_of": "z"}, "relayed once"),
        ({"to": "nobody", "inner": "stage"}, "not a live member"),
        ({"to": "r", "inner": "stage"}, "the relay or the asker"),
        ({"to": "w", "inner": "stage"}, "the relay or the asker"),
        ({"inner": "stage"}, "to must be a peer ID"),
        ({"to": ["h"], "inner": "stage"}, "to must be a peer ID"),
    ],
)
def test_a_relay_refuses_what_it_must_not_forward(
    monkeypatch: pytest.MonkeyPatch, header: dict[str, Any], why: str
) -> None:
    recorder = Recorder()
    svc = service(monkeypatch, recorder)
    with pytest.raises(SwarmdError, match=why):
        asyncio.run(svc.handle("w", header, []))
    assert recorder.calls == [] and svc.counters.refused == 1


def test_a_peer_the_plan_does_not_name_relays_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    recorder = Recorder()
    svc = service(monkeypatch, recorder, relay=False)
    with pytest.raises(SwarmdError, match="not a relay of the plan"):
        asyncio.run(svc.handle("w", {"to": "h", "inner": "stage"}, []))
    assert recorder.calls == []


def test_a_relay_passes_the_targets_failure_back(monkeypatch: pytest.MonkeyPatch) -> None:
    svc = service(monkeypatch, Recorder(unreachable={"h"}))
    with pytest.raises(RpcError, match="cannot open"):
        asyncio.run(svc.handle("w", {"to": "h", "inner": "stage"}, []))
    assert svc.counters.failed == 1 and svc.counters.forwarded == 0


def route(monkeypatch: pytest.MonkeyPatch, recorder: Recorder, mode: str = "auto",
          relays: tuple[str, ...] = ("r",)) -> Router:  # fmt: skip
    monkeypatch.setattr(relay_module, "call", recorder)
    return Router("w", lambda: relays, lambda: None, mode=mode)


def send(router: Router) -> dict[str, Any]:
    return asyncio.run(router.call(object(), "h", "stage", {"op": "claim"}, [], 5.0))[0]


def test_the_router_goes_direct_and_falls_over_to_a_relay_when_the_host_cannot_be_reached(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    recorder = Recorder()
    router = route(monkeypatch, recorder)
    assert send(router)["answered_by"] == "h" and router.counters.direct == 1
    recorder.unreachable = {"h"}
    assert send(router)["answered_by"] == "r"  # direct failed to open: through the relay at once
    assert [c[:2] for c in recorder.calls[-2:]] == [("h", "stage"), ("r", RELAY_METHOD)]
    assert recorder.calls[-1][2] == {"op": "claim", "to": "h", "inner": "stage"}
    calls = len(recorder.calls)
    assert send(router)["answered_by"] == "r" and len(recorder.calls) == calls + 1  # no new dial while blocked
    assert router.counters.relayed == 2 and router.counters.direct_unreachable == 1


def test_the_router_goes_direct_when_the_relay_is_gone_and_never_relays_in_never_mode(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    recorder = Recorder(unreachable={"r"})
    router = route(monkeypatch, recorder, mode="always")
    assert send(router)["answered_by"] == "h"
    assert router.counters.relay_unreachable == 1 and router.counters.direct == 1
    recorder = Recorder(unreachable={"h"})
    router = route(monkeypatch, recorder, mode="never")
    with pytest.raises(Unreachable):
        send(router)
    assert [c[0] for c in recorder.calls] == ["h"]
    router = route(monkeypatch, Recorder(unreachable={"h"}), relays=())
    with pytest.raises(Unreachable):  # no relay elected: nothing else to try
        send(router)
