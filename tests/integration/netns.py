"""What the tests that build their own network namespaces share."""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from swarmd.peers.wire.emulated_delay import ENV_VAR


def run_ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=10)


def need_root_and_iproute2() -> None:
    if not hasattr(os, "geteuid") or os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and iproute2 to create network namespaces")


def die_with_parent() -> None:
    # PR_SET_PDEATHSIG survives `ip netns exec`'s exec: a killed pytest leaves no helper behind.
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)


def stop(proc: subprocess.Popen) -> None:  # type: ignore[type-arg]
    """SIGTERM, then SIGKILL if it lingers; reaped either way."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def namespace_pids(ns: str) -> list[int]:
    out = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True, timeout=10)
    return [int(p) for p in out.stdout.split()] if out.returncode == 0 else []


class EmulatedNetwork:
    """Devices in their own network namespaces on one switch, each with emulated links.

    A hub namespace holds a bridge; device ``i`` lives in namespace ``<prefix>-d<i>`` at
    ``10.<net>.0.<i+1>/24`` on a veth pair whose two ends are each shaped with ``tc tbf``:
    the device's end at its upload rate, the hub's end at its download rate. The one-way
    latency between two devices is the sum of theirs (``access_latency_s``), applied by the
    data path's shim (``swarmd.peers.wire.emulated_delay``) from the file ``delay_file(i)`` names,
    because this kernel has no ``netem``. ``close`` kills every process still inside the
    namespaces and deletes them (with them every link); it runs on any exit of the ``with``.
    """

    def __init__(
        self,
        prefix: str,
        up_Bps: list[float],
        down_Bps: list[float],
        access_latency_s: list[float],
        workdir: Path,
        net: int = 213,
    ) -> None:
        assert len(up_Bps) == len(down_Bps) == len(access_latency_s)
        self.prefix, self.n, self.workdir, self.net = prefix, len(up_Bps), workdir, net
        self.up_Bps, self.down_Bps, self.access_latency_s = up_Bps, down_Bps, access_latency_s
        self.hub = f"{prefix}-hub"
        self.made: list[str] = []

    def ns(self, i: int) -> str:
        return f"{self.prefix}-d{i}"

    def ip(self, i: int) -> str:
        return f"10.{self.net}.0.{i + 1}"

    def delay_file(self, i: int) -> Path:
        return self.workdir / f"delays-d{i}.json"

    def one_way_latency_s(self, i: int, j: int) -> float:
        return self.access_latency_s[i] + self.access_latency_s[j]

    def __enter__(self) -> EmulatedNetwork:
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _build(self) -> None:
        for ns in [self.hub, *(self.ns(i) for i in range(self.n))]:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=10)  # a crashed run's leftovers
            run_ip("netns", "add", ns)
            self.made.append(ns)
            run_ip("-n", ns, "link", "set", "lo", "up")
        run_ip("-n", self.hub, "link", "add", "br0", "type", "bridge")
        run_ip("-n", self.hub, "link", "set", "br0", "up")
        for i in range(self.n):
            ns, hub_end = self.ns(i), f"h{i}"
            run_ip("-n", self.hub, "link", "add", hub_end, "type", "veth", "peer", "name", "eth0", "netns", ns)
            run_ip("-n", self.hub, "link", "set", hub_end, "master", "br0")
            run_ip("-n", self.hub, "link", "set", hub_end, "up")
            run_ip("-n", ns, "addr", "add", f"{self.ip(i)}/24", "dev", "eth0")
            run_ip("-n", ns, "link", "set", "eth0", "up")
            _shape(ns, "eth0", self.up_Bps[i])
            _shape(self.hub, hub_end, self.down_Bps[i])
            delays = {self.ip(j): self.one_way_latency_s(i, j) for j in range(self.n) if j != i}
            self.delay_file(i).write_text(json.dumps(delays))

    def prefix_for(self, i: int) -> list[str]:
        """The command prefix that runs a program as device ``i``: in its namespace, with its delays."""
        return ["ip", "netns", "exec", self.ns(i), "env", f"{ENV_VAR}={self.delay_file(i)}"]

    def close(self) -> None:
        for ns in reversed(self.made):
            for pid in namespace_pids(ns):
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=10)
        self.made.clear()

    def interface_bytes(self, i: int) -> tuple[int, int]:
        """Bytes device ``i`` has sent and received on its link so far (the kernel's counters)."""
        read = [
            "ip",
            "netns",
            "exec",
            self.ns(i),
            "cat",
            "/sys/class/net/eth0/statistics/tx_bytes",
            "/sys/class/net/eth0/statistics/rx_bytes",
        ]
        tx, rx = subprocess.run(read, check=True, capture_output=True, text=True, timeout=10).stdout.split()
        return int(tx), int(rx)

    def leftovers(self) -> list[str]:
        """Namespaces of this network that still exist (none after ``close``)."""
        out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=10).stdout
        names = {line.split()[0] for line in out.splitlines() if line.strip()}
        return sorted(n for n in names if n == self.hub or n.startswith(f"{self.prefix}-d"))


def _shape(ns: str, dev: str, rate_Bps: float) -> None:
    """``tbf`` at ``rate_Bps``, with a burst of a few packets and a queue of 50 ms at that rate.
    TCP fills whatever queue it is given (its own round trip here is well under a
    millisecond: the emulated latency is added above it), so a deeper queue would add its
    whole depth to every request behind a bulk transfer, a delay no scenario describes."""
    rate = f"{int(rate_Bps * 8)}bit"
    burst = max(16 * 1024, int(rate_Bps / 250))
    limit = max(64 * 1024, int(rate_Bps / 20))
    subprocess.run(
        [
            "ip",
            "netns",
            "exec",
            ns,
            "tc",
            "qdisc",
            "add",
            "dev",
            dev,
            "root",
            "tbf",
            "rate",
            rate,
            "burst",
            str(burst),
            "limit",
            str(limit),
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=10,
    )
