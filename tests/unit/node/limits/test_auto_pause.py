"""daemon/node/limits/auto_pause.py and its use by pausing.py: [limits]'s reasons to pause, and a pause
they began ending when they no longer hold (never the owner's)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

import pytest

from swarmd.config import ConfigError, LimitsConfig, parse_window
from swarmd.node.limits.auto_pause import in_windows, on_battery, pause_reason, running
from swarmd.node.limits.pausing import Pausing

pytestmark = pytest.mark.timeout(10)


def minute(hhmm: str) -> int:
    h, m = hhmm.split(":")
    return int(h) * 60 + int(m)


def test_windows_hold_their_minutes_and_span_midnight() -> None:
    night = parse_window("22:00-07:30")
    assert night.holds(minute("23:59")) and night.holds(minute("00:00")) and night.holds(minute("07:29"))
    assert not night.holds(minute("07:30")) and not night.holds(minute("12:00"))
    day = parse_window("9:00-24:00")
    assert day.holds(minute("23:59")) and not day.holds(minute("08:59"))
    assert in_windows([], minute("12:00"))  # no windows: any time
    assert in_windows([night, parse_window("12:00-13:00")], minute("12:30"))


@pytest.mark.parametrize("text", ["22-07", "25:00-01:00", "10:00-10:00", "10:61-11:00"])
def test_bad_windows_are_refused_with_the_form(text: str) -> None:
    with pytest.raises(ConfigError, match=r"\[limits\] windows"):
        LimitsConfig(windows=[text])


def supply(root: Path, name: str, kind: str, online: str | None = None) -> None:
    (root / name).mkdir(parents=True)
    (root / name / "type").write_text(kind + "\n")
    if online is not None:
        (root / name / "online").write_text(online + "\n")


def test_battery_means_a_battery_and_no_mains(tmp_path: Path) -> None:
    assert not on_battery(tmp_path / "none")  # a desktop: no supplies listed
    supply(tmp_path, "BAT0", "Battery")
    supply(tmp_path, "AC", "Mains", online="0")
    assert on_battery(tmp_path)
    (tmp_path / "AC" / "online").write_text("1\n")
    assert not on_battery(tmp_path)


def test_listed_programs_are_found_by_name_whatever_the_case() -> None:
    assert running(["Steam", "blender"], ["bash", "steam", "python3"]) == ["Steam"]
    assert running([], ["steam"]) == []


def test_the_first_reason_is_named() -> None:
    night = [parse_window("22:00-07:00")]
    assert pause_reason(night, minute("12:00"), True, True, ["steam"]) == "outside the time windows of [limits] windows"
    assert pause_reason(night, minute("23:00"), True, True, []) == "on battery ([limits] pause_on_battery)"
    assert pause_reason(night, minute("23:00"), False, True, ["steam"]) == "steam running ([limits] pause_while)"
    assert pause_reason(night, minute("23:00"), True, False, []) is None


def test_a_pause_the_limits_began_ends_with_them_but_the_owners_does_not() -> None:
    node = SimpleNamespace(config=SimpleNamespace(compute=SimpleNamespace(train=True)), roles=["worker"])
    node.presence, node.trainer = None, None
    pausing = Pausing(node)  # type: ignore[arg-type]

    async def play() -> list[bool]:
        seen = []
        await pausing.follow_limits("on battery ([limits] pause_on_battery)")
        seen.append(pausing.pause.paused and node.roles == ["paused"])
        await pausing.follow_limits(None)  # plugged in again
        seen.append(not pausing.pause.paused and node.roles == ["worker"])
        await pausing.owner_pauses(None)
        await pausing.follow_limits(None)  # the owner's pause stays
        seen.append(pausing.pause.paused and pausing.pause.reason == "asked by the owner")
        return seen

    assert asyncio.run(play()) == [True, True, True]
