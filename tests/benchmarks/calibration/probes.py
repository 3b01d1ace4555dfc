"""The programs the harness runs in child processes, as source text for ``python -c``.

They run apart from the harness because each must stand where the daemons stand: the compute
probe as one of as many processes as daemons, one torch thread each; the link and data-path
probes inside two devices' network namespaces (``tests.integration.netns``), so that their
traffic crosses the shaped links. Each prints its figures on its last line of output.
"""

COMPUTE_PROBE = r"""
import sys, time, torch
torch.set_num_threads(1)
from swarmd.models.build import build_model
from swarmd.models.presets import DEFAULT_RUN
from swarmd.models.shape import ModelShape
shape = ModelShape.from_dict(DEFAULT_RUN["model"])
model = build_model(shape, 0)
x = torch.randint(0, shape.vocab, (DEFAULT_RUN["batch"]["micro_batch"], shape.seq_len))
def step():
    model(input_ids=x, labels=x).loss.backward()
for _ in range(3):
    step()
n, started = 0, time.perf_counter()
while time.perf_counter() - started < float(sys.argv[1]):
    step()
    n += 1
print((time.perf_counter() - started) / n)
"""


GOODPUT_SINK = r"""
import socket, sys, threading, time
def echo(server):
    while True:
        conn, _ = server.accept()
        with conn:
            while chunk := conn.recv(1 << 10):
                conn.sendall(chunk)
threading.Thread(target=echo, args=(socket.create_server((sys.argv[1], 9101)),), daemon=True).start()
server = socket.create_server((sys.argv[1], 9100))
print("listening", flush=True)
conn, _ = server.accept()
got, first = 0, None
while chunk := conn.recv(1 << 16):
    first = first or time.perf_counter()
    got += len(chunk)
print(got / (time.perf_counter() - first))
"""
GOODPUT_SOURCE = r"""
import json, socket, statistics, sys, threading, time
host, nbytes = sys.argv[1], int(sys.argv[2])
def round_trips(n):
    out = []
    with socket.create_connection((host, 9101), timeout=30) as c:
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for _ in range(n):
            started, got = time.perf_counter(), 0
            c.sendall(bytes(64))
            while got < 64:
                got += len(c.recv(64 - got))
            out.append(time.perf_counter() - started)
            time.sleep(0.02)  # sync-ok: spacing between pings
    return statistics.median(out)
def bulk():
    with socket.create_connection((host, 9100), timeout=30) as conn:
        conn.sendall(bytes(nbytes))
idle = round_trips(20)
sender = threading.Thread(target=bulk)
sender.start()
time.sleep(1.0)  # sync-ok: TCP has filled the bottleneck's buffer
loaded = round_trips(30)
sender.join()
print(json.dumps({"idle_s": idle, "loaded_s": loaded}))
"""

# The daemons' own data path (hivemind P2P streams through p2pd, swarmd's framing and its
# latency shim), between two devices: a small request's round trip on the idle connection, a
# bulk request's goodput, and small requests' round trip beside that bulk request on the same
# connection (libp2p multiplexes a pair's streams over one connection).
# A typed request of the harness's own (never served by a daemon): one blob of any size up to
# the bulk transfer's, answered with its byte count.
SINK = r"""
from dataclasses import dataclass
from swarmd.peers.wire.protocol import Answer, Request, bound
@dataclass(frozen=True, kw_only=True)
class Sunk(Answer):
    bytes: int = bound(min_value=0, max_value=1 << 30)
@dataclass(frozen=True, kw_only=True)
class Sink(Request[Sunk]):
    METHOD = "calibration.sink"
    BLOBS = 1
    MAX_BYTES = (1 << 30) + 4096
"""
DATA_PATH_SERVER = (
    SINK
    + r"""
import asyncio, sys
from hivemind.p2p import P2P
from swarmd.peers.wire.rpc import RpcServer
async def sink(peer, request, blobs):
    return Sunk(bytes=sum(len(b) for b in blobs)), []
async def main():
    p2p = await P2P.create(host_maddrs=[f"/ip4/{sys.argv[1]}/tcp/0"], nat_port_map=False, auto_nat=False,
                           use_relay=False)
    server = RpcServer(max_message_bytes=(1 << 30) + 4096, timeout_s=300)
    server.register(Sink, sink)
    await server.attach(p2p)
    print([str(m) for m in await p2p.get_visible_maddrs()][0], flush=True)
    await asyncio.Event().wait()
asyncio.run(main())
"""
)
DATA_PATH_CLIENT = (
    SINK
    + r"""
import asyncio, json, statistics, sys, time
from hivemind.p2p import P2P
from swarmd.peers.wire.rpc import call
async def main():
    ip, maddr, nbytes = sys.argv[1], sys.argv[2], int(sys.argv[3])
    p2p = await P2P.create(host_maddrs=[f"/ip4/{ip}/tcp/0"], initial_peers=[maddr], nat_port_map=False,
                           auto_nat=False, use_relay=False)
    server = maddr.split("/p2p/")[1]
    async def small(n, beside=None):
        out = []
        for _ in range(n):
            if beside is not None and beside.done():
                break  # only pings beside the transfer count
            started = time.perf_counter()
            await call(p2p, server, Sink(run_id="calibration.aaaaaaaaaaaaaaaaaaaaaaaa"), [bytes(64)])
            out.append(time.perf_counter() - started)
            await asyncio.sleep(0.02)  # sync-ok: spacing between pings
        return statistics.median(out) if out else None
    async def bulk():
        await call(p2p, server, Sink(run_id="calibration.aaaaaaaaaaaaaaaaaaaaaaaa"), [bytes(nbytes)], timeout_s=300,
                   max_message_bytes=(1 << 30) + 4096)
        return time.perf_counter()
    await small(3)  # the connection is open and warm
    idle = await small(15)
    started = time.perf_counter()
    transfer = asyncio.create_task(bulk())
    await asyncio.sleep(0.5)  # sync-ok: the bulk request fills the connection's buffers
    loaded = await small(15, beside=transfer)
    elapsed = await transfer - started
    print(json.dumps({"idle_rtt_s": idle, "loaded_rtt_s": loaded if loaded is not None else idle,
                      "goodput_Bps": nbytes / max(1e-6, elapsed - idle)}))
    await p2p.shutdown()
asyncio.run(main())
"""
)
