"""The files in packaging/: the systemd unit, install.sh, the example config and the Containerfile."""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from swarmd.config import _SECTIONS, load_config

PACKAGING = Path(__file__).resolve().parents[2] / "packaging"
UNIT = PACKAGING / "swarmd.service"
INSTALL = PACKAGING / "install.sh"
EXAMPLE_CONFIG = PACKAGING / "config.example.toml"
DEFAULT_EXEC = "/opt/swarmd/venv/bin/swarmd"

# The schema the daemon's config loader reads; the example must name exactly these keys.
# The example must name every key the config schema has, and only those.
CONFIG_KEYS = {name: {f.name for f in dataclasses.fields(cls)} for name, cls in _SECTIONS.items()}

needs_bash = pytest.mark.skipif(shutil.which("bash") is None, reason="bash is not installed")


def _unit_settings(text: str) -> dict[str, list[str]]:
    """``Key`` -> its values in order, over all sections (keys do not repeat across ours)."""
    settings: dict[str, list[str]] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";", "[")):
            continue
        key, _, value = line.partition("=")
        settings.setdefault(key.strip(), []).append(value.strip())
    return settings


def _verify_env() -> dict[str, str]:
    env = dict(os.environ)
    # Default log level, so that warnings about our unit are printed, whatever the caller set.
    env.pop("SYSTEMD_LOG_LEVEL", None)
    return env


def _unit_with_exec(tmp_path: Path, text: str) -> Path:
    """The unit, with ExecStart= pointing at a binary that exists here (verify checks it)."""
    venv_swarmd = Path(sys.executable).parent / "swarmd"
    binary = str(venv_swarmd) if venv_swarmd.exists() else (shutil.which("true") or "/bin/true")
    path = tmp_path / "swarmd.service"
    path.write_text(text.replace(f"ExecStart={DEFAULT_EXEC} ", f"ExecStart={binary} "))
    return path


def _systemd_analyze_verify(unit: Path) -> subprocess.CompletedProcess[str]:
    systemd_analyze = shutil.which("systemd-analyze")
    if systemd_analyze is None:
        pytest.skip("systemd-analyze is not installed (apt-get install systemd)")
    return subprocess.run(
        [systemd_analyze, "verify", "--man=no", str(unit)],
        capture_output=True,
        text=True,
        timeout=30,
        env=_verify_env(),
        cwd=unit.parent,
    )


def _install(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(INSTALL), *args],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "PYTHON": sys.executable, **(env or {})},
    )


# --- the unit ---------------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_unit_verifies_cleanly(tmp_path: Path) -> None:
    unit = _unit_with_exec(tmp_path, UNIT.read_text())
    result = _systemd_analyze_verify(unit)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    # Unknown keys and bad values are only warnings (exit status 0), named "swarmd.service:N:".
    assert "swarmd.service:" not in output, output


@pytest.mark.timeout(60)
def test_verify_catches_a_bad_unit(tmp_path: Path) -> None:
    # Guards the test above: this systemd prints warnings in the form that test looks for.
    broken = UNIT.read_text().replace("NoNewPrivileges=yes", "NoNewPrivileges=yes\nNoSuchSetting=1")
    unit = _unit_with_exec(tmp_path, broken)
    result = _systemd_analyze_verify(unit)
    assert "swarmd.service:" in result.stdout + result.stderr


@pytest.mark.timeout(60)
def test_unit_settings() -> None:
    settings = _unit_settings(UNIT.read_text())
    expected = {
        "Type": "notify",
        "NotifyAccess": "main",
        "User": "swarmd",
        "Group": "swarmd",
        "StateDirectory": "swarmd",
        "StateDirectoryMode": "0700",
        "ConfigurationDirectory": "swarmd",
        "ExecStart": f"{DEFAULT_EXEC} run --config /etc/swarmd/config.toml",
        "Restart": "on-failure",
        "WatchdogSec": "120",
        "TimeoutStopSec": "45",
        "KillMode": "mixed",
        "NoNewPrivileges": "yes",
        "ProtectSystem": "strict",
        "ProtectHome": "yes",
        "PrivateTmp": "yes",
        "SupplementaryGroups": "video render",
        "RestrictAddressFamilies": "AF_UNIX AF_INET AF_INET6 AF_NETLINK",
        "WantedBy": "multi-user.target",
        "Nice": "10",  # compute yields to the owner's programs
        "CPUWeight": "20",
        "IOSchedulingClass": "best-effort",
        "IOSchedulingPriority": "7",
    }
    for key, value in expected.items():
        assert settings.get(key) == [value], key
    assert "PYTHONUNBUFFERED=1" in settings["Environment"]
    assert "network-online.target" in settings["After"][0]
    assert "network-online.target" in settings["Wants"][0]
    # Each of these hides or breaks the GPU (see the comments in the unit).
    for forbidden in ("PrivateDevices", "MemoryDenyWriteExecute", "DeviceAllow", "DevicePolicy"):
        assert forbidden not in settings, forbidden
    assert settings.get("ProtectClock", ["no"]) == ["no"]


# --- install.sh -------------------------------------------------------------------------------


