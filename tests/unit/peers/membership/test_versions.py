"""peers/membership/versions.py: whether peers run a newer swarmd, and the status line saying so."""

from __future__ import annotations

import pytest

from swarmd.cli.status_view import fmt_newer_version
from swarmd.peers.membership.versions import newer_in_swarm, parse_version

pytestmark = pytest.mark.timeout(10)


def test_versions_compare_by_their_numbers() -> None:
    assert parse_version("0.10.0") > parse_version("0.9.3")  # type: ignore[operator]
    assert parse_version("1.2.0rc1") == (1, 2, 0) and parse_version("garbage") is None


def test_the_newest_of_the_newer_and_how_many_run_one() -> None:
    found = newer_in_swarm("0.1.0", ["0.1.0", "0.2.0", "0.10.1", "x", "0.0.9"])
    assert found is not None and (found.newest, found.peers, found.of) == ("0.10.1", 2, 4)
    assert newer_in_swarm("0.2.0", ["0.1.0", "0.2.0"]) is None
    assert newer_in_swarm("0.1.0", []) is None


def test_status_warns_only_when_a_peer_runs_a_newer_version() -> None:
    line = fmt_newer_version("0.1.0", [{"version": "0.1.0"}, {"version": "0.3.0"}])
    assert line == "WARNING   1 of 2 peer(s) run a newer swarmd (up to 0.3.0; this is 0.1.0): upgrade"
    assert fmt_newer_version("0.3.0", [{"version": "0.1.0"}]) == ""
