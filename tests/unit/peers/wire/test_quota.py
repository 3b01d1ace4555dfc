"""peers/wire/quota.py: token buckets that slow then refuse, strikes that ban for a while, the
byte budget, and the bounded table of offenders, over an injected clock."""

from __future__ import annotations

import pytest

from swarmd.peers.wire.errors import Busy, Code, OverQuota
from swarmd.peers.wire.quota import (
    ByteBudget,
    PeerQuotas,
    QuotaLimits,
    RpcCounters,
    TokenBucket,
    count_offence,
)

pytestmark = pytest.mark.timeout(10)


def test_a_bucket_lets_a_burst_through_then_makes_takers_wait_out_the_debt() -> None:
    bucket = TokenBucket(rate=10.0, burst=2.0, tokens=2.0, stamp=0.0)
    waits = []
    for _ in range(4):
        waits.append(bucket.wait_s(1, 0.0))
        bucket.take(1, 0.0)
    assert waits == [0.0, 0.0, pytest.approx(0.1), pytest.approx(0.2)]
    assert bucket.wait_s(1, 0.3) == pytest.approx(0.0)  # the debt is repaid at the rate
    assert bucket.wait_s(50, 10.0) == 0.0  # more than the burst waits for a full bucket, not forever


def test_a_peer_past_its_rate_is_slowed_then_refused_and_others_are_not() -> None:
    quotas = PeerQuotas(QuotaLimits(requests_per_s=10, request_burst=2, max_delay_s=0.25))
    delays = [quotas.request("a", 0.0) for _ in range(4)]
    assert delays == [0.0, 0.0, pytest.approx(0.1), pytest.approx(0.2)]
    with pytest.raises(OverQuota, match=r"quota of 10 requests per second here by 0.3 s"):
        quotas.request("a", 0.0)
    assert quotas.request("b", 0.0) == 0.0
    assert quotas.request("a", 1.0) == 0.0  # a refused request cost nothing: the bucket refilled


def test_bytes_are_charged_as_declared_and_a_checkpoint_within_the_burst_is_not_slowed() -> None:
    limits = QuotaLimits()
    quotas = PeerQuotas(limits)
    assert quotas.transfer("a", 300 * 1024 * 1024, 0.0) == 0.0  # a replica's checkpoint of 300 MB
    assert quotas.transfer("a", 200 * 1024 * 1024, 0.0) == 0.0  # and the log after it
    assert quotas.transfer("a", 256 * 1024 * 1024, 0.0) == pytest.approx(244 / 256)  # then slowed
    with pytest.raises(OverQuota, match="256 MiB per second"):
        quotas.transfer("a", 512 * 1024 * 1024, 0.0)


def test_requests_in_flight_are_counted_when_a_stream_opens_and_closes() -> None:
    quotas = PeerQuotas(QuotaLimits(max_in_flight=2))
    quotas.open("a", 0.0)
    quotas.open("a", 0.0)
    with pytest.raises(OverQuota, match="2 requests of yours in flight"):
        quotas.open("a", 0.0)
    quotas.open("b", 0.0)
    quotas.close("a")
    quotas.open("a", 0.0)
    assert (quotas.in_flight("a"), quotas.in_flight("b"), quotas.in_flight("c")) == (2, 1, 0)


def test_strikes_ban_a_peer_for_a_while_and_a_second_ban_lasts_twice_as_long() -> None:
    quotas = PeerQuotas(QuotaLimits(ban_after=3, strike_decay_per_s=0.1, ban_s=10, max_ban_s=15))
    assert quotas.strike("a", Code.NOT_HOLDER, 0.0) == 0.0  # churn, not a fault: never a strike
    assert [quotas.strike("a", Code.TIMEOUT, 0.0) for _ in range(3)] == [0.0, 0.0, 10.0]
    assert quotas.banned_s("a", 4.0) == pytest.approx(6.0) and quotas.banned_s("b", 4.0) == 0.0
    assert quotas.banned(4.0) == {"a": 6.0}
    assert quotas.strike("a", Code.QUOTA, 5.0) == 0.0  # strikes while banned do not stack bans
    assert quotas.banned_s("a", 10.0) == 0.0  # expired
    assert [quotas.strike("a", Code.TOO_LARGE, 20.0) for _ in range(3)] == [0.0, 0.0, 15.0]  # doubled, capped


