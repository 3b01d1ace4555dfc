"""The command line answers help and input errors before heavy imports (numpy, torch, hivemind,
asyncio), and a malformed run ID or config exits 2 wherever it comes from."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(60)

HEAVY = ("numpy", "torch", "hivemind", "asyncio", "transformers", "cryptography")

# Runs swarmd's main in a fresh interpreter (pytest's has loaded everything already) and
# prints its exit code and which heavy modules were loaded by then.
PROBE = r"""
import contextlib, io, json, sys
from swarmd.cli.main import main
err = io.StringIO()
with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
    try:
        code = main(sys.argv[1:])
    except SystemExit as e:
        code = e.code
heavy = sorted({m.split(".")[0] for m in sys.modules} & set(json.loads(HEAVY)))
print(json.dumps({"code": code, "heavy": heavy, "err": err.getvalue()}))
"""


def swarmd(*args: str) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, "-c", PROBE.replace("json.loads(HEAVY)", repr(list(HEAVY))), *args],
        capture_output=True,
        text=True,
        timeout=50,
    )
    assert out.returncode == 0, out.stderr
    result: dict[str, object] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.parametrize("args", [["--help"], ["run", "--help"], ["status", "--help"], ["export", "--help"]])
def test_help_loads_nothing_heavy(args: list[str]) -> None:
    result = swarmd(*args)
    assert result["code"] == 0 and result["heavy"] == [], result


@pytest.mark.parametrize("command", [["run"], ["export", "/tmp/never-written"], ["run", "token", "--peer", "x"]])
def test_a_malformed_run_id_is_refused_at_once_with_exit_2(command: list[str]) -> None:
    result = swarmd(*command[:1], *command[1:], "--run-id", "garbage")
    assert result["code"] == 2, result
    assert "run ID 'garbage' is malformed" in str(result["err"]), result
    assert result["heavy"] == [], result


def test_a_malformed_run_id_in_the_config_exits_2(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text('[swarm]\nrun_id = "garbage"\n')
    result = swarmd("run", "--config", str(config), "--state-dir", str(tmp_path / "state"))
    assert result["code"] == 2, result
    assert "[swarm] run_id: run ID 'garbage' is malformed" in str(result["err"]), result


def test_status_where_the_state_folder_is_closed_to_the_user_prints_the_hint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # As a user outside the daemon's group on a system install: /var/lib/swarmd is 0700, so
    # even asking whether the socket exists is refused. (Tests run as root, which no mode
    # stops, so the refusal is stood in for.)
    from swarmd.cli.main import main

    state = tmp_path / "state"
    real_exists = Path.exists

    def exists(self: Path, **kwargs: object) -> bool:
        if self.is_relative_to(state):
            raise PermissionError(13, "Permission denied", str(self))
        return real_exists(self)

    monkeypatch.setattr(Path, "exists", exists)
    assert main(["status", "--state-dir", str(state)]) == 1
    err = capsys.readouterr().err
    assert "permission denied on" in err and "run as the daemon's user" in err, err
    assert "internal error" not in err
