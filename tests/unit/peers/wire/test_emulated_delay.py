"""The calibration harness's latency shim: what it accepts, what it refuses, whom it delays."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from multiaddr import Multiaddr

from swarmd.errors import SwarmdError
from swarmd.peers.wire import emulated_delay
from swarmd.peers.wire.emulated_delay import ENV_VAR, configured_delays, one_way_delay_s, parse_delays

pytestmark = pytest.mark.timeout(10)


@pytest.fixture
def delay_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str], Path]]:
    def write(content: str) -> Path:
        path = tmp_path / "delays.json"
        path.write_text(content)
        monkeypatch.setenv(ENV_VAR, str(path))
        configured_delays.cache_clear()
        return path

    yield write
    configured_delays.cache_clear()


def test_off_unless_the_environment_names_a_file(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_VAR, raising=False)
    configured_delays.cache_clear()
    assert one_way_delay_s(Multiaddr("/ip4/10.0.0.2/tcp/4000")) == 0.0


def test_delays_the_named_addresses_only(delay_file: Callable[[str], Path]) -> None:
    delay_file(json.dumps({"10.0.0.2": 0.03, "10.0.0.3": 0}))
    assert one_way_delay_s(Multiaddr("/ip4/10.0.0.2/tcp/4000")) == 0.03
    assert one_way_delay_s(Multiaddr("/ip4/10.0.0.3/tcp/4000")) == 0.0
    assert one_way_delay_s(Multiaddr("/ip4/10.0.0.9/tcp/4000")) == 0.0
    assert one_way_delay_s(Multiaddr("/ip6/::1/tcp/4000")) == 0.0  # no IPv4 in it: not emulated
    assert one_way_delay_s(None) == 0.0


@pytest.mark.parametrize(
    ("content", "says"),
    [
        ("[1, 2]", "expected an object"),
        ('{"10.0.0.2": -1}', "expected seconds in [0, 5]"),
        ('{"10.0.0.2": 60}', "expected seconds in [0, 5]"),
        ('{"10.0.0.2": "0.1"}', "delay to 10.0.0.2"),
        ('{"example.org": 0.1}', "is not an IPv4 address"),
        ("{", "not JSON"),
    ],
)
def test_refuses_what_it_cannot_use(content: str, says: str) -> None:
    with pytest.raises(SwarmdError, match=None) as e:
        parse_delays(content, "delays.json")
    assert says in str(e.value) and "delays.json" in str(e.value)


def test_an_unreadable_or_oversized_file_is_an_error_naming_it(
    delay_file: Callable[[str], Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    delay_file(" " * (emulated_delay.MAX_FILE_BYTES + 1))
    with pytest.raises(SwarmdError, match="larger than"):
        configured_delays()
    monkeypatch.setenv(ENV_VAR, str(tmp_path / "missing.json"))
    configured_delays.cache_clear()
    with pytest.raises(SwarmdError, match="missing.json: cannot read it"):
        configured_delays()
