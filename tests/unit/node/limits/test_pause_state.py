"""daemon/node/limits/pausing.py: durations as a person types them, and a pause's state over time."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from swarmd.node.limits.pausing import MAX_PAUSE_S, Pause, Pausing, limit_key, parse_duration

pytestmark = pytest.mark.timeout(10)


@pytest.mark.parametrize(("text", "seconds"), [("90", 90), ("90s", 90), ("30m", 1800), ("2h", 7200), ("1.5d", 129600)])
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "soon", "0", "-5m", "31d", "2 weeks"])
def test_bad_durations_say_the_form(text: str) -> None:
    with pytest.raises(ValueError, match="90s, 30m, 2h or 1d"):
        parse_duration(text)


def test_a_timed_pause_ends_by_itself_and_pausing_again_moves_the_end() -> None:
    pause = Pause()
    assert not pause.paused and pause.status(0.0) is None
    pause.start(100.0, 60.0, "asked by the owner")
    assert pause.status(130.0) == {"since_s": 30.0, "left_s": 30.0, "reason": "asked by the owner"}
    assert not pause.over(159.0) and pause.over(160.0)
    pause.start(150.0, None, "asked by the owner")  # until resumed: the start stays
    assert pause.since == 100.0 and not pause.over(100.0 + MAX_PAUSE_S)
    pause.stop()
    assert not pause.paused


def test_the_owners_resume_waives_the_limit_that_paused_until_it_ends() -> None:
    node = SimpleNamespace(config=SimpleNamespace(compute=SimpleNamespace(train=True)), roles=["worker"])
    node.presence, node.trainer = None, None
    pausing = Pausing(node)  # type: ignore[arg-type]
    battery = "on battery ([limits] pause_on_battery)"

    async def play() -> list[object]:
        seen: list[object] = []
        await pausing.follow_limits(battery)
        seen.append(await pausing.owner_resumes())
        await pausing.follow_limits(battery)  # still on battery: the owner said work anyway
        seen.append(pausing.pause.paused)
        await pausing.follow_limits("steam running ([limits] pause_while)")  # another limit still pauses
        seen.append(pausing.pause.paused)
        await pausing.follow_limits(None)
        await pausing.follow_limits(battery)  # the battery again, after mains: pauses anew
        seen.append(pausing.pause.paused)
        return seen

    assert asyncio.run(play()) == ["[limits] pause_on_battery", False, True, True]


def test_a_limit_key_is_read_from_its_reason_whatever_its_figures() -> None:
    assert limit_key("transfer cap reached: 1.2 of 1.0 GiB today ([limits] daily_transfer_gib)") == (
        "[limits] daily_transfer_gib"
    )
    assert limit_key("something else") == "something else"
