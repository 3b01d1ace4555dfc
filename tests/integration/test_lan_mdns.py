"""mDNS LAN discovery between real processes, inside network namespaces made for the test.

mDNS multicasts on every interface it joins, so this test never runs it on the machine's own
network: two namespaces joined by a veth pair (10.231.<r>.1 and .2) are the whole LAN, and
deleting them at the end removes the link and everything on it.
"""

from __future__ import annotations

import json
import os
import queue
import random
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.netns import die_with_parent, need_root_and_iproute2, run_ip, stop

pytestmark = [pytest.mark.integration, pytest.mark.netns]

RUN_ID = "test-run"
OTHER_RUN_ID = "other-run"
DISCOVERY_TIMEOUT_S = 30.0

# Runs in a namespace: one LanDiscovery, one JSON line on stdout per event.
HELPER = """
import json, logging, signal, sys, threading
from swarmd.peers.records.identity import Identity
from swarmd.peers.lan.discovery import LanDiscovery

ip, run_id = sys.argv[1], sys.argv[2]
logging.basicConfig(level=logging.DEBUG, stream=sys.stderr,
                    format="%(asctime)s %(threadName)s %(name)s %(levelname)s %(message)s")
for noisy in ("libp2p", "multiaddr", "zeroconf"):
    logging.getLogger(noisy).setLevel(logging.WARNING)
lock = threading.Lock()

def emit(**event):
    with lock:
        print(json.dumps(event), flush=True)

identity = Identity.generate()
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: stop.set())
disco = LanDiscovery(
    identity, run_id, f"/ip4/{ip}/tcp/0",
    get_hello=lambda: f"hello from {identity.peer_id}".encode(),
    on_hello=lambda peer_id, payload: emit(event="hello", peer_id=peer_id, payload=payload.decode()),
)
disco.start()
# start() returns after zeroconf registered the service, i.e. sent its announcements.
emit(event="advertised", peer_id=identity.peer_id, maddrs=disco.listen_maddrs)
stop.wait()
disco.stop()
emit(event="stopped")
"""


class Helper:
    """One helper process and the events it printed, read by a thread into a shared queue."""

    def __init__(self, name: str, netns: str, ip: str, run_id: str, script: Path, events: queue.Queue) -> None:
        self.name = name
        self.stderr_path = script.parent / f"{name}.stderr"
        self.events: list[dict[str, Any]] = []
        with open(self.stderr_path, "wb") as stderr:
            self.proc = subprocess.Popen(
                ["ip", "netns", "exec", netns, sys.executable, str(script), ip, run_id],
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
                preexec_fn=die_with_parent,
            )
        self._reader = threading.Thread(target=self._read, args=(events,), daemon=True)
        self._reader.start()

    def _read(self, events: queue.Queue) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                events.put((self, json.loads(line)))
            except json.JSONDecodeError:
                events.put((self, {"event": "garbage", "line": line}))
        events.put((self, {"event": "exited"}))

    @property
    def peer_id(self) -> str | None:
        return next((e["peer_id"] for e in self.events if e["event"] == "advertised"), None)

    def hellos(self) -> dict[str, str]:
        return {e["peer_id"]: e["payload"] for e in self.events if e["event"] == "hello"}

    def stop(self) -> None:
        stop(self.proc)

    def describe(self) -> str:
        tail = self.stderr_path.read_text(errors="replace")[-3000:] if self.stderr_path.exists() else ""
        return f"--- {self.name} (rc={self.proc.poll()}) events={self.events}\n{tail}"


