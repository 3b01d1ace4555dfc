"""The calibration harness's network: namespaces on a bridge, tbf-shaped links, latency files,
and nothing left behind, also when the code inside the ``with`` fails."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from swarmd.system.local_swarm import wait_for
from tests.integration.netns import EmulatedNetwork, namespace_pids, need_root_and_iproute2

pytestmark = [pytest.mark.integration, pytest.mark.netns, pytest.mark.timeout(60)]

ECHO_SERVER = """
import socket, sys
server = socket.create_server((sys.argv[1], 9000))
print("listening", flush=True)
conn, _ = server.accept()
conn.sendall(conn.recv(64))
"""
ECHO_CLIENT = """
import socket, sys
with socket.create_connection((sys.argv[1], 9000), timeout=10) as conn:
    conn.sendall(b"hello")
    print(conn.recv(64).decode())
"""


def test_devices_reach_each_other_on_shaped_links_and_everything_goes_on_failure(tmp_path: Path) -> None:
    need_root_and_iproute2()
    net = EmulatedNetwork(f"swt{os.getpid()}", [1e6, 2e6], [3e6, 4e6], [0.01, 0.02], tmp_path, net=214)
    sleeper = None
    with pytest.raises(RuntimeError, match="the harness failed here"), net:
        echo = subprocess.Popen(
            [*net.prefix_for(1), sys.executable, "-c", ECHO_SERVER, net.ip(1)], stdout=subprocess.PIPE, text=True
        )
        assert echo.stdout is not None and echo.stdout.readline().strip() == "listening"
        client = subprocess.run(
            [*net.prefix_for(0), sys.executable, "-c", ECHO_CLIENT, net.ip(1)],
            capture_output=True,
            text=True,
            timeout=20,
        )
        assert client.stdout.strip() == "hello", client.stderr
        echo.wait(10)
        shaped = subprocess.run(
            ["ip", "netns", "exec", net.ns(0), "tc", "qdisc", "show", "dev", "eth0"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout
        assert "tbf" in shaped and "rate 8Mbit" in shaped, shaped  # device 0 uploads at 1 MB/s
        assert json.loads(net.delay_file(0).read_text()) == {net.ip(1): pytest.approx(0.03)}
        sent, received = net.interface_bytes(0)
        assert sent > 0 and received > 0  # the greeting went out and came back
        sleeper = subprocess.Popen([*net.prefix_for(1), "sleep", "600"])
        # Inside the namespace before the failure: ``ip netns exec`` enters it after it starts,
        # and a close that lists the namespace's processes before then cannot kill it.
        wait_for(lambda: sleeper.pid in namespace_pids(net.ns(1)), 10, "the sleeper in device 1's namespace", 0.05)
        raise RuntimeError("the harness failed here")
    assert net.leftovers() == []
    assert sleeper is not None and sleeper.wait(10) != 0  # killed with its namespace


@pytest.mark.timeout(120)
def test_the_harness_measures_the_daemons_data_path_on_a_shaped_link_with_its_latency(tmp_path: Path) -> None:
    """What the calibration gives the simulator as the links: the data path's goodput stays
    under the shaper's rate, and a request's round trip carries the emulated latency both ways."""
    need_root_and_iproute2()
    from tests.benchmarks.calibration.measure import measure_data_path

    rate = 2e6
    net = EmulatedNetwork(f"swp{os.getpid()}", [rate, rate], [rate, rate], [0.01, 0.01], tmp_path, net=215)
    with net:
        measured = measure_data_path(net, int(rate * 2))
    assert 0 < measured.goodput_Bps <= rate * 1.05, measured
    assert measured.idle_rtt_s >= 2 * net.one_way_latency_s(0, 1), measured
    assert measured.loaded_rtt_s > 0 and measured.connection_queue_s >= 0, measured
    assert net.leftovers() == []
