"""Throughput of the wire: the tensor codecs, and the data path's requests against raw TCP.

    .venv/bin/python tests/benchmarks/bench_wire.py [--elements 10000000] [--repeats 5]
        [--threads 1] [--sizes-mib 0.0625,1,16,64] [--no-p2p]

Part 1, codecs: encode and decode of a tensor of ``--elements`` fp32 values in each codec
(``swarmd.peers.wire.codecs``), as GB/s of fp32 values, with the bytes each frame takes and
int8's error feedback beside it. Every frame is checked as a peer's would be (codec, shape,
length, finite values). One torch thread by default, as a daemon's codec work runs beside its
compute: on a loaded machine, more threads than free cores make every op wait for the
slowest (measured here: 10-30x slower with two threads on two busy cores).

Part 2, requests: bytes per second of one request carrying one tensor frame of each size,
sent one at a time, each on a stream of its own, answered once the server holds all of it
(the fastest of the repeats, as for the codecs):

- ``raw TCP``: a loopback socket per transfer, written and read with ``sendall`` and
  ``recv_into`` in threads, one byte back: what the machine's loopback can do;
- ``swarmd framing, TCP``: a ``CellForward`` to an ``RpcServer`` over an asyncio connection
  per request on loopback: the framing, bounds, schema check and dispatch of
  ``swarmd.peers.wire.rpc`` on the same kind of socket;
- ``swarmd over p2pd``: the same request between two hivemind P2P instances (go-libp2p's
  daemons, TCP and yamux between them), the daemons' own data path (``--no-p2p`` skips it).

The handler acknowledges without decoding (part 1 prices the decode). Figures only; nothing
is asserted. The machine's other load shows in them: run it alone for numbers to compare.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import threading
import time
from collections.abc import Awaitable, Callable

import torch

from swarmd.peers.wire import rpc
from swarmd.peers.wire.codecs import ErrorFeedback, FrameSpec, decode_tensor, encode_tensor
from swarmd.peers.wire.messages import CellForward
from swarmd.peers.wire.protocol import Ack
from swarmd.peers.wire.sizes import CODECS

RUN = "bench-wire.abcdefghijklmnopqrstuvwx"
MiB = 1 << 20


def timed(fn: Callable[[], object], repeats: int) -> float:
    """The fastest of ``repeats`` runs of ``fn`` (after one to warm up), in seconds: the
    machine's other load can only slow a run down, so the fastest is the code's own figure."""
    fn()
    runs = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - started)
    return min(runs)


def bench_codecs(elements: int, repeats: int) -> None:
    torch.manual_seed(0)
    x = torch.randn(elements)
    spec = FrameSpec((elements,))
    gb = elements * 4 / 1e9
    threads = torch.get_num_threads()
    print(f"codecs: {elements:,} fp32 values ({gb * 1e3:.0f} MB), best of {repeats}, {threads} torch thread(s)")
    print(f"{'codec':<14}{'frame MB':>10}{'encode s':>10}{'GB/s':>8}{'decode s':>10}{'GB/s':>8}")
    for codec in CODECS:
        frame = encode_tensor(x, codec)
        enc = timed(lambda codec=codec: encode_tensor(x, codec), repeats)  # type: ignore[misc]
        dec = timed(lambda frame=frame: decode_tensor(frame, spec), repeats)  # type: ignore[misc]
        print(f"{codec:<14}{len(frame) / 1e6:>10.1f}{enc:>10.3f}{gb / enc:>8.2f}{dec:>10.3f}{gb / dec:>8.2f}")
    feedback = ErrorFeedback("int8")
    enc = timed(lambda: feedback.encode("k", x), repeats)
    print(f"{'int8 + feedback':<14}{len(feedback.encode('k', x)) / 1e6:>10.1f}{enc:>10.3f}{gb / enc:>8.2f}")


def raw_tcp(nbytes: int, repeats: int) -> float:
    """Median seconds to move ``nbytes`` over a fresh loopback connection and get one byte back."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    payload = bytes(nbytes)
    stop = threading.Event()

    def serve() -> None:
        sink = bytearray(4 * MiB)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                left = nbytes
                while left:
                    got = conn.recv_into(sink, min(left, len(sink)))
                    if not got:
                        break
                    left -= got
                conn.sendall(b"k")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()

    def once() -> None:
        with socket.create_connection(("127.0.0.1", port)) as conn:
            conn.sendall(payload)
            conn.recv(1)

    try:
        return timed(once, repeats)
    finally:
        stop.set()
        listener.close()
        thread.join(5)


