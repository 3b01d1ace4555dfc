"""daemon/cli/status_view.py's traffic line: sent and received, the caps, today against the daily cap."""

from __future__ import annotations

import pytest

from swarmd.cli.status_view import fmt_traffic
from swarmd.peers.wire.shaping import TrafficShaper

pytestmark = pytest.mark.timeout(30)


def test_the_traffic_line_shows_totals_caps_and_today_against_the_cap() -> None:
    shaper = TrafficShaper()
    shaper.configure(1.25e6, 0, 5 * 2**30)
    shaper.count("sent", "shard.contribute", 3 * 2**30)
    shaper.count("received", "shard.pull", 200 * 2**20)
    assert fmt_traffic(shaper.status()) == (
        "traffic   sent 3.00 GiB, received 200.0 MiB; up 10 Mbit/s, down no cap; today 3.20 GiB of 5 GiB"
    )


def test_without_caps_it_says_so() -> None:
    assert fmt_traffic(TrafficShaper().status()) == (
        "traffic   sent 0.0 MiB, received 0.0 MiB; up no cap, down no cap; today 0.0 MiB (no daily cap)"
    )
