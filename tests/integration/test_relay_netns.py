"""A relay between two peers that cannot reach each other, over real libp2p in network namespaces.

Three namespaces made for the test: the asker's and the target's each share a veth pair with
the relay's, and the relay's namespace does not forward IP packets (a new namespace's
default). The asker and the target therefore have no route to each other, the way two
volunteers behind different firewalls do, while both reach the relay. The asker's router
(``swarmd.node.relay.Router``) first dials the target, finds it unreachable and goes through the
elected relay (``swarmd.node.relay.RelayService``); the target's RPC server believes the relay's
``on_behalf_of`` and its handler answers whom the request spoke for.
Deleting the namespaces at the end removes every link; every helper dies with the test.
"""

from __future__ import annotations

import json
import queue
import random
import secrets
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.netns import die_with_parent, need_root_and_iproute2, run_ip, stop

pytestmark = [pytest.mark.integration, pytest.mark.netns, pytest.mark.timeout(120)]

STEP_TIMEOUT_S = 60.0

HELPER = r"""
import asyncio, json, signal, sys
from dataclasses import dataclass
from hivemind.p2p import P2P
from swarmd.peers.wire.errors import RpcError
from swarmd.peers.wire.messages import Forward
from swarmd.peers.wire.protocol import Answer, Request, bound
from swarmd.peers.wire.rpc import RpcServer, call
from swarmd.node.relay import RelayService, Router

role, share = sys.argv[1], sys.argv[2:]
KW = dict(nat_port_map=False, auto_nat=False, use_relay=False)
RUN = "netns.abcdefghijklmnopqrstuvwx"

@dataclass(frozen=True, kw_only=True)
class Echoed(Answer):
    BLOBS = (0, 1)
    speaker: str = bound(max_len=128)
    bytes: int = bound(min_value=0, max_value=1 << 20)

@dataclass(frozen=True, kw_only=True)
class Echo(Request[Echoed]):
    METHOD = "test.echo"
    BLOBS = (0, 1)
    RELAYABLE = True

def emit(**event):
    print(json.dumps(event), flush=True)

async def until_terminated():
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()

async def target(ip, relay_id_file):
    p2p = await P2P.create(host_maddrs=[f"/ip4/{ip}/tcp/0"], **KW)
    def is_relay(peer):
        with open(relay_id_file) as f:
            return peer == f.read().strip()
    async def echo(sender, request, blobs):  # the server has resolved whom a relayed request speaks for
        return Echoed(speaker=sender, bytes=sum(map(len, blobs))), blobs
    server = RpcServer(run_id=RUN, is_relay=is_relay)
    server.register(Echo, echo)
    await server.attach(p2p)
    port = (await p2p.get_visible_maddrs())[0].value_for_protocol("tcp")
    emit(event="up", peer_id=str(p2p.peer_id), maddr=f"/ip4/{ip}/tcp/{port}/p2p/{p2p.peer_id}")
    await until_terminated()
    await p2p.shutdown()

async def relay(ip_a, ip_t, target_maddr, relay_id_file):
    p2p = await P2P.create(host_maddrs=[f"/ip4/{ip_a}/tcp/0", f"/ip4/{ip_t}/tcp/0"], initial_peers=[target_maddr], **KW)
    target_id = target_maddr.rsplit("/", 1)[1]
    service = RelayService(str(p2p.peer_id), lambda peer: True, lambda peer: peer == target_id, timeout_s=20)
    service.p2p = p2p
    server = RpcServer(run_id=RUN)
    server.register(Forward, service.handle)
    await server.attach(p2p)
    with open(relay_id_file, "w") as f:
        f.write(str(p2p.peer_id))
    port = next(m.value_for_protocol("tcp") for m in await p2p.get_visible_maddrs() if ip_a in str(m))
    emit(event="up", peer_id=str(p2p.peer_id), maddr=f"/ip4/{ip_a}/tcp/{port}/p2p/{p2p.peer_id}")
    await until_terminated()
    emit(event="counters", **service.status())
    await p2p.shutdown()

async def asker(ip, relay_maddr, target_id):
    p2p = await P2P.create(host_maddrs=[f"/ip4/{ip}/tcp/0"], initial_peers=[relay_maddr], **KW)
    relay_id = relay_maddr.rsplit("/", 1)[1]
    router = Router(str(p2p.peer_id), lambda: [relay_id], lambda: None, mode="auto")
    out = {"peer_id": str(p2p.peer_id)}
    payload = bytes(range(256)) * 64
    answer, blobs = await router.call(p2p, target_id, Echo(run_id=RUN), [payload], 10.0)
    out["first"] = {"speaker": answer.speaker, "bytes": answer.bytes, "echoed": blobs == [payload]}
    answer, _ = await router.call(p2p, target_id, Echo(run_id=RUN), [], 10.0)
    out["second"] = {"speaker": answer.speaker}
    try:  # a request that is itself a relayed one is refused by the relay: a request is relayed once
        inner = {"method": "relay.relayed", "run_id": RUN, "on_behalf_of": "x", "header": "{}"}
        await call(p2p, relay_id, Forward(run_id=RUN, to=target_id, header=json.dumps(inner)))
        out["spoofed"] = "no error"
    except RpcError as e:
        out["spoofed"] = str(e)
    out["routes"] = router.status()
    emit(event="done", **out)
    await p2p.shutdown()

asyncio.run({"target": target, "relay": relay, "asker": asker}[role](*share))
"""


