"""Knowing the swarm, live: daemons probe each other, observe each other, elect one coordinator,
and follow the plan it publishes; a departure is repaired, not re-planned from scratch, unless
the coordinator predicts the repair far slower than a fresh plan on the same measurements.

The daemons do not train (--no-train): placement is decided the same way, at a fraction of
the cost on two cores.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from swarmd.models.presets import DEFAULT_RUN
from swarmd.node.plan_publisher import REPAIR_FLOOR
from swarmd.system.local_swarm import LocalDaemon, wait_for

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
    run_id = make_run(workdir / "d0", spec=DEFAULT_RUN)
    daemons = [daemon_factory(workdir / f"d{i}", run_id) for i in range(5)]
    addrs = daemons[0].start().wait_running()["addrs"]
    for d in daemons[1:]:
        d.start(addrs)
    ids = [d.wait_running()["peer_id"] for d in daemons]
    wait_for(lambda: all(len(d.seen_peers()) == 4 for d in daemons), 60, "every daemon to see the other four")

    # Every daemon measured links to the others (RTT and bandwidth probes, within the budget, or
    # the data path's own transfers where training traffic got there first; a probe that timed
    # out on these loaded cores still leaves its RTT sample)...
    wait_for(lambda: all(swarm(d)["links"]["measured"] == 4 for d in daemons), 60, "every link probed")
    for d in daemons:
        links = swarm(d)["links"]
        tried = links["probes_sent"] + links["probe_failures"] + links["passive_samples"]
        assert tried >= 4 and links["probe_bytes_last_hour"] <= 64 * 2**20
    # ... and the matrix everyone assembles is measured, not guessed.
    try:
        wait_for(lambda: swarm(daemons[0])["links"]["matrix_filled"] == 0, 60, "a fully measured matrix")
    except TimeoutError:  # seen in two CI runs: what each daemon had measured and assembled
        for d in daemons:
            print(d.status()["peer_id"][-8:], swarm(d)["links"])
        raise

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
    assert plan["predicted_iteration_s"] > 0 and sum(plan["layers_per_stage"]) == DEFAULT_RUN["model"]["layers"]
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
    coordinator = daemons[ids.index(plan["by"])]
    plans_logged = [line for line in coordinator.log_tail(400).splitlines() if "Plan v" in line or "repair" in line]
    assert repaired["by"] == plan["by"], plans_logged
    assert ids[victim] not in {peer for row in repaired["grid"] for peer in row}
    assert len(repaired["relays"]) == 1 and ids[victim] not in repaired["relays"]
    if repaired["kind"] == "repair":
        assert all(row in repaired["grid"] for row in untouched), (untouched, repaired["grid"])
        return
    # A full plan only where the coordinator weighed the repair on the same measurements and
    # found it under REPAIR_FLOOR of a full plan's speed. Under two test workers the first plan's
    # links were once measured so poorly that this held (11,905 against 45,191 tokens/s).
    weighed = [re.search(r"A repair predicted (\d+) .* against (\d+) for a full plan", line) for line in plans_logged]
    found = [(int(m[1]), int(m[2])) for m in weighed if m]
    assert found and found[-1][0] < REPAIR_FLOOR * found[-1][1], plans_logged
    print("planned afresh: the repair was predicted at", found[-1][0], "against", found[-1][1], "tokens/s")


def test_roles_follow_the_history_the_observers_kept(
    workdir: Path, make_run: Callable[..., str], daemon_factory: Callable[..., LocalDaemon]
) -> None:
    """Four daemons restart with the observation books they kept (as after a reboot): all have
    watched a veteran for a day, a regular for an hour, and a flapper that left ten times in
    an hour; the fourth is new to all. Once the books are published, the swarm's scores come
    from the others' books, the coordinator and the relay are peers that pass the thresholds,
    and the flapper and the newcomer hold neither role."""
    from swarmd.node.measurements import OBSERVATIONS_FILE
    from swarmd.peers.records.identity import load_or_create_identity
    from swarmd.system.state_dir import prepare_state_dir

    run_id = make_run(workdir / "d0", spec=DEFAULT_RUN)
    dirs = [workdir / f"d{i}" for i in range(4)]
    ids = [load_or_create_identity(prepare_state_dir(d)).peer_id for d in dirs]
    veteran, regular, flapper, newcomer = ids
    now = time.time()
    history = {
        veteran: [86400.0, 86400.0, 0, now],
        regular: [3600.0, 3600.0, 0, now],
        flapper: [3600.0, 3420.0, 10, now],
    }
    for d, observer in zip(dirs, ids, strict=True):
        book = {"version": 1, "observer": observer, "peers": {p: w for p, w in history.items() if p != observer}}
        (d / OBSERVATIONS_FILE).write_text(json.dumps(book))

    daemons = [daemon_factory(d, run_id) for d in dirs]
    addrs = daemons[0].start().wait_running()["addrs"]
    for d in daemons[1:]:
        d.start(addrs)
    assert [d.wait_running()["peer_id"] for d in daemons] == ids

    def scores() -> dict[str, float]:
        return swarm(daemons[3])["reliability"]

    # Each observer's record arrives in its own time: wait until all three subjects are scored.
    def history_counts() -> bool:
        seen = scores()
        return all(p in seen for p in (veteran, regular, flapper))

    wait_for(history_counts, 90, "the kept history of all three to count")
    seen = scores()
    assert seen[veteran] > 0.9 and 0.6 < seen[regular] < 0.9 and seen[flapper] < 0.2, seen
    assert seen.get(newcomer, 0.0) < 0.1, seen

    def settled() -> dict[str, Any] | None:
        plan = agreed_plan(daemons, set(ids))
        coordinators = {swarm(d)["coordinator"] for d in daemons}
        if plan is None or len(coordinators) != 1 or plan["by"] not in coordinators:
            return None
        return plan if set(plan["relays"]) <= {veteran, regular} and plan["by"] in {veteran, regular} else None

    try:
        plan = wait_for(settled, 90, "the coordinator and the relay to be peers that pass the thresholds")
    except TimeoutError:
        for d in daemons:
            print(d.status()["peer_id"][-8:], {k: v for k, v in swarm(d).items() if k != "links"})
        raise
    assert len(plan["relays"]) == 1 and not {flapper, newcomer} & {plan["by"], *plan["relays"]}, plan
    # The planner's parameter server for a stage is its most available member: never the
    # flapper while the veteran shares its stage.
    for server, group in zip(plan["parameter_servers"], zip(*plan["grid"], strict=True), strict=True):
        assert not (server == flapper and veteran in group), plan
