"""Knowing the swarm, live: daemons probe each other, observe each other, elect one coordinator,
and follow the plan it publishes; a departure is repaired, not re-planned from scratch.

The daemons do not train (--no-train): placement is decided the same way, at a fraction of
the cost on two cores.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from swarmd.local_swarm import LocalDaemon, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def swarm(daemon: LocalDaemon) -> dict[str, Any]:
    return ((daemon.status() or {}).get("swarm")) or {}


def plan_of(daemon: LocalDaemon) -> dict[str, Any]:
    return swarm(daemon).get("plan") or {}


def agreed_plan(daemons: list[LocalDaemon], members: set[str]) -> dict[str, Any] | None:
    """The plan every daemon follows, once they all follow the same one covering ``members``."""
    plans = [plan_of(d) for d in daemons]
    if not all(plans) or len({(p["version"], p["by"]) for p in plans}) != 1:
        return None
    placed = {peer for row in plans[0]["grid"] for peer in row}
    return plans[0] if placed <= members <= set(plans[0]["devices"]) else None


def test_a_coordinator_plans_from_measurements_and_repairs_after_a_departure(
    workdir: Path, make_run: Callable[..., str], daemon_factory: Callable[..., LocalDaemon]
) -> None:
    run_id = make_run(workdir / "d0")
    daemons = [daemon_factory(workdir / f"d{i}", run_id) for i in range(5)]
    addrs = daemons[0].start().wait_running()["addrs"]
    for d in daemons[1:]:
        d.start(addrs)
    ids = [d.wait_running()["peer_id"] for d in daemons]
    wait_for(lambda: all(len(d.seen_peers()) == 4 for d in daemons), 60, "every daemon to see the other four")

    # Every daemon measured links to the others (RTT and bandwidth probes, within the budget)...
    wait_for(lambda: all(swarm(d)["links"]["measured"] == 4 for d in daemons), 60, "every link probed")
    for d in daemons:
        links = swarm(d)["links"]
        assert links["probes_sent"] >= 4 and links["probe_bytes_last_hour"] <= 64 * 2**20
    # ... and the matrix everyone assembles is measured, not guessed.
    wait_for(lambda: swarm(daemons[0])["links"]["matrix_filled"] == 0, 60, "a fully measured matrix")

    # One coordinator, the same for all, publishes a plan of the run's two stages, made with
    # every member in view (one or two pipelines, whichever its cost model prefers on these
    # links; the rest to spare); everyone follows it.
    members = set(ids)
    try:
        plan = wait_for(lambda: agreed_plan(daemons, members), 90, "one plan that every daemon follows")
    except TimeoutError:
        for d in daemons:
            print(d.status()["peer_id"][-8:], {k: v for k, v in swarm(d).items() if k != "links"})
        for d in daemons:
            print(d.log_tail(30))
        raise
    coordinators = {swarm(d)["coordinator"] for d in daemons}
    assert len(coordinators) == 1 and plan["by"] in coordinators
    # (a daemon seen late is added by repair: the first version is full, later ones mend it)
    assert plan["stages"] == 2 and 1 <= plan["pipelines"] <= 2 and plan["kind"] in ("full", "repair")
    assert plan["predicted_iteration_s"] > 0 and sum(plan["layers_per_stage"]) == 4
    for d, peer in zip(daemons, ids, strict=True):
        mine = plan_of(d)["my_stage"]
        in_plan = [s for row in plan["grid"] for s, p in enumerate(row) if p == peer]
        assert (mine is None and not in_plan) or [mine] == in_plan
    # Five members elect one relay. Newcomers pass no threshold yet, so the coordinator names
    # the best-ranked peer; every member reads the same relay from the plan.
    assert len(plan["relays"]) == 1 and set(plan["relays"]) <= members, plan
    for d, peer in zip(daemons, ids, strict=True):
        assert d.status()["relaying"]["relay"] == (peer in plan["relays"])
    # Others' observations of each peer, never its own word, make its reliability.
    wait_for(lambda: all(p in swarm(daemons[0])["reliability"] for p in ids), 60, "reliability of every peer")

    # A planned peer that is not the coordinator is killed: the coordinator repairs the plan
    # (the spare takes the hole, or the pipeline goes), touching only that pipeline.
    victim = next(i for i, p in enumerate(ids) if p != plan["by"] and any(p in row for row in plan["grid"]))
    untouched = [row for row in plan["grid"] if ids[victim] not in row]
    daemons[victim].kill()
    rest = [d for i, d in enumerate(daemons) if i != victim]
    members.discard(ids[victim])
    repaired = wait_for(
        lambda: (p := agreed_plan(rest, members)) and p["version"] > plan["version"] and p, 90, "a repaired plan"
    )
    assert repaired["kind"] == "repair" and repaired["by"] == plan["by"]
    assert ids[victim] not in {peer for row in repaired["grid"] for peer in row}
    assert all(row in repaired["grid"] for row in untouched), (untouched, repaired["grid"])
    assert len(repaired["relays"]) == 1 and ids[victim] not in repaired["relays"]