@pytest.fixture
def split_network() -> Iterator[dict[str, str]]:
    """Namespaces a, r and t; veth pairs a-r and r-t; r forwards nothing. Yields their names
    and addresses."""
    need_root_and_iproute2()
    tag = secrets.token_hex(3)
    ns = {k: f"swarmd-t-{tag}-{k}" for k in "art"}
    left, right = f"10.232.{random.randint(1, 254)}", f"10.233.{random.randint(1, 254)}"
    created: list[str] = []
    try:
        for name in ns.values():
            try:
                run_ip("netns", "add", name)
            except subprocess.CalledProcessError as e:
                pytest.skip(f"cannot create network namespace {name}: {e.stderr.strip()}")
            created.append(name)
            run_ip("-n", name, "link", "set", "lo", "up")
        # Both ends are created inside the namespaces: the host's own namespace never sees them.
        run_ip("-n", ns["a"], "link", "add", "veth-a", "type", "veth", "peer", "name", "veth-ra", "netns", ns["r"])
        run_ip("-n", ns["t"], "link", "add", "veth-t", "type", "veth", "peer", "name", "veth-rt", "netns", ns["r"])
        for name, dev, ip in (
            (ns["a"], "veth-a", f"{left}.1"),
            (ns["r"], "veth-ra", f"{left}.2"),
            (ns["r"], "veth-rt", f"{right}.2"),
            (ns["t"], "veth-t", f"{right}.1"),
        ):
            run_ip("-n", name, "addr", "add", f"{ip}/24", "dev", dev)
            run_ip("-n", name, "link", "set", dev, "up")
        # Routes exist both ways through r, so a dial is not refused locally: it goes to r, and
        # r, which forwards nothing, drops it (as a firewall between two volunteers would).
        run_ip("-n", ns["a"], "route", "add", f"{right}.0/24", "via", f"{left}.2")
        run_ip("-n", ns["t"], "route", "add", f"{left}.0/24", "via", f"{right}.2")
        subprocess.run(
            ["ip", "netns", "exec", ns["r"], "sysctl", "-q", "-w", "net.ipv4.ip_forward=0"],
            check=True,
            capture_output=True,
            timeout=10,
        )
        yield {**ns, "ip_a": f"{left}.1", "ip_ra": f"{left}.2", "ip_rt": f"{right}.2", "ip_t": f"{right}.1"}
    finally:
        for name in created:
            subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=10)


class Helper:
    def __init__(self, role: str, netns: str, args: list[str], script: Path) -> None:
        self.role = role
        self.stderr_path = script.parent / f"{role}.stderr"
        self.events: queue.Queue[dict[str, Any]] = queue.Queue()
        with open(self.stderr_path, "wb") as stderr:
            self.proc = subprocess.Popen(
                ["ip", "netns", "exec", netns, sys.executable, str(script), role, *args],
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
                preexec_fn=die_with_parent,
            )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                self.events.put(json.loads(line))
            except json.JSONDecodeError:
                self.events.put({"event": "garbage", "line": line})
        self.events.put({"event": "exited"})

    def wait(self, event: str) -> dict[str, Any]:
        deadline = time.monotonic() + STEP_TIMEOUT_S
        while True:
            try:
                got = self.events.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                pytest.fail(f"{self.role}: no {event!r} within {STEP_TIMEOUT_S:.0f} s\n{self.describe()}")
            if got["event"] == event:
                return got
            if got["event"] in ("exited", "garbage"):
                pytest.fail(f"{self.role} {got['event']} before {event!r}\n{self.describe()}")

    def stop(self) -> None:
        stop(self.proc)

    def describe(self) -> str:
        tail = self.stderr_path.read_text(errors="replace")[-3000:] if self.stderr_path.exists() else ""
        return f"--- {self.role} (rc={self.proc.poll()})\n{tail}"


def test_a_request_reaches_an_unreachable_peer_through_the_relay(split_network: dict[str, str], tmp_path: Path) -> None:
    net = split_network
    script = tmp_path / "relay_helper.py"
    script.write_text(HELPER)
    relay_id_file = tmp_path / "relay_id"
    relay_id_file.write_text("")
    helpers: list[Helper] = []
    try:
        target = Helper("target", net["t"], [net["ip_t"], str(relay_id_file)], script)
        helpers.append(target)
        target_up = target.wait("up")
        relay = Helper("relay", net["r"], [net["ip_ra"], net["ip_rt"], target_up["maddr"], str(relay_id_file)], script)
        helpers.append(relay)
        relay_up = relay.wait("up")
        asker = Helper("asker", net["a"], [net["ip_a"], relay_up["maddr"], target_up["peer_id"]], script)
        helpers.append(asker)
        done = asker.wait("done")

        # The target answered a request that spoke for the asker, with the tensor bytes intact.
        assert done["first"]["speaker"] == done["peer_id"] and done["first"]["echoed"], done
        assert done["first"]["bytes"] == 256 * 64
        assert done["second"]["speaker"] == done["peer_id"], done
        routes = done["routes"]
        # One failed dial, then both requests through the relay (the second without re-dialling).
        assert routes["direct_unreachable"] == 1 and routes["relayed"] == 2 and routes["direct"] == 0, routes
        assert routes["direct_blocked_peers"] == 1
        assert "relays do not forward 'relay.relayed'" in done["spoofed"], done
        relay.stop()
        counters = relay.wait("counters")
        assert counters["forwarded"] == 2 and counters["refused"] == 1, counters
        assert counters["forwarded_bytes"] >= 2 * 256 * 64
    finally:
        for helper in helpers:
            helper.stop()
