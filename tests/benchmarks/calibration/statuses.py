"""What the real daemons say of themselves: their statuses read by daemon index, the plan
they follow, who holds shard ``(0, 0)``, each daemon's roles, and which one to kill.

The harness judges the real swarm only through these statuses (the same a user's ``status``
shows), so that it needs nothing from inside the daemons.
"""

from __future__ import annotations

from typing import Any

from swarmd.system.local_swarm import LocalDaemon


def alive(daemon: LocalDaemon) -> bool:
    """Whether the daemon's process still runs (a killed one is asked nothing more)."""
    return daemon.proc is not None and daemon.proc.poll() is None


def statuses_of(daemons: list[LocalDaemon]) -> dict[int, dict[str, Any]]:
    """The status of each daemon still running that answers, by daemon index (one request each)."""
    out = {}
    for i, d in enumerate(daemons):
        if alive(d) and (status := d.status()):
            out[i] = status
    return out


def newest_plan(statuses: dict[int, dict[str, Any]]) -> dict[str, Any] | None:
    """The newest plan any daemon knows, as its status shows it (``swarm.plan``)."""
    plans = [p for st in statuses.values() if (p := (st.get("swarm") or {}).get("plan"))]
    return max(plans, key=lambda p: p["version"]) if plans else None


def cells_of(status: dict[str, Any]) -> set[tuple[int, int]]:
    return {(c["pipeline"], c["stage"]) for c in (status.get("training") or {}).get("cells") or []}


def shards_of(status: dict[str, Any]) -> dict[tuple[int, int], dict[str, Any]]:
    return {(s["stage"], s["shard"]): s for s in (status.get("training") or {}).get("shards") or []}


def following_plan(statuses: dict[int, dict[str, Any]]) -> dict[str, Any] | None:
    """The newest plan, if every daemon that answers follows it: its trainer's assignment is
    that plan's version, it works exactly the cells the plan's grid gives it, and it serves
    shard ``(s, 0)`` of each stage the plan names it server of."""
    plan_ = newest_plan(statuses)
    if plan_ is None or not statuses:
        return None
    for st in statuses.values():
        assignment = (st.get("training") or {}).get("assignment") or {}
        if assignment.get("provisional", True) or assignment.get("version") != plan_["version"]:
            return None
        me = st.get("peer_id")
        planned = {(p, s) for p, row in enumerate(plan_["grid"]) for s, peer in enumerate(row) if peer == me}
        if cells_of(st) != planned:
            return None
        served = shards_of(st)
        if any(server == me and (s, 0) not in served for s, server in enumerate(plan_["parameter_servers"])):
            return None
    return plan_


def first_shard(statuses: dict[int, dict[str, Any]]) -> tuple[int, dict[str, Any]] | None:
    """Which daemon serves shard ``(0, 0)`` (and keeps the ledger), and its training status."""
    for i, st in statuses.items():
        if (0, 0) in shards_of(st):
            return i, st["training"]
    return None


def plan_of(statuses: dict[int, dict[str, Any]], plan_: dict[str, Any] | None) -> dict[str, Any] | None:
    """The plan the daemons follow, by daemon index: the placement the simulation starts from.
    The plan's status names no shard servers beyond each stage's first, nor spares: the shards'
    servers are who serves them now (all of them found, and distinct), else one shard a stage."""
    if plan_ is None:
        return None
    index = {st.get("peer_id"): i for i, st in statuses.items()}
    if not all(p in index for row in plan_["grid"] for p in row) or not all(
        p in index for p in plan_["parameter_servers"]
    ):
        return None
    servers = [index[p] for p in plan_["parameter_servers"]]
    held = {key: i for i, st in statuses.items() for key in shards_of(st)}
    assignment = next(iter(statuses.values()))["training"]["assignment"]
    counts = assignment.get("shards") or [1] * len(servers)
    rows = [[held.get((s, k)) for k in range(counts[s])] for s in range(len(servers))]
    whole = all(None not in row and row[0] == servers[s] and len(set(row)) == len(row) for s, row in enumerate(rows))
    return {
        "version": plan_["version"],
        "pipelines": [[index[p] for p in row] for row in plan_["grid"]],
        "layers_per_stage": plan_["layers_per_stage"],
        "parameter_servers": servers,
        "shard_servers": rows if whole else [[s] for s in servers],
        "local_steps": assignment.get("local_steps") or 1,
        "share_micro_batches": assignment.get("share_micro_batches") or 0,
    }


def roles_of(statuses: dict[int, dict[str, Any]]) -> dict[int, list[str]]:
    """Each daemon's cells, the shards it serves and the daemon it names its standby, by daemon
    index (as the simulation's ``SimResult.roles`` names cells and shards)."""
    index = {st.get("peer_id"): i for i, st in statuses.items()}
    out: dict[int, list[str]] = {}
    for i, st in statuses.items():
        roles = [f"cell {p}/{s}" for p, s in sorted(cells_of(st))]
        roles += [f"shard {s}/{k}" for s, k in sorted(shards_of(st))]
        standby = (st.get("training") or {}).get("standby")
        if standby:
            roles.append(f"its standby d{index[standby]}" if standby in index else f"its standby {standby[:12]}")
        out[i] = roles or ["nothing"]
    return out


def pick_victim(statuses: dict[int, dict[str, Any]]) -> int | None:
    """A daemon that works a cell and serves no shard (the highest index), else one that works a
    cell and does not keep the ledger, else any cell's worker."""
    workers = [i for i, st in statuses.items() if cells_of(st)]
    for choice in (
        [i for i in workers if not shards_of(statuses[i])],
        [i for i in workers if (0, 0) not in shards_of(statuses[i])],
        workers,
    ):
        if choice:
            return max(choice)
    return None
