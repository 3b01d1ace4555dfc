"""The largest value a bare hivemind DHT carries through its process pipes, and what breaks above it.

    .venv/bin/python tests/benchmarks/bench_dht_values.py [--max-kib 1024] [--probe-timeout 30]

hivemind runs its DHT node in a forked process and talks to it over two pipes: the caller's
thread writes each request (``get``, ``store``, ``run_coroutine``, with its arguments pickled)
to ``DHT._outer_pipe``; the DHT process answers through ``MPFuture``'s pipe back to the
caller's process. Each probe runs in a fresh interpreter with a fresh, bare DHT (no validator,
no peers) and moves a value of N bytes one of three ways:

- ``in``: into the DHT process, as the argument of ``run_coroutine`` (the request pipe alone);
- ``out``: out of the DHT process, as ``run_coroutine``'s result (the answer pipe alone);
- ``store+get``: ``store`` a value of N bytes under a key, then ``get`` it back.

For each way it doubles N from 1 KiB until a probe fails, then bisects to the KiB between the
largest size that round-trips and the smallest that does not, and prints what the failing
probe's DHT process wrote to stderr (hivemind logs the traceback there) and whether the DHT
process was still alive. A probe "fails" when the value does not come back equal within
``--probe-timeout`` seconds, or the DHT process dies. Then it tries ``--swarmd-sizes-kib``
each way through ``swarmd.peers.dht.process.TiedDHT``, which reads each request whole and
answers on a pipe of its own (``TiedDHT.ask``). Figures only; nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

KiB = 1024

# Runs in its own interpreter: a probe that kills the DHT (or wedges the caller in a pipe
# write) must not take the benchmark with it.
PROBE = r"""
import asyncio, functools, json, sys, threading, time
import hivemind
from hivemind.utils.timed_storage import get_dht_time

way, size, timeout, variant = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
if variant == "swarmd":
    from swarmd.peers.dht.process import TiedDHT
    make_dht = functools.partial(TiedDHT, child_init=None)
else:
    make_dht = hivemind.DHT

async def echo_len(value, dht, node):
    return len(value)

async def make(n, dht, node):
    return b"y" * n

dht = make_dht(start=True, host_maddrs=["/ip4/127.0.0.1/tcp/0"], nat_port_map=False, auto_nat=False,
                   use_relay=False, shutdown_timeout=2)
value = b"x" * size
outcome = {}

async def store(key, value, expires, dht, node):
    return await node.store(key, value, expires)

async def get(key, dht, node):
    return await node.get(key, latest=True)

def run(coro):  # hivemind's way (an MPFuture), or TiedDHT's (an answer tagged by request)
    if variant == "swarmd":
        return asyncio.run(asyncio.wait_for(dht.ask(coro), timeout))
    return dht.run_coroutine(coro, return_future=True).result(timeout)

def call():
    try:
        if way == "in":
            found = run(functools.partial(echo_len, value))
            outcome["ok"] = found == size
        elif way == "out":
            found = run(functools.partial(make, size))
            outcome["ok"] = found == b"y" * size
        else:
            stored = run(functools.partial(store, "bench", value, get_dht_time() + 60))
            found = run(functools.partial(get, "bench"))
            outcome["ok"] = bool(stored) and found is not None and found.value == value
    except BaseException as e:
        outcome["error"] = repr(e)[:300]

# The call runs in a thread: a pipe write that never returns is an outcome, not a hang.
started = time.perf_counter()
worker = threading.Thread(target=call, daemon=True)
worker.start()
worker.join(timeout + 5)
outcome["seconds"] = round(time.perf_counter() - started, 3)
if worker.is_alive():
    outcome["error"] = "the caller's thread is still blocked (in a pipe write or waiting for the answer)"
time.sleep(1.0)  # sync-ok: let a dying DHT process finish dying before we look
outcome["dht_alive"] = dht.is_alive()
print(json.dumps(outcome), flush=True)
if dht.is_alive():
    import os, signal
    os.kill(dht.pid, signal.SIGKILL)
