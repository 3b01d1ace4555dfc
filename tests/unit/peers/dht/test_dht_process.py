"""TiedDHT.ask (swarmd.peers.dht.process): a coroutine runs in a real DHT process and its
outcome comes back tagged by request, through no descriptor handed over multiprocessing's
resource sharer; a caller that gave up does not disturb the next, and a process that dies
fails what waits on it at once.

The DHT runs in an interpreter of its own (``_SCENARIOS``, started once for the module):
hivemind must not share the test process with py-libp2p, whose protobufs clash with its own.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.timeout(90)

ROOT = Path(__file__).resolve().parents[4]

# Each scenario prints one JSON line: {"scenario": name, ...what it saw}.
_SCENARIOS = r"""
import asyncio, functools, json, os, signal
from multiprocessing import resource_sharer
from swarmd.peers.dht.process import TiedDHT

async def echo(value, dht, node):
    return value

async def peer_id(dht, node):
    return node.peer_id.to_base58()

async def fail(message, dht, node):
    raise ValueError(message)

async def unpicklable(dht, node):
    return lambda: None

class Picky(Exception):  # pickles, and does not rebuild: its class wants two arguments
    def __init__(self, a, b):
        super().__init__(f"{a} {b}")

async def picky(dht, node):
    raise Picky("no", "rebuild")

async def slow(seconds, value, dht, node):
    await asyncio.sleep(seconds)
    return value

def report(scenario, **seen):
    print(json.dumps({"scenario": scenario, **seen}), flush=True)

async def outcome(call):
    try:
        return {"value": await call}
    except BaseException as e:
        return {"raised": type(e).__name__, "message": str(e)}

async def main(dht):
    values = [["x" * 200_000], {"a": [1, 2]}, None, *range(20)]  # one answer far past a pipe's buffer
    answers = await asyncio.gather(*(dht.ask(functools.partial(echo, v)) for v in values))
    report("answers", equal=answers == values, peer_id=await dht.ask(peer_id),
           sharer_listening=resource_sharer._resource_sharer._listener is not None)

    report("errors", failed=await outcome(dht.ask(functools.partial(fail, "refused here"))),
           unpicklable=await outcome(dht.ask(unpicklable)), picky=await outcome(dht.ask(picky)),
           after=await dht.ask(functools.partial(echo, 7)))

    gave_up = await outcome(asyncio.wait_for(dht.ask(functools.partial(slow, 1.0, "late")), 0.1))
    mine = await dht.ask(functools.partial(slow, 1.5, "mine"))  # the late answer comes in first
    report("gave_up", gave_up=gave_up, mine=mine, pending=len(dht._pending))

    waiting = asyncio.ensure_future(dht.ask(functools.partial(slow, 30.0, "never")))
    await asyncio.sleep(0.2)  # sync-ok: let the request reach the process before it dies
    os.killpg(dht.pid, signal.SIGKILL)
    report("killed", waiting=await outcome(asyncio.wait_for(waiting, 10)),
           after=await outcome(dht.ask(functools.partial(echo, 1))))

dht = TiedDHT(child_init=None, start=True, host_maddrs=["/ip4/127.0.0.1/tcp/0"], nat_port_map=False,
              auto_nat=False, use_relay=False, shutdown_timeout=2)
try:
    asyncio.run(main(dht))
finally:
    if dht.is_alive():
        os.killpg(dht.pid, signal.SIGKILL)  # the process and its p2pd
    dht.join(10)
"""


@pytest.fixture(scope="module")
def seen() -> dict[str, dict[str, Any]]:
    done = subprocess.run(
        [sys.executable, "-c", _SCENARIOS], cwd=ROOT, capture_output=True, text=True, timeout=80, check=False
    )
    found = {}
    for line in done.stdout.splitlines():
        if line.startswith("{"):
            row = json.loads(line)
            found[row.pop("scenario")] = row
    assert done.returncode == 0 and len(found) == 4, (found, done.stderr[-3000:])
    return found


def test_answers_come_back_to_their_own_requests(seen: dict[str, dict[str, Any]]) -> None:
    answers = seen["answers"]
    assert answers["equal"] and answers["peer_id"].startswith("12D3KooW")
    # The reason for the answer pipe: no descriptor went through the resource sharer.
    assert not answers["sharer_listening"]


def test_errors_come_back_as_the_callers_exceptions(seen: dict[str, dict[str, Any]]) -> None:
    errors = seen["errors"]
    assert errors["failed"] == {"raised": "ValueError", "message": "refused here"}
    assert errors["unpicklable"]["raised"] == "RuntimeError"
    assert "could not send its answer" in errors["unpicklable"]["message"]
    assert errors["picky"]["raised"] == "RuntimeError" and "Picky" in errors["picky"]["message"]
    assert errors["after"] == 7  # the pipe is still in step


def test_a_caller_that_gave_up_leaves_the_others_their_answers(seen: dict[str, dict[str, Any]]) -> None:
    gave_up = seen["gave_up"]
    assert gave_up["gave_up"]["raised"] == "TimeoutError"
    assert gave_up["mine"] == "mine" and gave_up["pending"] == 0


def test_a_dead_process_fails_the_calls_waiting_on_it(seen: dict[str, dict[str, Any]]) -> None:
    killed = seen["killed"]
    assert killed["waiting"]["raised"] == "ConnectionResetError"
    assert "DHT process ended" in killed["waiting"]["message"]
    assert killed["after"]["raised"] == "ConnectionResetError"
