"""What the hostile-peer test and benchmark share, without hivemind: a training swarm of local
daemons, its description for Mallory, Mallory run as a subprocess, and the checks that the
daemons held (progress, logs, checkpoints, memory)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from safetensors.torch import load_file

from swarmd.models.shard_checkpoint import ShardCheckpoint
from swarmd.system.local_swarm import LocalDaemon, wait_for
from tests.integration.fork_launcher import ForkLauncher
from tests.integration.procfs import TICK_S, descendants
from tests.integration.sampling import Sampling
from tests.integration.small_run import SMALL_RUN

ROOT = Path(__file__).resolve().parents[3]
MALLORY = "tests.integration.hostile.mallory"


def status(daemon: LocalDaemon) -> dict[str, Any]:
    return daemon.status() or {}


def updates(daemons: list[LocalDaemon]) -> int:
    """The swarm's applied updates: shard (0, 0)'s version, as its server reports it."""
    return max(((status(d).get("training") or {}).get("updates") or 0 for d in daemons), default=0)


def wait_updates(daemons: list[LocalDaemon], above: int, timeout: float, what: str) -> int:
    return wait_for(lambda: (n := updates(daemons)) > above and n, timeout, f"{what}: updates above {above}", 0.5)


def describe(daemons: list[LocalDaemon], run_id: str) -> dict[str, Any]:
    """The swarm as Mallory needs it (``tests.integration.hostile.mallory``'s doc)."""
    peers = []
    for daemon in daemons:
        s = status(daemon)
        t = s.get("training") or {}
        peers.append(
            {
                "peer_id": s["peer_id"],
                "addrs": s["addrs"],
                "cells": [{k: c[k] for k in ("pipeline", "stage", "epoch", "share")} for c in t.get("cells") or []],
                "shards": [{k: x[k] for k in ("stage", "shard", "shards", "version")} for x in t.get("shards") or []],
                "ledger": t.get("ledger") is not None,
                "replicas": list((t.get("replicas") or {}).get("shards") or {}),
            }
        )
    model = SMALL_RUN["model"]
    return {
        "run_id": run_id,
        "bootstrap": peers[0]["addrs"],
        "stages": SMALL_RUN["stages"],
        "layers": model["layers"],
        "micro_batch": SMALL_RUN["batch"]["micro_batch"],
        "batch_micro_batches": SMALL_RUN["batch"]["sequences"] // SMALL_RUN["batch"]["micro_batch"],
        "seq_len": model["seq_len"],
        "hidden": model["hidden"],
        "peers": peers,
    }


def placed(daemons: list[LocalDaemon]) -> bool:
    """Every cell and every shard of the plan held by some daemon (Mallory has targets)."""
    swarm = describe(daemons, "")
    stages = {c["stage"] for p in swarm["peers"] for c in p["cells"]}
    shards = {s["stage"] for p in swarm["peers"] for s in p["shards"]}
    return stages == shards == set(range(SMALL_RUN["stages"])) and any(p["ledger"] for p in swarm["peers"])


def planned(daemons: list[LocalDaemon]) -> bool:
    """Every daemon follows a plan one of them signed (the coordinator's, not the provisional
    assignment a swarm runs before its first plan)."""
    honest = {status(d).get("peer_id") for d in daemons}
    plans = [(status(d).get("swarm") or {}).get("plan") or {} for d in daemons]
    return all(plan.get("by") in honest for plan in plans)


def mallory(
    launcher: ForkLauncher, workdir: Path, swarm: dict[str, Any], attacks: list[str], *extra: str, timeout: float = 240
) -> dict[str, Any]:
    """Run Mallory (forked by ``launcher``, as ``python -m`` would run it) and return its
    report; raises with its errors if it failed or ran past ``timeout`` (then it got SIGTERM
    first, to close its DHT process and p2pd, a group of their own)."""
    path = workdir / "swarm.json"
    path.write_text(json.dumps(swarm))
    try:
        done = launcher.run_module(MALLORY, [*attacks, "--swarm", str(path), *extra], timeout, cwd=ROOT)
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"mallory {attacks} ran past {timeout} s: {str(e.stderr)[-3000:]}") from None
    if done.returncode != 0 or not done.stdout.strip():
        raise AssertionError(f"mallory {attacks} exited with {done.returncode}: {done.stderr[-3000:]}")
    report: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return report