def test_strikes_decay_so_an_occasional_fault_never_bans() -> None:
    quotas = PeerQuotas(QuotaLimits(ban_after=3, strike_decay_per_s=0.5))
    assert all(quotas.strike("a", Code.BAD_REQUEST, 2.0 * t) == 0.0 for t in range(100))
    newcomer = [quotas.strike("n", Code.NOT_MEMBER, 0.0) for _ in range(11)]
    assert newcomer == [0.0] * 11  # a newcomer refused before the scan sees it: a quarter each


def test_the_table_forgets_the_longest_idle_peer_before_a_banned_one_and_never_one_in_flight() -> None:
    quotas = PeerQuotas(QuotaLimits(max_peers=3, ban_after=1, ban_s=100))
    quotas.open("busy", 0.0)
    quotas.strike("banned", Code.TIMEOUT, 1.0)
    quotas.request("idle", 2.0)
    quotas.request("new", 3.0)  # the table is full: the idle one goes
    assert quotas.in_flight("busy") == 1 and quotas.banned_s("banned", 3.0) > 0
    quotas.open("new", 3.0)
    quotas.request("newer", 4.0)  # none idle but the banned one, which goes
    assert quotas.in_flight("busy") == 1 and quotas.in_flight("new") == 1 and quotas.banned_s("banned", 4.0) == 0.0


def test_the_byte_budget_refuses_busy_past_its_total_and_past_one_peers_share() -> None:
    budget = ByteBudget(total=1000, per_peer=600)
    budget.reserve("a", 500)
    with pytest.raises(Busy, match="hold 700 bytes, over your share of 600"):
        budget.reserve("a", 200)
    budget.reserve("b", 400)
    with pytest.raises(Busy, match="900 bytes of requests are held here"):
        budget.reserve("c", 101)
    budget.release("a", 500)
    budget.reserve("c", 101)
    assert budget.held == 501
    with pytest.raises(ValueError, match="per_peer"):
        ByteBudget(total=10, per_peer=11)


def test_the_offenders_table_keeps_the_top_offenders_under_a_flood_of_fresh_keys() -> None:
    table: dict[str, dict[str, int]] = {}
    for _ in range(5):
        count_offence(table, "mallory", Code.QUOTA, limit=3)
    count_offence(table, "mallory", Code.TIMEOUT, limit=3)
    for i in range(100):
        count_offence(table, f"sybil-{i}", Code.NOT_MEMBER, limit=3)
    assert len(table) == 3 and table["mallory"] == {"QUOTA": 5, "TIMEOUT": 1}


def test_counters_show_refusals_by_code_and_peer_and_the_latest_bans() -> None:
    counters = RpcCounters()
    counters.refuse(Code.NOT_MEMBER, "x")
    counters.refuse(Code.NOT_MEMBER, "y")
    counters.ban("x", 4e9)
    counters.ban("old", 1.0)  # an expired ban is dropped at the next one
    counters.ban("y", 4e9)
    assert counters.refused == {"NOT_MEMBER": 2} and counters.offenders == {
        "x": {"NOT_MEMBER": 1},
        "y": {"NOT_MEMBER": 1},
    }
    assert counters.banned == {"x": 4e9, "y": 4e9}


@pytest.mark.parametrize(
    ("fields", "why"),
    [
        ({"max_in_flight": 0}, "max_in_flight = 0 must be at least 1"),
        ({"bytes_per_s": float("inf")}, "bytes_per_s = inf must be a finite number above 0"),
        ({"max_delay_s": 61}, "max_delay_s = 61"),
        ({"ban_s": 100, "max_ban_s": 10}, "max_ban_s = 10 is below ban_s = 100"),
    ],
)
def test_limits_that_make_no_sense_are_refused_naming_the_field(fields: dict[str, float], why: str) -> None:
    with pytest.raises(ValueError, match=why):
        QuotaLimits(**fields)  # type: ignore[arg-type]
