"""``swarmd config``: the line editor (comments kept, keys and sections added, bad values
refused before anything is written) and the command's parsing."""

from __future__ import annotations

import os
import stat
import tomllib
from pathlib import Path

import pytest

from swarmd.cli import config_command
from swarmd.cli.config_command import check_text, parse_value, set_key, show, toml_value
from swarmd.cli.main import main
from swarmd.config import Config
from swarmd.errors import ConfigError

pytestmark = pytest.mark.timeout(30)

FILE = """# my swarmd config
[swarm]
run_id = "demo.aaaaaaaaaaaaaaaaaaaaaaaa"  # the run

[limits]
# how much CPU
cpu_share = 1.0   # all of it
windows = [
  "22:00-07:00",  # nights
]

# the next section
[probes]
interval_s = 60
"""


def test_a_key_is_replaced_in_its_section_with_every_comment_kept() -> None:
    out = set_key(FILE, "limits", "cpu_share", 0.5)
    assert out == FILE.replace("cpu_share = 1.0   # all of it", "cpu_share = 0.5  # all of it")


def test_a_value_over_several_lines_is_replaced_whole() -> None:
    out = set_key(FILE, "limits", "windows", ["08:00-18:00"])
    assert 'windows = ["08:00-18:00"]\n\n# the next section' in out
    assert tomllib.loads(out)["limits"]["windows"] == ["08:00-18:00"]
    assert "# how much CPU" in out and "# nights" not in out


def test_a_missing_key_is_added_at_its_sections_end() -> None:
    out = set_key(FILE, "limits", "torch_threads", 2)
    assert out.index("torch_threads = 2") < out.index("# the next section")
    assert tomllib.loads(out)["limits"]["torch_threads"] == 2
    assert out.count("\n") == FILE.count("\n") + 1


def test_a_missing_section_is_added() -> None:
    out = set_key(FILE, "dashboard", "listen", "127.0.0.1:9470")
    assert out.startswith(FILE.rstrip())
    assert tomllib.loads(out)["dashboard"] == {"listen": "127.0.0.1:9470"}
    assert set_key("", "limits", "cpu_share", 0.5) == "[limits]\ncpu_share = 0.5\n"


def test_a_hash_inside_a_string_is_not_a_comment() -> None:
    text = '[dashboard]\nlisten = "a#b"  # where\n'
    assert set_key(text, "dashboard", "listen", "x") == '[dashboard]\nlisten = "x"  # where\n'


def test_values_are_read_as_toml_else_as_text() -> None:
    assert parse_value("0.5") == 0.5 and parse_value("true") is True and parse_value("[1, 2]") == [1, 2]
    assert parse_value("127.0.0.1:9470") == "127.0.0.1:9470"
    assert parse_value('"quoted"') == "quoted"
    for value in (0.5, True, 3, 'a "b" ü', ["x", "y"]):
        assert tomllib.loads(f"v = {toml_value(value)}")["v"] == value


def test_the_result_is_checked_as_the_daemon_loads_it() -> None:
    with pytest.raises(ConfigError, match=r"cpu_share = 2.0 must be in \(0, 1\]"):
        check_text(set_key(FILE, "limits", "cpu_share", 2.0), "f")
    with pytest.raises(ConfigError, match="should be a float, not str"):
        check_text(set_key(FILE, "limits", "cpu_share", "half"), "f")
    assert check_text(set_key(FILE, "limits", "cpu_share", 0.25), "f").limits.cpu_share == 0.25


def test_show_is_toml_that_loads_back_to_the_same_config() -> None:
    from swarmd.config import config_from_dict

    text = show(Config())
    assert config_from_dict(tomllib.loads(text)) == Config()


def swarmd(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def config_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in list(os.environ):
        if name.startswith("SWARMD_"):
            monkeypatch.delenv(name)
    path = tmp_path / "config.toml"
    path.write_text(FILE.replace("[probes]", f'[node]\nstate_dir = "{tmp_path / "state"}"\n\n[probes]'))
    path.chmod(0o640)
    return path


def test_set_edits_the_file_keeps_its_mode_and_says_no_daemon_runs(
    config_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = swarmd(capsys, "config", "set", "limits.cpu_share", "0.5", "--config", str(config_file))
    assert code == 0, out
    assert "[limits] cpu_share = 0.5" in out and "no daemon runs here" in out
    assert "cpu_share = 0.5  # all of it" in config_file.read_text()
    assert stat.S_IMODE(config_file.stat().st_mode) == 0o640
    assert [p.name for p in config_file.parent.iterdir() if p.name.startswith(".config")] == []
    assert swarmd(capsys, "config", "get", "limits.cpu_share", "--config", str(config_file))[1] == "0.5\n"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["set", "limits.cpu_share", "2"], "must be in (0, 1]"),
        (["set", "limits.cpu_shares", "0.5"], "[limits] has no key 'cpu_shares'"),
        (["set", "nosuch.key", "1"], "is not SECTION.KEY"),
        (["set", "limits.cpu_share"], "needs a VALUE"),
        (["get", "limits.cpu_share", "0.5"], "takes no VALUE"),
        (["show", "limits"], "takes no SECTION.KEY"),
    ],
)
def test_errors_exit_2_with_the_fix_and_leave_the_file_untouched(
    config_file: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    before = config_file.read_text()
    code, _, err = swarmd(capsys, "config", *argv, "--config", str(config_file))
    assert code == 2 and message in err, err
    assert config_file.read_text() == before


def test_reload_without_a_daemon_says_so(config_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = swarmd(capsys, "config", "reload", "--config", str(config_file))
    assert code == 1 and "no daemon is running" in err


def test_no_file_to_edit_is_refused(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("SWARMD_CONFIG", raising=False)
    monkeypatch.setattr(config_command, "SYSTEM_CONFIG", Path("/nonexistent/config.toml"))
    code, _, err = swarmd(capsys, "config", "set", "limits.cpu_share", "0.5")
    assert code == 2 and "no config file to edit" in err