def tracebacks(daemons: list[LocalDaemon]) -> list[str]:
    """The first Traceback in each daemon's log (its DHT process's stderr included)."""
    found = []
    for daemon in daemons:
        text = daemon.log_path.read_text(errors="replace") if daemon.log_path.exists() else ""
        found += [f"{daemon.log_path.name}: {block[:1500]}" for block in _traceback_blocks(text)[:1]]
    return found


def _traceback_blocks(text: str) -> list[str]:
    """Each traceback with its chained ones: from "Traceback" to the first line after it that is
    neither indented nor part of the chain, that line (the exception) included."""
    blocks, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        if not lines[i].startswith("Traceback (most recent call last)"):
            i += 1
            continue
        start = i
        i += 1
        while i < len(lines):
            line = lines[i]
            chained = line.startswith(("Traceback (most recent call last)", "During handling", "The above exception"))
            if line.startswith(" ") or not line or chained:
                i += 1
                continue
            # the exception's line; a chain may follow it after a blank line
            i += 1
            if i + 1 < len(lines) and not lines[i] and lines[i + 1].startswith(("During handling", "The above")):
                continue
            break
        blocks.append("\n".join(lines[start:i]))
    return blocks


def bad_checkpoints(daemons: list[LocalDaemon]) -> list[str]:
    """Every shard checkpoint under the daemons' state that its own reader refuses (format,
    digest, shapes, finiteness: ``ShardCheckpoint.read``), every other safetensors file that
    does not load or holds a non-finite value, and every file a daemon set aside as bad."""
    bad = []
    for daemon in daemons:
        bad += [f"{path}: set aside by the daemon" for path in sorted(daemon.state_dir.rglob("*.bad-*"))]
        for path in sorted(daemon.state_dir.rglob("*.safetensors")):
            try:
                if path.name.startswith("shard-"):
                    ShardCheckpoint.read(path, None, None)
                    continue
                tensors = load_file(str(path))
            except FileNotFoundError:
                continue  # replaced meanwhile (written atomically under a new name)
            except Exception as e:
                bad.append(f"{path}: refused ({type(e).__name__}: {e})")
                continue
            for name, tensor in tensors.items():
                if tensor.is_floating_point() and not bool(tensor.isfinite().all()):
                    bad.append(f"{path}: {name} holds a non-finite value")
    return bad


def rss_bytes(pid: int, with_children: bool = True) -> int:
    """Resident memory of ``pid`` (and its descendants: the DHT process, p2pd), from /proc."""
    total = 0
    for p in [pid, *(descendants(pid) if with_children else ())]:
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
        except OSError:
            continue
    return total


def tree_cpu_s(pid: int) -> float:
    """CPU seconds (user and system) so far of ``pid`` and its live descendants, from /proc."""
    total = 0.0
    for p in [pid, *descendants(pid)]:
        try:
            fields = Path(f"/proc/{p}/stat").read_text()
        except OSError:
            continue
        after = fields[fields.rfind(")") + 2 :].split()
        total += (int(after[11]) + int(after[12])) * TICK_S
    return total


class RssPeak(Sampling):
    """Samples a process's resident memory every 0.1 s while in use; ``peak`` and ``before``."""

    def __init__(self, pid: int) -> None:
        super().__init__(0.1, join_s=5.0)
        self.pid, self.before, self.peak = pid, rss_bytes(pid), 0

    def sample(self) -> None:
        self.peak = max(self.peak, rss_bytes(self.pid))


def refused(daemons: list[LocalDaemon]) -> dict[str, int]:
    """The daemons' RPC refusals by code, summed."""
    out: dict[str, int] = {}
    for daemon in daemons:
        for code, n in ((status(daemon).get("rpc") or {}).get("refused") or {}).items():
            out[code] = out.get(code, 0) + n
    return out
