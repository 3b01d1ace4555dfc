"""What the tests that build their own network namespaces share."""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import subprocess

import pytest


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
