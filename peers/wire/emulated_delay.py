"""Emulated one-way latency on the data path: a test-only shim for the calibration harness.

This kernel has no ``netem``, so the harness that compares real daemons with the simulator
(``tests/benchmarks/calibrate_simulator.py``) shapes bandwidth with ``tc tbf`` and adds
latency here instead. It is off unless the environment names a file in ``ENV_VAR``: a JSON
object from a remote peer's IPv4 address to the one-way latency towards it, in seconds. A
request to such a peer waits that long before it is written and again once its answer is
read (the way back), so a round trip costs twice the one-way figure, as on a real link.
Only the data path (``swarmd.peers.wire.rpc.call``) is delayed; the DHT is not.
"""

from __future__ import annotations

import ipaddress
import json
import os
from functools import cache
from pathlib import Path
from typing import Any

from swarmd.errors import SwarmdError

ENV_VAR = "SWARMD_EMULATED_DELAY_FILE"
MAX_DELAY_S = 5.0
MAX_FILE_BYTES = 1 << 20


def parse_delays(text: str, origin: str) -> dict[str, float]:
    """``{"10.0.0.2": 0.03, ...}`` checked: IPv4 keys, delays in [0, ``MAX_DELAY_S``]."""
    try:
        raw = json.loads(text)
    except ValueError as e:
        raise SwarmdError(f"{origin}: not JSON ({e})") from None
    if not isinstance(raw, dict):
        raise SwarmdError(f"{origin}: expected an object from IPv4 address to seconds, got {type(raw).__name__}")
    delays = {}
    for ip, seconds in raw.items():
        try:
            ipaddress.IPv4Address(ip)
        except ValueError:
            raise SwarmdError(f"{origin}: {ip!r} is not an IPv4 address") from None
        if type(seconds) not in (int, float) or not 0 <= seconds <= MAX_DELAY_S:
            raise SwarmdError(f"{origin}: delay to {ip} is {seconds!r}; expected seconds in [0, {MAX_DELAY_S:g}]")
        delays[ip] = float(seconds)
    return delays


@cache
def configured_delays() -> dict[str, float]:
    """The delays ``ENV_VAR`` names, read once per process; empty when it is unset."""
    path = os.environ.get(ENV_VAR)
    if not path:
        return {}
    try:
        with Path(path).open("rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError as e:
        raise SwarmdError(f"{ENV_VAR}={path}: cannot read it ({e.strerror})") from None
    if len(data) > MAX_FILE_BYTES:
        raise SwarmdError(f"{ENV_VAR}={path}: larger than {MAX_FILE_BYTES} bytes")
    return parse_delays(data.decode(errors="replace"), f"{ENV_VAR}={path}")


def one_way_delay_s(remote_addr: Any) -> float:
    """The emulated one-way latency to the peer at ``remote_addr`` (a multiaddr), 0 if none."""
    delays = configured_delays()
    if not delays or remote_addr is None:
        return 0.0
    try:
        ip = remote_addr.value_for_protocol("ip4")
    except Exception:  # not an IPv4 address (a relay circuit, IPv6): no emulation for it
        return 0.0
    return delays.get(str(ip), 0.0)
