"""The CPU share's duty cycle, on an injected clock (and an injected CPU clock, where the share
meters the daemon's CPU time)."""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from swarmd.errors import ConfigError
from swarmd.training.cells.throttle import BURST_S, IDLE_DEBT_S, TRAINING_FLOOR, ComputeLimits, DutyCycle

pytestmark = pytest.mark.timeout(20)


class FakeTime:
    def __init__(self) -> None:
        self.now = 100.0
        self.waits: list[float] = []

    def clock(self) -> float:
        return self.now

    def wait(self, _: object, seconds: float) -> None:
        self.waits.append(seconds)
        self.now += seconds

    def busy(self, seconds: float) -> str:
        self.now += seconds
        return "done"


def cycle(share: float) -> tuple[FakeTime, ComputeLimits, DutyCycle]:
    t = FakeTime()
    limits = ComputeLimits(share, clock=t.clock, wait=t.wait)
    return t, limits, DutyCycle(limits, set_threads=lambda n: None)


def test_busy_at_half_share_owes_as_much_idle() -> None:
    t, limits, duty = cycle(0.5)
    limits.balance = 0.0  # no burst left
    assert duty.run(t.busy, 0.2) == ("done", 0.0)
    assert limits.owed_s() == pytest.approx(0.2)
    _, waited = duty.run(t.busy, 0.2)
    assert waited == pytest.approx(0.2) and limits.throttled_s == pytest.approx(0.2)


@pytest.mark.parametrize("share", [0.25, 0.5, 0.8])
def test_saturated_compute_runs_its_share_of_the_time(share: float) -> None:
    t, _, duty = cycle(share)
    start, busy = t.now, 0.0
    for _ in range(500):
        duty.run(t.busy, 0.1)
        busy += 0.1
    elapsed = t.now - start
    # The bucket's bound: at most the share, plus the burst, plus the last job's unpaid debt.
    assert busy <= share * elapsed + BURST_S + (1 - share) * 0.1 + 1e-9
    assert busy / elapsed == pytest.approx(share, rel=0.05)


def test_idle_time_spent_anyway_pays_the_debt() -> None:
    t, _, duty = cycle(0.5)
    duty.run(t.busy, 1.0)
    t.now += 5.0  # waiting for a neighbour's tensor
    _, waited = duty.run(t.busy, 0.1)
    assert waited == 0.0 and t.waits == []


def test_a_long_idle_buys_at_most_the_burst() -> None:
    t, limits, duty = cycle(0.5)
    t.now += 3600
    duty.run(t.busy, 2.0)
    assert limits.owed_s() == pytest.approx((2.0 * 0.5 - BURST_S) / 0.5)


def test_jobs_of_two_cells_at_once_spend_the_time_once() -> None:
    t, limits, _ = cycle(0.5)
    limits.balance = 0.0
    limits.begin()
    limits.begin()  # another cell's job starts while the first runs
    t.now += 1.0
    limits.end()
    limits.end()
    assert limits.owed_s() == pytest.approx(1.0)  # (1 - 0.5) * 1 s owed, paid at 0.5 a second


def test_full_share_never_waits_and_clears_the_debt() -> None:
    t, limits, duty = cycle(0.2)
    duty.run(t.busy, 1.0)
    assert limits.owed_s() > 0
    limits.set(1.0)
    assert limits.owed_s() == 0.0
    for _ in range(10):
        assert duty.run(t.busy, 1.0)[1] == 0.0


def test_a_lower_share_owes_longer() -> None:
    t, limits, duty = cycle(0.5)
    limits.balance = 0.0
    duty.run(t.busy, 0.4)
    limits.set(0.25)
    assert limits.owed_s() == pytest.approx(0.4 * 0.5 / 0.25)


def test_a_share_out_of_range_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"cpu share 0 must be in \(0, 1\]"):
        ComputeLimits(0)
    with pytest.raises(ConfigError):
        ComputeLimits(1.5)


def owing(share: float) -> tuple[ComputeLimits, DutyCycle, threading.Event, threading.Thread]:
    """A real thread whose job waits for 1000 s of debt."""
    limits = ComputeLimits(share)
    limits.balance = -10.0
    duty = DutyCycle(limits, set_threads=lambda n: None)
    done = threading.Event()
    thread = threading.Thread(target=lambda: (duty.run(lambda: None), done.set()))
    thread.start()
    return limits, duty, done, thread


def test_a_waiting_thread_goes_on_when_the_share_is_raised() -> None:
    limits, _, done, thread = owing(0.01)
    assert not done.wait(0.05)
    limits.set(1.0)
    assert done.wait(5.0)
    thread.join(5.0)


def test_a_stopped_cycle_runs_at_once() -> None:
    _, duty, done, thread = owing(0.01)
    duty.stop()
    assert done.wait(5.0)
    thread.join(5.0)


