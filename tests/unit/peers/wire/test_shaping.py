"""peers/wire/shaping.py: the token buckets' arithmetic on an injected clock, caps changed live,
bytes counted by method and by local day (tests/unit/peers/wire/test_shaped_rpc.py drives the
request server and client through it)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable
from types import SimpleNamespace

import pytest

from swarmd.peers.wire.shaping import (
    MAX_METHODS,
    MIN_BURST_BYTES,
    OTHER_METHOD,
    TrafficBucket,
    TrafficShaper,
    apply_traffic_limits,
    mbit_to_Bps,
)

pytestmark = pytest.mark.timeout(30)

MiB = 1024 * 1024
LATE_EVENING = time.mktime((2024, 5, 1, 23, 58, 0, 0, 0, -1))
"""Local time, two minutes before midnight."""


class ShaperClock:
    """Monotonic and wall time that move only when a waiter sleeps (or a test says so)."""

    def __init__(self) -> None:
        self.t = 100.0
        self.wall_t = LATE_EVENING
        self.on_sleep: list[tuple[float, object]] = []

    def clock(self) -> float:
        return self.t

    def wall(self) -> float:
        return self.wall_t

    async def sleep(self, seconds: float) -> None:
        self.t += seconds
        await asyncio.sleep(0)  # sync-ok: a fake clock's nap yields, as on a real loop


def shaper_with(up_Bps: float = 0.0, down_Bps: float = 0.0) -> tuple[TrafficShaper, ShaperClock]:
    c = ShaperClock()
    shaper = TrafficShaper(clock=c.clock, wall=c.wall, sleep=c.sleep)
    shaper.configure(up_Bps, down_Bps)
    return shaper, c


async def send_chunks(shaper: TrafficShaper, total: int, method: str = "shard.contribute") -> None:
    for offset in range(0, total, MiB):
        await shaper.send(method, min(MiB, total - offset))


def elapsed(c: ShaperClock, work: Awaitable[None]) -> float:
    start = c.t

    async def run() -> None:
        await work

    asyncio.run(run())
    return c.t - start


@pytest.mark.parametrize("rate_Bps", [mbit_to_Bps(4), 3 * MiB, 50 * MiB])
def test_a_cap_of_R_bytes_a_second_passes_N_bytes_in_N_over_R_seconds_after_a_burst(rate_Bps: float) -> None:
    shaper, c = shaper_with(up_Bps=rate_Bps)
    burst = max(rate_Bps, MIN_BURST_BYTES)
    total = int(3 * burst) + 7 * MiB
    assert elapsed(c, send_chunks(shaper, total)) == pytest.approx((total - burst) / rate_Bps, rel=1e-6)
    assert shaper.status()["waited_s"]["sent"] == pytest.approx((total - burst) / rate_Bps, abs=1e-3)


def test_no_cap_lets_everything_go_at_once() -> None:
    shaper, c = shaper_with()
    assert elapsed(c, send_chunks(shaper, 500 * MiB)) == 0.0


def test_credit_banked_while_quiet_is_at_most_the_burst() -> None:
    shaper, c = shaper_with(up_Bps=MiB)
    c.t += 3600  # an hour idle banks one second's worth, not an hour's
    assert elapsed(c, send_chunks(shaper, 10 * MiB)) == pytest.approx(9.0)


def test_a_new_cap_applies_to_bytes_already_waiting() -> None:
    shaper, c = shaper_with(up_Bps=MiB)

    async def raise_at_two_s() -> None:
        while c.t < 102.0:  # 2 s into a 10 s wait at 1 MiB/s
            await asyncio.sleep(0)  # sync-ok: yields until the fake clock reaches the moment
        shaper.configure(4 * MiB, 0)

    async def both() -> None:
        await shaper.send("x", MiB)  # the burst
        await asyncio.gather(shaper.send("x", 10 * MiB), raise_at_two_s())

    # 2 s at 1 MiB/s, then the other 8 MiB at 4 MiB/s: 4 s, not 10.
    assert elapsed(c, both()) == pytest.approx(4.0)


def test_lifting_the_cap_releases_every_waiting_byte() -> None:
    shaper, c = shaper_with(down_Bps=MiB)

    async def lift() -> None:
        while c.t < 101.0:
            await asyncio.sleep(0)  # sync-ok: yields until the fake clock reaches the moment
        shaper.configure(0, 0)

    async def both() -> None:
        await asyncio.gather(shaper.pace("received", 100 * MiB), lift())

    assert elapsed(c, both()) == pytest.approx(1.0)


def test_concurrent_transfers_share_the_rate_chunk_by_chunk() -> None:
    shaper, c = shaper_with(up_Bps=MiB)
    done: dict[str, float] = {}

    async def transfer(name: str) -> None:
        await send_chunks(shaper, 5 * MiB, name)
        done[name] = c.t - 100.0

    async def both() -> None:
        await asyncio.gather(transfer("a"), transfer("b"))

    elapsed(c, both())
    # Served one after the other, "a" would be done at 4 s; shared, both finish near the end
    # ("a" took its second chunk before "b" asked: the order of asking is the order served).
    assert done["a"] == pytest.approx(7.0) and done["b"] == pytest.approx(9.0)


def test_a_header_charged_without_waiting_makes_later_bytes_wait_for_it() -> None:
    shaper, c = shaper_with(up_Bps=MiB)
    shaper.charge("sent", "x", 3 * MiB)  # 2 MiB past the burst, counted at once
    assert elapsed(c, shaper.pace("sent", MiB)) == pytest.approx(3.0)
    assert shaper.status()["sent_bytes"] == 3 * MiB


def test_bytes_are_counted_by_method_direction_and_in_total() -> None:
    shaper, c = shaper_with()
    asyncio.run(send_chunks(shaper, 3 * MiB, "shard.contribute"))
    shaper.count("received", "shard.pull", 5000)
    shaper.charge("received", "shard.contribute", 40)
    status = shaper.status()
    assert status["by_method"] == {
        "shard.contribute": {"sent": 3 * MiB, "received": 40},
        "shard.pull": {"sent": 0, "received": 5000},
    }
    assert (status["sent_bytes"], status["received_bytes"]) == (3 * MiB, 5040)
    assert status["today"] == {"date": "2024-05-01", "bytes": 3 * MiB + 5040}
    json.dumps(status)  # the control socket sends it as it is


def test_methods_past_the_limit_are_counted_together() -> None:
    shaper, _ = shaper_with()
    for i in range(MAX_METHODS + 5):
        shaper.count("received", f"made.up.{i}", 1)
    by_method = shaper.status()["by_method"]
    assert len(by_method) == MAX_METHODS + 1 and by_method[OTHER_METHOD]["received"] == 5


def test_the_day_starts_afresh_at_local_midnight_and_totals_stay() -> None:
    shaper, c = shaper_with()
    shaper.count("sent", "x", 1000)
    assert shaper.today() == ("2024-05-01", 1000)
    c.wall_t += 180  # past midnight
    assert shaper.today() == ("2024-05-02", 0)
    shaper.count("received", "x", 7)
    assert shaper.today() == ("2024-05-02", 7) and shaper.status()["received_bytes"] == 7
    assert shaper.status()["sent_bytes"] == 1000


def test_a_restored_day_counts_only_if_it_is_today() -> None:
    shaper, _ = shaper_with()
    shaper.restore_day("2024-04-30", 10**9)
    shaper.restore_day("2024-05-01", 5000)
    shaper.count("sent", "x", 1)
    assert shaper.today() == ("2024-05-01", 5001)
    assert shaper.status()["sent_bytes"] == 1  # since this process started


def test_limits_in_mbit_become_bytes_a_second() -> None:
    shaper, _ = shaper_with()
    apply_traffic_limits(SimpleNamespace(upload_mbit_s=8.0, download_mbit_s=0.0, daily_transfer_gib=1.5), shaper)
    assert shaper.caps_Bps() == (1e6, 0.0)
    assert shaper.status()["daily_cap_bytes"] == 3 * 2**29


def test_a_smaller_burst_trims_credit_banked_under_the_larger() -> None:
    bucket = TrafficBucket(now=0.0)
    bucket.set_rate(10 * MiB, 0.0)  # starts full: 10 MiB of credit
    bucket.set_rate(MiB, 0.0)
    ticket = bucket.reserve(3 * MiB, 0.0)
    assert bucket.wait_s(ticket, 0.0) == pytest.approx(2.0)
    with pytest.raises(ValueError, match="give 0"):
        bucket.set_rate(-1, 0.0)