def request_of(nbytes: int) -> tuple[CellForward, bytes]:
    elements = max(1, nbytes // 2)
    frame = encode_tensor(torch.zeros(elements), "fp16")
    request = CellForward(
        run_id=RUN,
        pipeline=0,
        stage=1,
        epoch="bench",
        share_id=0,
        share_first=0,
        share_count=1,
        round_end=False,
        attempt=0,
        micro_batch=0,
        version=0,
    )
    return request, frame


async def ack(sender: str, request: CellForward, blobs: list[bytes]) -> tuple[Ack, list[bytes]]:
    return Ack(), []


def server() -> rpc.RpcServer:
    s = rpc.RpcServer(run_id=RUN, timeout_s=300)
    s.register(CellForward, ack)
    return s


async def atimed(fn: Callable[[], Awaitable[object]], repeats: int) -> float:
    """``timed`` for a coroutine function."""
    await fn()
    runs = []
    for _ in range(repeats):
        started = time.perf_counter()
        await fn()
        runs.append(time.perf_counter() - started)
    return min(runs)


async def framed_tcp(nbytes: int, repeats: int) -> tuple[float, int]:
    s = server()
    listening = await asyncio.start_server(lambda r, w: s.serve("bench", r, w), "127.0.0.1", 0, limit=4 * MiB)
    port = listening.sockets[0].getsockname()[1]
    request, frame = request_of(nbytes)

    async def once() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=4 * MiB)
        header, blobs = request.encode([frame])
        answer = await rpc.request_on(
            reader, writer, header, blobs, timeout_s=300, max_message_bytes=rpc.DEFAULT_MAX_MESSAGE_BYTES
        )
        rpc.answer_of(request, "bench", *answer)
        writer.close()

    try:
        return await atimed(once, repeats), len(frame)
    finally:
        listening.close()


async def over_p2pd(sizes: list[int], repeats: int) -> list[tuple[float, int]]:
    from hivemind.p2p import P2P

    kw = {"host_maddrs": ["/ip4/127.0.0.1/tcp/0"], "nat_port_map": False, "auto_nat": False, "use_relay": False}
    server_p2p = await P2P.create(**kw)
    client_p2p = await P2P.create(initial_peers=[str(m) for m in await server_p2p.get_visible_maddrs()], **kw)
    try:
        await server().attach(server_p2p)
        results = []
        for nbytes in sizes:
            n = repeats * 4 if nbytes <= MiB else repeats
            request, frame = request_of(nbytes)
            peer = str(server_p2p.peer_id)
            seconds = await atimed(lambda: rpc.call(client_p2p, peer, request, [frame], timeout_s=300), n)  # noqa: B023
            results.append((seconds, len(frame)))
        return results
    finally:
        await client_p2p.shutdown()
        await server_p2p.shutdown()


def bench_requests(sizes_mib: list[float], repeats: int, p2p: bool) -> None:
    sizes = [int(s * MiB) for s in sizes_mib]
    print(
        f"\nrequests: one frame per request, one stream each, best of {repeats} (4x that up to 1 MiB); "
        "MB/s of payload (x raw TCP)"
    )
    p2p_results = asyncio.run(over_p2pd(sizes, repeats)) if p2p else []
    print(f"{'payload MiB':>12}{'raw TCP':>12}{'swarmd framing, TCP':>26}{'swarmd over p2pd':>24}")
    for i, nbytes in enumerate(sizes):
        n = repeats * 4 if nbytes <= MiB else repeats
        raw = nbytes / raw_tcp(nbytes, n) / 1e6
        seconds, sent = asyncio.run(framed_tcp(nbytes, n))
        framed = sent / seconds / 1e6
        cells = f"{raw:>12.0f}{framed:>18.0f} ({framed / raw:4.2f})"
        if p2p_results:
            over = p2p_results[i][1] / p2p_results[i][0] / 1e6
            cells += f"{over:>16.0f} ({over / raw:4.2f})"
        print(f"{nbytes / MiB:>12.4g}{cells}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--elements", type=int, default=10_000_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch threads for the codecs")
    parser.add_argument("--sizes-mib", default="0.0625,1,16,64")
    parser.add_argument("--no-p2p", action="store_true", help="skip the requests over hivemind's p2pd")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    bench_codecs(args.elements, args.repeats)
    bench_requests([float(s) for s in args.sizes_mib.split(",")], args.repeats, not args.no_p2p)


if __name__ == "__main__":
    main()
