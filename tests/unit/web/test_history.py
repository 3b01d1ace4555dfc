"""daemon/web/history.py: the dashboard's ring of samples: bounded, rates from consecutive samples."""

from __future__ import annotations

from typing import Any

import pytest

from swarmd.web.history import History

pytestmark = pytest.mark.timeout(10)


def status(updates: int, loss: float | None = 3.0, tokens: float | None = 1000.0, peers: int = 2) -> dict[str, Any]:
    training = {"updates": updates, "loss": loss, "tokens_per_s": tokens}
    return {"training": training, "peers": [{"peer_id": f"p{i}"} for i in range(peers)]}


def test_a_sample_holds_the_status_figures_and_the_update_rate_since_the_last() -> None:
    history = History(capacity=10)
    first = history.record(status(10), now=100.0)
    assert (first.loss, first.tokens_per_s, first.updates, first.peers) == (3.0, 1000.0, 10, 2)
    assert first.updates_per_min is None  # nothing to measure a rate against
    second = history.record(status(40, loss=2.5, peers=3), now=130.0)
    assert second.updates_per_min == 60.0  # 30 updates in 30 s
    assert [s["loss"] for s in history.samples()] == [3.0, 2.5]


def test_the_ring_keeps_the_newest_samples_only() -> None:
    history = History(capacity=3)
    for i in range(7):
        history.record(status(i), now=float(i))
    assert len(history) == 3
    assert [s["t"] for s in history.samples()] == [4.0, 5.0, 6.0]


def test_a_peer_without_training_or_stage_zero_gives_no_figures_and_no_negative_rate() -> None:
    history = History(capacity=5)
    history.record(status(50), now=0.0)
    # It stopped holding stage 0: it sees 0 updates, which is not the model going backwards.
    dropped = history.record(status(0, loss=None, tokens=None), now=10.0)
    assert (dropped.loss, dropped.tokens_per_s, dropped.updates_per_min) == (None, None, 0.0)
    idle = history.record({"training": None, "peers": []}, now=20.0)
    assert (idle.updates, idle.loss, idle.peers) == (0, None, 0)


def test_a_peer_holding_a_later_stage_counts_its_updates_there() -> None:
    history = History(capacity=5)
    later = {"updates": 0, "cells": [{"weights": {"versions": [30]}}], "shards": [{"version": 31}]}
    history.record({"training": later, "peers": []}, now=0.0)
    sample = history.record({"training": {**later, "shards": [{"version": 41}]}, "peers": []}, now=60.0)
    assert (sample.updates, sample.updates_per_min) == (41, 10.0)


def test_a_ring_too_small_to_draw_a_curve_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 2"):
        History(capacity=1)