import os
os._exit(0)
"""


def probe(way: str, size: int, timeout: float, variant: str = "hivemind") -> dict[str, object]:
    """One probe in a fresh interpreter: its outcome, with the DHT process's stderr."""
    try:
        out = subprocess.run(
            [sys.executable, "-c", PROBE, way, str(size), str(timeout), variant],
            capture_output=True,
            text=True,
            timeout=timeout + 60,
        )
    except subprocess.TimeoutExpired as e:
        return {"ok": False, "error": "the probe process hung", "stderr": str(e.stderr or "")[-4000:]}
    lines = out.stdout.strip().splitlines()
    try:
        result: dict[str, object] = json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        result = {"ok": False, "error": f"the probe process exited {out.returncode} without an outcome"}
    result["stderr"] = out.stderr[-4000:]
    result["ok"] = bool(result.get("ok")) and bool(result.get("dht_alive"))
    return result


def largest(way: str, max_size: int, timeout: float) -> tuple[int, int | None, dict[str, object] | None]:
    """(largest size that round-trips, smallest that fails or None, the failing probe's outcome)."""
    good, bad, failure, size = 0, None, None, KiB
    while size <= max_size:
        result = probe(way, size, timeout)
        print(f"  {way:10s} {size / KiB:8.1f} KiB: {'ok' if result['ok'] else 'FAILS'} ({result.get('seconds')} s)")
        if not result["ok"]:
            bad, failure = size, result
            break
        good, size = size, size * 2
    if bad is None:
        return good, None, None
    while bad - good > KiB:
        mid = (good + bad) // 2 // KiB * KiB or good + KiB
        if mid in (good, bad):
            break
        result = probe(way, mid, timeout)
        print(f"  {way:10s} {mid / KiB:8.1f} KiB: {'ok' if result['ok'] else 'FAILS'} ({result.get('seconds')} s)")
        if result["ok"]:
            good = mid
        else:
            bad, failure = mid, result
    return good, bad, failure


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-kib", type=int, default=1024, help="the largest value to try, in KiB")
    parser.add_argument("--probe-timeout", type=float, default=30.0, help="seconds one probe may take")
    parser.add_argument("--ways", default="in,out,store+get", help="which of in, out, store+get to probe")
    parser.add_argument(
        "--swarmd-sizes-kib",
        default="16,65,256,1024",
        help="sizes to try through swarmd's TiedDHT (whole-message reads) after the search; empty: none",
    )
    args = parser.parse_args()
    started = time.perf_counter()
    ways = args.ways.split(",")
    summary = []
    for way in ways:
        print(f"{way}:")
        good, bad, failure = largest(way, args.max_kib * KiB, args.probe_timeout)
        if bad is None:
            summary.append(f"{way:10s} every size up to {good / KiB:.0f} KiB round-trips")
            continue
        summary.append(f"{way:10s} round-trips {good} B ({good / KiB:.1f} KiB); fails at {bad} B ({bad / KiB:.1f} KiB)")
        assert failure is not None
        print(
            f"  failing probe at {bad} B: {failure.get('error', 'value came back wrong')}; "
            f"DHT process alive afterwards: {failure.get('dht_alive')}"
        )
        print("  its stderr (tail):")
        for line in str(failure.get("stderr", "")).splitlines()[-40:]:
            print("    " + line)
    for kib in [int(k) for k in args.swarmd_sizes_kib.split(",") if k]:
        for way in ways:
            result = probe(way, kib * KiB, args.probe_timeout, variant="swarmd")
            summary.append(
                f"{way:10s} {kib} KiB through swarmd's TiedDHT: {'ok' if result['ok'] else 'FAILS'} "
                f"({result.get('seconds')} s{'; ' + str(result['error']) if 'error' in result else ''})"
            )
    print("\nsummary:")
    for line in summary:
        print("  " + line)
    print(f"({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
