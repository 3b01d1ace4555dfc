"""The owner's traffic caps over a real loopback stream: achieved rates against the caps.

    .venv/bin/python tests/benchmarks/bench_traffic_cap.py [--caps-mbit 4,16,64,256] [--seconds 6]
        [--concurrent 3]

Each line is one request to an ``RpcServer`` over an asyncio TCP connection on 127.0.0.1,
the client's bytes through a ``TrafficShaper`` of its own (``swarmd.peers.wire.shaping``):

- ``up``: the request carries a blob of ``--seconds`` worth at the client's upload cap;
- ``down``: the answer carries as much, read under the client's download cap;
- ``up xN``: ``--concurrent`` such requests at once, sharing the upload cap.

A fresh bucket lets one burst (1 s at the cap, at least 1 MiB) go at once, so the bucket's
own prediction is printed beside the achieved rate: ``bytes / ((bytes - burst) / cap)``. The
``steady`` column leaves the burst out (``(bytes - burst) / time``): it should sit at the cap.
Figures only; nothing is asserted. The machine's other load shows in them.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from dataclasses import dataclass

from swarmd.peers.wire import rpc
from swarmd.peers.wire.protocol import Answer, Request, bound
from swarmd.peers.wire.shaping import MIN_BURST_BYTES, TrafficShaper, mbit_to_Bps

RUN = "bench-cap.abcdefghijklmnopqrstuvwx"
MiB = 1 << 20


@dataclass(frozen=True, kw_only=True)
class CapEchoed(Answer):
    BLOBS = (0, 1)


@dataclass(frozen=True, kw_only=True)
class CapEcho(Request[CapEchoed]):
    """Carries a blob up, asks for ``answer_bytes`` back."""

    METHOD = "bench.cap.echo"
    BLOBS = (0, 1)

    answer_bytes: int = bound(min_value=0, max_value=rpc.DEFAULT_MAX_MESSAGE_BYTES - 1024)


async def echo(sender: str, request: CapEcho, blobs: list[bytes]) -> tuple[CapEchoed, list[bytes]]:
    return CapEchoed(), [bytes(request.answer_bytes)] if request.answer_bytes else []


async def one(port: int, shaper: TrafficShaper, up_bytes: int, down_bytes: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=4 * MiB)
    header, blobs = CapEcho(run_id=RUN, answer_bytes=down_bytes).encode([bytes(up_bytes)] if up_bytes else [])
    try:
        answer, _ = await rpc.request_on(
            reader, writer, header, blobs, timeout_s=60, max_message_bytes=rpc.DEFAULT_MAX_MESSAGE_BYTES, shaper=shaper
        )
        assert answer.get("ok") is True, answer
    finally:
        writer.close()


async def measure(port: int, direction: str, cap_mbit: float, seconds: float, concurrent: int) -> str:
    cap_Bps = mbit_to_Bps(cap_mbit)
    shaper = TrafficShaper()
    shaper.configure(cap_Bps if direction == "up" else 0, cap_Bps if direction == "down" else 0)
    each = int(cap_Bps * seconds / concurrent)
    up, down = (each, 0) if direction == "up" else (0, each)
    started = time.perf_counter()
    await asyncio.gather(*(one(port, shaper, up, down) for _ in range(concurrent)))
    took = time.perf_counter() - started
    total = each * concurrent
    burst = max(cap_Bps, MIN_BURST_BYTES)
    predicted = total / max(1e-9, (total - burst) / cap_Bps)
    label = direction if concurrent == 1 else f"{direction} x{concurrent}"
    return (
        f"{label:<8} cap {cap_mbit:>7.1f} Mbit/s  {total / MiB:>7.1f} MiB in {took:6.2f} s: achieved "
        f"{total * 8 / took / 1e6:7.1f} Mbit/s (bucket predicts {predicted * 8 / 1e6:7.1f}), steady "
        f"{(total - burst) * 8 / took / 1e6:7.1f} Mbit/s"
    )


async def main(caps: list[float], seconds: float, concurrent: int) -> None:
    server = rpc.RpcServer(run_id=RUN, timeout_s=300, shaper=TrafficShaper())
    server.register(CapEcho, echo)
    listening = await asyncio.start_server(lambda r, w: server.serve("bench", r, w), "127.0.0.1", 0, limit=4 * MiB)
    port = listening.sockets[0].getsockname()[1]
    try:
        for cap in caps:
            for direction, n in (("up", 1), ("down", 1), ("up", concurrent)):
                print(await measure(port, direction, cap, seconds, n), flush=True)
    finally:
        listening.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--caps-mbit", default="4,16,64,256", help="caps to try, in Mbit/s")
    parser.add_argument("--seconds", type=float, default=6.0, help="how long each transfer takes at its cap")
    parser.add_argument("--concurrent", type=int, default=3, help="requests sharing the cap at once")
    args = parser.parse_args()
    asyncio.run(main([float(c) for c in args.caps_mbit.split(",")], args.seconds, args.concurrent))
