"""Three daemons of one run see each other; a killed one is dropped; another run is never seen."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from swarmd.system.local_swarm import LOOPBACK_FLAGS, LocalDaemon, wait_for

from .conftest import alive
from .procfs import descendants

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


def test_three_daemons_membership_kill_and_foreign_run(
    workdir: Path, make_run: Callable[..., str], daemon_factory: Callable[..., LocalDaemon]
) -> None:
    run_id = make_run(workdir / "d0")
    other_run = make_run(workdir / "x0", name="other-run")
    assert run_id != other_run

    d0 = daemon_factory(workdir / "d0", run_id).start()
    bootstrap = d0.wait_running()["addrs"]
    d1 = daemon_factory(workdir / "d1", run_id).start(bootstrap)
    d2 = daemon_factory(workdir / "d2", run_id).start(bootstrap)
    # A daemon of another run in the very same DHT: it must never show up, nor see ours.
    x0 = daemon_factory(workdir / "x0", other_run).start(bootstrap)
    members = [d0, d1, d2]
    ids = {d: d.wait_running()["peer_id"] for d in members}
    foreign_id = x0.wait_running()["peer_id"]

    def everyone_sees_the_others() -> bool:
        seen = {d: d.seen_peers() for d in members}
        for d, peers in seen.items():
            assert foreign_id not in peers, f"{d.state_dir.name} sees a peer of another run"
        return all(seen[d] == {ids[o] for o in members if o is not d} for d in members)

    wait_for(everyone_sees_the_others, 60, "each daemon to see the other two")
    assert x0.seen_peers() == set()

    status = d0.status()
    assert status is not None and status["run"]["name"] == "tiny-bytes"
    for peer in status["peers"]:
        # --no-train: members that do not work advertise no role (they count for no stage share).
        assert peer["age_s"] < 8 and peer["device"]["kind"] == "cpu" and peer["roles"] == []
    # Identity key and control socket are for the owner only.
    assert stat.S_IMODE((workdir / "d0" / "identity.key").stat().st_mode) == 0o600
    assert stat.S_IMODE(d0.socket.stat().st_mode) == 0o600

    # SIGKILL d2: its DHT process and p2pd must die with it, and the others drop it on expiry.
    children = descendants(d2.pid)
    assert len(children) >= 2, f"expected the DHT process and p2pd under d2, found {children}"
    os.kill(d2.pid, signal.SIGKILL)
    killed_at = time.monotonic()
    d2.proc.wait(10)
    wait_for(lambda: not any(alive(pid) for pid in children), 15, "d2's DHT process and p2pd to exit")
    print(f"\nd2's {len(children)} descendants gone {time.monotonic() - killed_at:.2f} s after SIGKILL")
    wait_for(lambda: ids[d2] not in d0.seen_peers() | d1.seen_peers(), 40, "d0 and d1 to drop the killed d2")
    print(f"d2 dropped by d0 and d1 {time.monotonic() - killed_at:.1f} s after SIGKILL (heartbeat TTL 8 s)")
    wait_for(lambda: d0.seen_peers() == {ids[d1]}, 10, "d0 to still see d1")
    assert foreign_id not in d0.seen_peers() | d1.seen_peers()


def test_sigterm_announces_leaving_and_exits_cleanly(
    workdir: Path, make_run: Callable[..., str], daemon_factory: Callable[..., LocalDaemon]
) -> None:
    run_id = make_run(workdir / "d0")
    d0 = daemon_factory(workdir / "d0", run_id).start()
    # A 60 s TTL, as deployed: the leave must replace a heartbeat that is still valid for a minute.
    d1 = daemon_factory(workdir / "d1", run_id, ["--heartbeat-ttl", "60"]).start(d0.wait_running()["addrs"])
    d1_id = d1.wait_running()["peer_id"]
    wait_for(lambda: d1_id in d0.seen_peers(), 60, "d0 to see d1")
    children = descendants(d1.pid)

    # A second daemon on d1's state directory would fight over d1's identity: refused.
    twin = subprocess.run(
        [sys.executable, "-m", "swarmd", "run", "--run-id", run_id, "--state-dir", str(d1.state_dir), *LOOPBACK_FLAGS],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert twin.returncode == 1 and "another swarmd" in twin.stderr and "Traceback" not in twin.stderr

    stopped_at = time.monotonic()
    assert d1.stop(timeout=30) == 0, d1.log_tail()
    wait_for(lambda: not any(alive(pid) for pid in children), 5, "d1's DHT process and p2pd to exit")
    assert not d1.socket.exists(), "control socket left behind"
    # The leave announcement, not expiry (60 s), removes d1.
    wait_for(lambda: d1_id not in d0.seen_peers(), 20, "d0 to drop d1 after its leave announcement")
    print(f"d1 dropped by d0 {time.monotonic() - stopped_at:.1f} s after SIGTERM (heartbeat TTL 60 s)")


def test_second_signal_exits_at_once(
    workdir: Path, make_run: Callable[..., str], daemon_factory: Callable[..., LocalDaemon]
) -> None:
    run_id = make_run(workdir / "d0")
    d0 = daemon_factory(workdir / "d0", run_id).start()
    d0.wait_running()
    children = descendants(d0.pid)
    d0.proc.send_signal(signal.SIGINT)
    d0.proc.send_signal(signal.SIGINT)
    assert d0.proc.wait(15) in (0, 1)
    wait_for(lambda: not any(alive(pid) for pid in children), 15, "d0's children to exit")


def test_sigterm_while_joining_exits_zero(workdir: Path, daemon_factory: Callable[..., LocalDaemon]) -> None:
    # Nobody serves this run: the daemon keeps trying to join until told to stop.
    d0 = daemon_factory(workdir / "d0", "nobody.aaaaaaaaaaaaaaaaaaaaaaaa", ["--join-timeout", "120"]).start()
    wait_for(lambda: (d0.status() or {}).get("state") == "joining", 60, "d0 to be joining")
    assert d0.stop(timeout=30) == 0, d0.log_tail()
    assert "Traceback" not in d0.log_tail(200)