@pytest.fixture
def lan(tmp_path: Path) -> Iterator[tuple[str, str, str, str]]:
    """Two namespaces joined by a veth pair: yields (ns_a, ip_a, ns_b, ip_b)."""
    need_root_and_iproute2()
    tag = secrets.token_hex(3)
    ns_a, ns_b = f"swarmd-t-{tag}-a", f"swarmd-t-{tag}-b"
    subnet = f"10.231.{random.randint(1, 254)}"
    created: list[str] = []
    try:
        for ns in (ns_a, ns_b):
            try:
                run_ip("netns", "add", ns)
            except subprocess.CalledProcessError as e:
                pytest.skip(f"cannot create network namespace {ns}: {e.stderr.strip()}")
            created.append(ns)
        # Both ends are created inside the namespaces: the host's own namespace never sees them.
        run_ip("-n", ns_a, "link", "add", "veth-a", "type", "veth", "peer", "name", "veth-b", "netns", ns_b)
        for ns, dev, ip in ((ns_a, "veth-a", f"{subnet}.1"), (ns_b, "veth-b", f"{subnet}.2")):
            run_ip("-n", ns, "addr", "add", f"{ip}/24", "dev", dev)
            run_ip("-n", ns, "link", "set", "lo", "up")
            run_ip("-n", ns, "link", "set", dev, "up")
            # Without a route for 224.0.0.0/4 (no default route here) multicast sends fail.
            run_ip("-n", ns, "route", "add", "224.0.0.0/4", "dev", dev)
        yield ns_a, f"{subnet}.1", ns_b, f"{subnet}.2"
    finally:
        for ns in created:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=10)


def _wait_until(
    events: queue.Queue, condition: Callable[[], bool], timeout: float, helpers: list[Helper], what: str
) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            pytest.fail(
                f"timed out after {timeout:.0f} s waiting for {what}\n" + "\n".join(h.describe() for h in helpers)
            )
        try:
            helper, event = events.get(timeout=remaining)
        except queue.Empty:
            continue
        helper.events.append(event)
        if event["event"] in ("exited", "garbage"):
            pytest.fail(f"helper {helper.name} {event['event']} early\n" + "\n".join(h.describe() for h in helpers))


@pytest.mark.timeout(90)
def test_mdns_discovery_same_run_only(lan: tuple[str, str, str, str], tmp_path: Path) -> None:
    ns_a, ip_a, ns_b, ip_b = lan
    script = tmp_path / "lan_helper.py"
    script.write_text(HELPER)
    events: queue.Queue = queue.Queue()
    helpers: list[Helper] = []
    try:
        # Another run on the same link: c next to b, and d next to a, so that c's and d's
        # finding each other proves the other run's mDNS traffic reached a's namespace.
        for name, ns, ip, run_id in (
            ("a", ns_a, ip_a, RUN_ID),
            ("b", ns_b, ip_b, RUN_ID),
            ("c", ns_b, ip_b, OTHER_RUN_ID),
            ("d", ns_a, ip_a, OTHER_RUN_ID),
        ):
            helpers.append(Helper(name, ns, ip, run_id, script, events))  # listed at once for teardown
        a, b, c, d = helpers

        def met(x: Helper, y: Helper) -> bool:
            return (
                x.peer_id is not None
                and y.peer_id is not None
                and x.hellos().get(y.peer_id) == f"hello from {y.peer_id}"
                and y.hellos().get(x.peer_id) == f"hello from {x.peer_id}"
            )

        _wait_until(events, lambda: met(a, b), DISCOVERY_TIMEOUT_S, helpers, "a and b to say hello")
        _wait_until(events, lambda: met(c, d), DISCOVERY_TIMEOUT_S, helpers, "c and d (the other run) to say hello")

        # Whatever else arrived by now is in the queue: drain it without waiting.
        while not events.empty():
            helper, event = events.get_nowait()
            helper.events.append(event)
        assert set(a.hellos()) == {b.peer_id}, a.describe()
        assert set(b.hellos()) == {a.peer_id}, b.describe()
        assert set(c.hellos()) == {d.peer_id}, c.describe()
        assert set(d.hellos()) == {c.peer_id}, d.describe()
        assert all(h.peer_id for h in helpers)
        assert a.peer_id != b.peer_id
        for h, ip in ((a, ip_a), (b, ip_b)):
            advertised = next(e for e in h.events if e["event"] == "advertised")
            assert advertised["maddrs"][0].startswith(f"/ip4/{ip}/tcp/"), advertised
    finally:
        for h in helpers:
            h.stop()


