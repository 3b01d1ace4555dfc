"""daemon/node/limits/traffic.py: the daily transfer cap's reason to pause, and today's bytes
kept in the state directory across a restart."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import pytest

from swarmd.config import LimitsConfig
from swarmd.node.limits.auto_pause import limits_reason
from swarmd.node.limits.traffic import DAY_FILENAME, TrafficDay, transfer_cap_reason
from swarmd.peers.wire.shaping import TrafficShaper

pytestmark = pytest.mark.timeout(30)

GIB = 2**30
NOON = time.mktime((2024, 5, 1, 12, 0, 0, 0, 0, -1))


class WallClock:
    def __init__(self) -> None:
        self.t = NOON

    def __call__(self) -> float:
        return self.t


def shaper_at(wall: WallClock) -> TrafficShaper:
    return TrafficShaper(wall=wall)


def test_the_cap_reached_pauses_until_the_day_turns() -> None:
    wall = WallClock()
    shaper = shaper_at(wall)
    limits = LimitsConfig(daily_transfer_gib=2.0)
    shaper.count("sent", "shard.contribute", GIB)
    assert transfer_cap_reason(limits, shaper) is None
    shaper.count("received", "shard.pull", GIB + 100 * 2**20)
    assert transfer_cap_reason(limits, shaper) == (
        "transfer cap reached: 2.1 of 2 GiB today; resumes at midnight ([limits] daily_transfer_gib)"
    )
    assert transfer_cap_reason(LimitsConfig(), shaper) is None  # no cap
    wall.t += 12 * 3600 + 1  # local midnight
    assert transfer_cap_reason(limits, shaper) is None


def test_the_cap_is_a_reason_to_pause_of_limits_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    from swarmd.node.limits import traffic as traffic_limits

    shaper = shaper_at(WallClock())
    shaper.count("sent", "x", GIB)
    monkeypatch.setattr(traffic_limits, "TRAFFIC", shaper)
    reason = limits_reason(LimitsConfig(daily_transfer_gib=1.0, pause_on_battery=False, pause_while_gpu_used=False))
    assert reason is not None and reason.startswith("transfer cap reached: 1.0 of 1 GiB today")


def test_todays_bytes_outlive_a_restart(tmp_path: Path) -> None:
    wall = WallClock()
    before = shaper_at(wall)
    kept = TrafficDay(tmp_path, before)
    kept.load()
    before.count("sent", "x", 12345)
    kept.save()
    assert json.loads((tmp_path / DAY_FILENAME).read_text()) == {"date": "2024-05-01", "bytes": 12345}

    after = shaper_at(wall)  # the daemon restarted the same day
    again = TrafficDay(tmp_path, after)
    again.load()
    after.count("received", "x", 5)
    assert after.today() == ("2024-05-01", 12350)
    again.save()
    assert json.loads((tmp_path / DAY_FILENAME).read_text())["bytes"] == 12350

    wall.t += 86400  # started again the next day: yesterday's bytes count for nothing
    tomorrow = shaper_at(wall)
    TrafficDay(tmp_path, tomorrow).load()
    assert tomorrow.today() == ("2024-05-02", 0)


def test_nothing_is_saved_before_the_file_is_read(tmp_path: Path) -> None:
    (tmp_path / DAY_FILENAME).write_text(json.dumps({"date": "2024-05-01", "bytes": 999}))
    TrafficDay(tmp_path, shaper_at(WallClock())).save()  # a start that failed before loading
    assert json.loads((tmp_path / DAY_FILENAME).read_text())["bytes"] == 999


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("not json", "not JSON"),
        ("[1, 2]", "not an object"),
        ('{"date": "May 1st", "bytes": 5}', "is not YYYY-MM-DD"),
        ('{"date": "2024-05-01", "bytes": -5}', "is not a count of bytes"),
        ('{"date": "2024-05-01", "bytes": 5.5}', "is not a count of bytes"),
        ('{"date": 20240501, "bytes": 5}', "is not a string"),
        ("{" + " " * 5000 + "}", "larger than 4096 bytes"),
    ],
)
def test_a_damaged_file_counts_for_nothing_and_says_why(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, text: str, why: str
) -> None:
    (tmp_path / DAY_FILENAME).write_text(text)
    shaper = shaper_at(WallClock())
    kept = TrafficDay(tmp_path, shaper)
    with caplog.at_level(logging.WARNING):
        kept.load()
    assert shaper.today() == ("2024-05-01", 0) and why in caplog.text
    kept.save()  # and is replaced by a good one
    assert json.loads((tmp_path / DAY_FILENAME).read_text()) == {"date": "2024-05-01", "bytes": 0}
