"""models/lr_schedule.py: the warm-up, the cosine decay and its floor, and what is refused."""

from __future__ import annotations

import math

import pytest

from swarmd.models.lr_schedule import LrSchedule

pytestmark = pytest.mark.timeout(10)


def test_the_warmup_rises_linearly_to_the_peak_and_stays_without_a_decay() -> None:
    s = LrSchedule(0.01, warmup_steps=4)
    assert [s.at(i) for i in range(6)] == pytest.approx([0.0025, 0.005, 0.0075, 0.01, 0.01, 0.01])
    assert not s.constant and LrSchedule(0.01).constant and LrSchedule(0.01).at(10**9) == 0.01


def test_the_cosine_comes_down_to_its_floor_by_decay_steps_and_keeps_it() -> None:
    s = LrSchedule(1.0, warmup_steps=10, decay_steps=110, min_lr_ratio=0.1)
    assert s.at(9) == 1.0 and s.at(10) == 1.0
    assert s.at(60) == pytest.approx(0.1 + 0.9 * 0.5)  # halfway: the cosine's midpoint
    assert s.at(35) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi / 4)))
    assert s.at(110) == s.at(10**6) == pytest.approx(0.1)
    rates = [s.at(i) for i in range(10, 111)]
    assert all(b <= a for a, b in zip(rates, rates[1:], strict=False))  # never rises while it decays


@pytest.mark.parametrize(
    ("kw", "words"),
    [
        ({"warmup_steps": 10, "decay_steps": 10}, "must exceed warmup_steps"),
        ({"warmup_steps": -1}, "must be >= 0"),
        ({"min_lr_ratio": 1.5}, "must be in [0, 1]"),
        ({"lr": float("nan")}, "finite"),
    ],
)
def test_a_schedule_that_cannot_be_is_refused_naming_the_setting(kw: dict[str, float], words: str) -> None:
    with pytest.raises(ValueError, match=words.replace("[", r"\[").replace("]", r"\]")):
        LrSchedule(**{"lr": 0.01, **kw})  # type: ignore[arg-type]
