"""When each device of a scenario comes and goes: the churn the simulator plays out.

A device with ``mean_uptime_h`` (and ``mean_downtime_h``) alternates between up sessions and
down gaps drawn from exponential distributions with those means (a memoryless volunteer: how
long it has been up says nothing of when it leaves). It starts up with probability equal to
its availability, as if the process had been running for long. A device without
``mean_uptime_h`` never leaves; one without ``mean_downtime_h`` (or 0) comes back at once,
which still costs the swarm its departure.

The schedule is drawn once from the seed, before the simulation: every strategy compared on
one seed meets exactly the same departures and returns (``swarmd.peers.sim.simulator``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from swarmd.peers.planning.scenario import Scenario

MIN_GAP_S = 1.0
"""The shortest down gap drawn: a departure and return at the same instant would be no event."""


@dataclass(frozen=True, order=True)
class ChurnEvent:
    at_s: float
    device: int
    up: bool
    """True: the device comes (back) up; False: it leaves."""


def churn_schedule(scenario: Scenario, horizon_s: float, seed: int) -> tuple[np.ndarray, list[ChurnEvent]]:
    """Which devices are up at time 0, and every departure and return before ``horizon_s``, in
    time order (ties by device)."""
    rng = np.random.default_rng(seed)
    up0 = np.ones(scenario.n, dtype=bool)
    events: list[ChurnEvent] = []
    for i, d in enumerate(scenario.devices):
        if d.mean_uptime_h is None:
            continue
        mean_up = d.mean_uptime_h * 3600.0
        mean_down = max(MIN_GAP_S, (d.mean_downtime_h or 0.0) * 3600.0)
        up = bool(rng.random() < d.availability)
        up0[i] = up
        t = 0.0
        while True:
            t += float(rng.exponential(mean_up if up else mean_down))
            if t >= horizon_s:
                break
            up = not up
            events.append(ChurnEvent(t, i, up))
    events.sort()
    return up0, events


def expected_departures(scenario: Scenario, horizon_s: float) -> float:
    """How many departures the schedule should hold on average: each device leaves once per
    uptime plus downtime, over the horizon."""
    total = 0.0
    for d in scenario.devices:
        if d.mean_uptime_h is not None:
            cycle = (d.mean_uptime_h + max(MIN_GAP_S / 3600.0, d.mean_downtime_h or 0.0)) * 3600.0
            total += horizon_s / cycle
    return total