@needs_bash
@pytest.mark.timeout(60)
def test_install_script_syntax() -> None:
    result = subprocess.run(["bash", "-n", str(INSTALL)], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr


@needs_bash
@pytest.mark.timeout(60)
def test_install_help_and_bad_argument() -> None:
    result = _install("--help")
    assert result.returncode == 0, result.stderr
    assert "--dry-run" in result.stdout and "--root" in result.stdout
    result = _install("--no-such-flag")
    assert result.returncode != 0
    assert "--no-such-flag" in result.stderr


@needs_bash
@pytest.mark.timeout(60)
def test_install_into_root(tmp_path: Path) -> None:
    result = _install("--root", str(tmp_path), "--no-venv")
    assert result.returncode == 0, result.stdout + result.stderr
    unit = tmp_path / "etc/systemd/system/swarmd.service"
    config = tmp_path / "etc/swarmd/config.toml"
    assert unit.read_text() == UNIT.read_text()
    assert config.read_text() == EXAMPLE_CONFIG.read_text()
    assert "systemctl enable --now swarmd" in result.stdout
    assert "swarmd status" in result.stdout

    # A rerun (an upgrade) keeps the user's config and rewrites the unit.
    edited = config.read_text().replace('run_id = ""', 'run_id = "my-run"')
    config.write_text(edited)
    unit.write_text("stale")
    result = _install("--root", str(tmp_path), "--no-venv")
    assert result.returncode == 0, result.stdout + result.stderr
    assert config.read_text() == edited
    assert unit.read_text() == UNIT.read_text()


@needs_bash
@pytest.mark.timeout(60)
def test_install_with_prefix_rewrites_exec_start(tmp_path: Path) -> None:
    result = _install("--root", str(tmp_path), "--no-venv", env={"PREFIX": "/usr/local/swarmd"})
    assert result.returncode == 0, result.stdout + result.stderr
    settings = _unit_settings((tmp_path / "etc/systemd/system/swarmd.service").read_text())
    assert settings["ExecStart"] == ["/usr/local/swarmd/venv/bin/swarmd run --config /etc/swarmd/config.toml"]


@needs_bash
@pytest.mark.timeout(60)
def test_install_rejects_a_relative_prefix(tmp_path: Path) -> None:
    result = _install("--root", str(tmp_path), "--no-venv", "--prefix", "opt/swarmd")
    assert result.returncode != 0
    assert "absolute path" in result.stderr
    assert not any(tmp_path.iterdir())


@needs_bash
@pytest.mark.timeout(60)
def test_install_dry_run_changes_nothing(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    result = _install("--dry-run", "--root", str(root))
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "[dry-run]" in out
    assert "-m venv" in out and "pip install" in out
    assert f"{root}/etc/systemd/system/swarmd.service" in out
    assert f"{root}/etc/swarmd/config.toml" in out
    assert "nothing was changed" in out
    # --root means a packager's tree: no user is created and systemd is not touched.
    assert "useradd" not in out and "systemctl daemon-reload" not in out
    assert not any(root.iterdir())


@needs_bash
@pytest.mark.timeout(60)
def test_install_takes_the_torch_build_asked_for_before_swarmd(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    for kind, index in (("cpu", "download.pytorch.org/whl/cpu"), ("rocm", "download.pytorch.org/whl/rocm")):
        out = _install("--dry-run", "--root", str(root), "--torch", kind).stdout
        torch = next(line for line in out.splitlines() if "pip install" in line and " torch " in line)
        assert index in torch, out
        assert out.index(torch) < out.index("installing swarmd from")  # satisfied before swarmd asks
    out = _install("--dry-run", "--root", str(root), "--torch", "cuda").stdout
    assert "installing torch (cuda build)" in out and "--index-url" not in out  # PyPI's own build
    result = _install("--dry-run", "--root", str(root), "--torch", "gpu")
    assert result.returncode != 0 and "--torch 'gpu' is not one of cpu, cuda, rocm" in result.stderr


# --- the example config -----------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_example_config_has_the_schema() -> None:
    with EXAMPLE_CONFIG.open("rb") as f:
        config = tomllib.load(f)
    assert {section: set(keys) for section, keys in config.items()} == CONFIG_KEYS
    assert config["node"]["state_dir"] == "/var/lib/swarmd"
    assert config["node"]["log_level"] in {"debug", "info", "warning", "error"}
    assert config["swarm"]["run_id"] == ""
    assert config["swarm"]["host_maddrs"][0] == "/ip4/0.0.0.0/tcp/31337"
    assert config["heartbeat"]["ttl_s"] > config["heartbeat"]["interval_s"]
    assert config["compute"]["device"] == "auto"


@pytest.mark.timeout(60)
def test_example_config_comments_every_key() -> None:
    lines = EXAMPLE_CONFIG.read_text().splitlines()
    for i, line in enumerate(lines):
        if "=" in line and not line.lstrip().startswith("#"):
            assert i > 0 and lines[i - 1].lstrip().startswith("#"), f"no comment above: {line}"


# --- the container image ----------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_container_environment_sets_valid_config_keys() -> None:
    text = (PACKAGING / "Containerfile").read_text()
    block = text[text.index("ENV ") : text.index("EXPOSE")]
    env = dict(re.findall(r"(SWARMD_[A-Z_]+)=(\S+)", block))
    assert env, block
    config = load_config(None, env)  # raises on a key or value the daemon would refuse
    assert config.node.state_dir == "/var/lib/swarmd" and config.swarm.nat_port_map is False
    assert 'ENTRYPOINT ["swarmd", "run"]' in text and "USER swarmd" in text
    for kind in ("cpu", "cuda", "rocm"):
        assert f"{kind})" in text  # every build install.sh offers