@pytest.mark.timeout(150)
def test_daemons_on_one_lan_find_each_other_without_bootstrap(
    lan: tuple[str, str, str, str], make_run: Callable[..., str], workdir: Path
) -> None:
    """Two real daemons, one in each namespace, same run, no --initial-peers: mDNS brings them
    together, and the joiner fetches the run's spec through the DHT it was introduced to."""
    from swarmd.system.local_swarm import LocalDaemon, wait_for

    ns_a, ip_a, ns_b, ip_b = lan
    run_id = make_run(workdir / "a")
    daemons = []
    try:
        for name, ns, ip in (("a", ns_a, ip_a), ("b", ns_b, ip_b)):
            network = [
                "--host-maddrs",
                f"/ip4/{ip}/tcp/0",
                "--lan-maddr",
                f"/ip4/{ip}/tcp/0",
                "--no-nat-port-map",
            ]
            daemons.append(
                LocalDaemon(
                    workdir / name,
                    run_id,
                    [
                        "--heartbeat-interval",
                        "1",
                        "--heartbeat-ttl",
                        "8",
                        "--no-benchmark",
                        "--no-train",
                        "--join-timeout",
                        "60",
                    ],
                    network_args=network,
                    command_prefix=["ip", "netns", "exec", ns],
                ).start()
            )
        a, b = daemons
        id_a, id_b = a.wait_running()["peer_id"], b.wait_running()["peer_id"]
        wait_for(lambda: a.seen_peers() == {id_b} and b.seen_peers() == {id_a}, 60, "a and b to see each other")
        status = b.status()
        assert status is not None and status["run"]["name"] == "tiny-bytes"
        assert status["lan_addrs"][0].startswith(f"/ip4/{ip_b}/tcp/")
        # One key, one ID: the py-libp2p host and the DHT's p2pd both carry the peer's own ID.
        assert status["lan_addrs"][0].endswith(f"/p2p/{id_b}") and status["addrs"][0].endswith(f"/p2p/{id_b}")
    finally:
        for d in daemons:
            d.stop(timeout=20)


@pytest.mark.timeout(180)
def test_lan_discovery_child_is_restarted(
    lan: tuple[str, str, str, str], make_run: Callable[..., str], workdir: Path
) -> None:
    """LAN discovery is a child process: if it dies, the daemon carries on and starts a new one."""
    from swarmd.system.local_swarm import LocalDaemon, wait_for

    from .procfs import descendants

    ns_a, ip_a, _, _ = lan
    run_id = make_run(workdir / "a")
    network = ["--host-maddrs", f"/ip4/{ip_a}/tcp/0", "--lan-maddr", f"/ip4/{ip_a}/tcp/0", "--no-nat-port-map"]
    a = LocalDaemon(
        workdir / "a",
        run_id,
        ["--no-benchmark", "--no-train"],
        network_args=network,
        command_prefix=["ip", "netns", "exec", ns_a],
    )
    try:
        a.start()
        before = a.wait_running()["lan_addrs"]

        def lan_children() -> list[int]:
            found = []
            for pid in descendants(a.pid):
                try:
                    if b"swarmd.node.lan_process" in Path(f"/proc/{pid}/cmdline").read_bytes():
                        found.append(pid)
                except OSError:
                    pass
            return found

        (child,) = wait_for(lan_children, 10, "the LAN discovery child")
        os.kill(child, signal.SIGKILL)
        wait_for(lambda: [p for p in lan_children() if p != child], 40, "a new LAN discovery child")
        after = wait_for(  # 20 s ran out once in CI, with both cores loaded by the other worker
            lambda: (a.status() or {}).get("lan_addrs") != before and a.status()["lan_addrs"],
            60,
            "the new child's addresses in status",
        )
        assert after[0].startswith(f"/ip4/{ip_a}/tcp/")
        assert a.status()["state"] == "running"
    finally:
        assert a.stop(timeout=20) == 0, a.log_tail()