def test_each_worker_takes_a_new_thread_count_before_its_next_job() -> None:
    t, limits, _ = cycle(1.0)
    counts: list[int] = []
    duty = DutyCycle(limits, set_threads=counts.append)
    duty.run(t.busy, 0.1)
    assert counts == []  # 0: left as torch found it
    limits.threads = 3
    duty.run(t.busy, 0.1)
    duty.run(t.busy, 0.1)
    assert counts == [3]


def test_a_thread_count_reaches_a_real_worker_thread() -> None:
    torch = pytest.importorskip("torch")
    limits = ComputeLimits()
    duty = DutyCycle(limits)
    with ThreadPoolExecutor(1) as worker:
        before = worker.submit(duty.run, torch.get_num_threads).result()[0]
        limits.threads = 1 if before != 1 else 2
        after = worker.submit(duty.run, torch.get_num_threads).result()[0]
    assert after == limits.threads


class FakeCpu(FakeTime):
    """Wall time and the daemon's CPU time: ``idle_cores`` busy all along (the network, the
    DHT), plus what each job computes."""

    def __init__(self, idle_cores: float = 0.0) -> None:
        super().__init__()
        self.idle_cores = idle_cores
        self.jobs_cpu = 0.0

    def cpu(self) -> float:
        return self.jobs_cpu + self.idle_cores * self.now

    def compute(self, seconds: float, cores: float = 1.0) -> str:
        self.jobs_cpu += seconds * cores
        return self.busy(seconds)


def metered(share: float, cores: int, idle_cores: float = 0.0) -> tuple[FakeCpu, ComputeLimits, DutyCycle]:
    t = FakeCpu(idle_cores)
    limits = ComputeLimits(share, clock=t.clock, wait=t.wait, cpu_seconds=t.cpu)
    limits.meter_cpu(cores)
    return t, limits, DutyCycle(limits, set_threads=lambda n: None)


def test_on_a_cpu_the_daemons_cpu_time_over_its_cores_is_spent() -> None:
    t, limits, duty = metered(0.5, cores=2)
    limits.balance = 0.0
    duty.run(t.compute, 1.0, 2.0)  # 1 s on both cores: 1 s busy of 2 cores' worth
    assert limits.owed_s() == pytest.approx((1.0 - 0.5) / 0.5)
    t.now += 2.0
    assert limits.owed_s() == 0.0
    limits.balance = 0.0
    t.jobs_cpu += 2.0  # the RPC between jobs: one core for 2 s, no compute running
    t.now += 2.0
    assert limits.owed_s() == pytest.approx(0.0, abs=1e-9)  # half of two cores for 2 s: the share exactly
    t.jobs_cpu += 1.0
    assert limits.owed_s() == pytest.approx(0.5 / 0.5)


@pytest.mark.parametrize(("share", "idle_cores"), [(0.3, 0.0), (0.3, 0.1), (0.5, 0.2)])
def test_jobs_and_idle_costs_together_use_the_share(share: float, idle_cores: float) -> None:
    t, _, duty = metered(share, cores=1, idle_cores=idle_cores)
    start, cpu = t.now, t.cpu()
    for _ in range(500):
        duty.run(t.compute, 0.05)
    assert (t.cpu() - cpu) / (t.now - start) == pytest.approx(share, rel=0.05)


@pytest.mark.parametrize(("job", "bound"), [(0.2, "floor"), (10.0, "debt")])
def test_idle_costs_over_the_share_hold_a_job_back_boundedly(
    caplog: pytest.LogCaptureFixture, job: float, bound: str
) -> None:
    """A peer made busy without training (a crowd of records to check) keeps training, at
    ``TRAINING_FLOOR`` of its share or more, and says why; a job's own cost is still paid."""
    share = 0.25
    t, limits, duty = metered(share, cores=1, idle_cores=0.5)
    with caplog.at_level(logging.WARNING, logger="swarmd.training.cells.throttle"):
        for _ in range(5):
            _, waited = duty.run(t.compute, job)
    floor = job * (1 / (share * TRAINING_FLOOR) - 1)
    debt = (job + IDLE_DEBT_S) / share
    assert waited == pytest.approx(floor if bound == "floor" else debt) and waited == pytest.approx(min(floor, debt))
    assert job / (job + waited) >= share * TRAINING_FLOOR - 1e-9
    assert caplog.text.count("cpu_share 0.25: a compute job waited") == 1  # said once, not every job


def test_a_long_jobs_own_debt_is_never_forgiven() -> None:
    t, limits, duty = metered(0.5, cores=1)
    limits.balance = 0.0
    duty.run(t.compute, 60.0)
    assert limits.owed_s() == pytest.approx(60.0 * 0.5 / 0.5)


def test_cpu_used_uncapped_is_not_owed_once_capped() -> None:
    t, limits, duty = metered(1.0, cores=1)
    duty.run(t.compute, 100.0)
    limits.set(0.5)
    assert limits.owed_s() == 0.0
    limits.meter_cpu(0)  # a GPU: compute's running time again, not the CPU
    t.jobs_cpu += 50.0
    assert limits.owed_s() == 0.0
