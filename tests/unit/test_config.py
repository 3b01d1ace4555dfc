"""daemon/config.py: the TOML config file, its defaults, and its error messages."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from swarmd.config import (
    ComputeConfig,
    Config,
    HeartbeatConfig,
    NodeConfig,
    SwarmConfig,
    config_from_dict,
    load_config,
)
from swarmd.errors import ConfigError

pytestmark = pytest.mark.timeout(30)

EXAMPLE = Path(__file__).resolve().parents[2] / "packaging" / "config.example.toml"


def test_defaults_valid() -> None:
    cfg = load_config(None)
    assert cfg == Config()
    assert cfg == config_from_dict({})
    assert cfg.node.log_level == "info"
    assert cfg.node.state_path == Path("~/.local/state/swarmd").expanduser()
    assert cfg.swarm.host_maddrs == ["/ip4/0.0.0.0/tcp/31337"]
    assert cfg.heartbeat.ttl_s >= 2 * cfg.heartbeat.interval_s
    assert cfg.compute.device == "auto"


def test_example_file_loads() -> None:
    cfg = load_config(EXAMPLE)
    assert cfg == Config(
        node=NodeConfig(state_dir="/var/lib/swarmd", log_level="info", stop_timeout_s=30.0),
        swarm=SwarmConfig(
            run_id="",
            initial_peers=[],
            host_maddrs=["/ip4/0.0.0.0/tcp/31337", "/ip4/0.0.0.0/udp/31337/quic-v1"],
            announce_maddrs=[],
            lan_maddr="/ip4/0.0.0.0/tcp/0",
            mdns=True,
            nat_port_map=True,
            relay=True,
            join_timeout_s=60.0,
        ),
        heartbeat=HeartbeatConfig(interval_s=15.0, ttl_s=60.0),
        compute=ComputeConfig(device="auto", benchmark=True),
    )
    assert isinstance(cfg.node.stop_timeout_s, float)


def test_example_file_documents_every_key() -> None:
    import tomllib

    data = tomllib.loads(EXAMPLE.read_text())
    cfg = Config()
    keys = lambda obj: {f.name for f in dataclasses.fields(obj)}  # noqa: E731 (not vars(): a parsed value may be cached there)
    for section, values in data.items():
        assert set(values) == keys(getattr(cfg, section)), section
    assert set(data) == keys(cfg)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(text)
    return path


def test_int_accepted_for_float(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, "[heartbeat]\ninterval_s = 2\nttl_s = 5\n"))
    assert cfg.heartbeat.interval_s == 2.0
    assert isinstance(cfg.heartbeat.interval_s, float)
    assert isinstance(cfg.heartbeat.ttl_s, float)


def test_unknown_section(tmp_path: Path) -> None:
    path = write(tmp_path, "[nodes]\nlog_level = 'info'\n")
    with pytest.raises(ConfigError, match=r"unknown section\(s\) \['nodes'\]") as info:
        load_config(path)
    assert str(path) in str(info.value)


def test_unknown_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"\[node\] has unknown key 'loglevel'"):
        load_config(write(tmp_path, "[node]\nloglevel = 'info'\n"))


@pytest.mark.parametrize(
    ("data", "match"),
    [
        ({"heartbeat": {"ttl_s": "60"}}, r"\[heartbeat\] ttl_s = '60' should be a float, not str"),
        ({"heartbeat": {"ttl_s": True}}, r"\[heartbeat\] ttl_s = True should be a float, not bool"),
        ({"node": {"stop_timeout_s": False}}, r"stop_timeout_s = False should be a float"),
        ({"swarm": {"mdns": 1}}, r"\[swarm\] mdns = 1 should be a bool, not int"),
        ({"swarm": {"mdns": "yes"}}, r"mdns = 'yes' should be a bool"),
        ({"swarm": {"initial_peers": "/ip4/1.2.3.4/tcp/1"}}, r"initial_peers .* should be a list"),
        ({"swarm": {"run_id": 5}}, r"run_id = 5 should be a str"),
        ({"compute": {"device": None}}, r"device = None should be a str"),
        ({"compute": {"compile": "yes"}}, r"\[compute\] compile = 'yes' should be a bool"),
    ],
)
def test_wrong_types(data: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        config_from_dict(data)


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (
            {"node": {"stop_timeout_s": 0.5}},
            r"\[node\] stop_timeout_s = 0.5 is outside the allowed range \[1, 600\]",
        ),
        ({"node": {"stop_timeout_s": 601}}, "stop_timeout_s = 601.0 is outside"),
        ({"node": {"stop_timeout_s": float("nan")}}, "stop_timeout_s = nan is outside"),
        ({"swarm": {"join_timeout_s": 0}}, "join_timeout_s = 0.0 is outside"),
        ({"heartbeat": {"interval_s": 0.1}}, "interval_s = 0.1 is outside"),
        ({"heartbeat": {"ttl_s": 3601}}, "ttl_s = 3601.0 is outside"),
        ({"node": {"log_level": "INFO"}}, r"\[node\] log_level = 'INFO' is not one of"),
        ({"compute": {"device": "tpu"}}, r"\[compute\] device = 'tpu'"),
        ({"compute": {"device": "cuda:"}}, r"device = 'cuda:'"),
        ({"compute": {"device": "cuda:x"}}, r"device = 'cuda:x'"),
        ({"compute": {"precision": "fp16"}}, r"\[compute\] precision = 'fp16' is not one of auto, bf16, fp32"),
        ({"swarm": {"host_maddrs": []}}, r"host_maddrs is empty"),
    ],
)
def test_out_of_range(data: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        config_from_dict(data)


def test_precisions_are_the_models_and_compile_is_off_by_default() -> None:
    from swarmd.config import PRECISIONS
    from swarmd.models.precision import PRECISIONS as MODEL_PRECISIONS

    assert PRECISIONS == MODEL_PRECISIONS
    assert (ComputeConfig().precision, ComputeConfig().compile) == ("auto", False)
    for precision in PRECISIONS:
        assert config_from_dict({"compute": {"precision": precision}}).compute.precision == precision
    assert config_from_dict({"compute": {"compile": True}}).compute.compile is True


def test_valid_devices() -> None:
    for device in ("auto", "cpu", "cuda", "cuda:0", "cuda:12"):
        assert config_from_dict({"compute": {"device": device}}).compute.device == device


def test_ttl_under_twice_interval(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"ttl_s = 20.0 is under twice interval_s = 15.0"):
        load_config(write(tmp_path, "[heartbeat]\nttl_s = 20\n"))
    assert load_config(write(tmp_path, "[heartbeat]\nttl_s = 30\n")).heartbeat.ttl_s == 30.0


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("initial_peers", ["/ip4/1.2.3.4/tcp/31337", "not-a-multiaddr"]),
        ("host_maddrs", ["/ip4/999.1.1.1/tcp/1"]),
        ("announce_maddrs", ["/ip4/1.2.3.4/tcp/notaport"]),
        ("lan_maddr", "/nonsense/1"),
        ("initial_peers", [5]),
    ],
)
def test_bad_multiaddr(key: str, value: object) -> None:
    with pytest.raises(ConfigError, match=rf"\[swarm\] {key}") as info:
        config_from_dict({"swarm": {key: value}})
    bad = value[-1] if isinstance(value, list) else value
    assert repr(bad) in str(info.value)


def test_valid_multiaddrs() -> None:
    peer = "/ip4/203.0.113.5/tcp/31337/p2p/12D3KooWD3eckifWpRn9wQpMG9R9hX3sD158z7EqHWmweQAJU5SA"
    cfg = config_from_dict({"swarm": {"initial_peers": [peer], "announce_maddrs": ["/ip4/203.0.113.7/tcp/31337"]}})
    assert cfg.swarm.initial_peers == [peer]


def test_malformed_toml(tmp_path: Path) -> None:
    path = write(tmp_path, "[node\nlog_level = 'info'\n")
    with pytest.raises(ConfigError, match="is not valid TOML") as info:
        load_config(path)
    assert str(path) in str(info.value)


def test_non_utf8_file(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_bytes(b"[node]\nstate_dir = '\xff'\n")
    with pytest.raises(ConfigError, match=str(path)):
        load_config(path)


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "missing.toml"
    with pytest.raises(ConfigError, match="does not exist") as info:
        load_config(path)
    assert str(path) in str(info.value)


def test_directory_instead_of_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(tmp_path)


@pytest.mark.parametrize("value", [5, "abc", [1]])
def test_section_not_a_table(tmp_path: Path, value: object) -> None:
    with pytest.raises(ConfigError, match=r"\[node\] must be a table"):
        config_from_dict({"node": value})


def test_values_not_shared_between_configs() -> None:
    a, b = Config(), Config()
    a.swarm.host_maddrs.append("/ip4/1.2.3.4/tcp/1")
    assert b.swarm.host_maddrs == ["/ip4/0.0.0.0/tcp/31337"]


def test_join_token(tmp_path: Path) -> None:
    from swarmd.peers.records.join_token import MAX_TOKEN_CHARS

    assert SwarmConfig().join_token == ""
    cfg = load_config(write(tmp_path, '[swarm]\njoin_token = "eyJ2IjoxfQ=="\n'))
    assert cfg.swarm.join_token == "eyJ2IjoxfQ=="
    for bad in ("not base64!", "QUJD\n", "A" * (MAX_TOKEN_CHARS + 4)):
        with pytest.raises(ConfigError, match=r"\[swarm\] join_token is not a join token .*'swarmd run token'"):
            SwarmConfig(join_token=bad)
    with pytest.raises(ConfigError, match="join_token"):
        load_config(write(tmp_path, "[swarm]\njoin_token = 5\n"))


PEER = "12D3KooWDpJ7As7BWAwRMfu1VU2WCqNjvq387JEYKDBj4kx6nXTN"


def test_environment_variables_set_keys_over_the_file(tmp_path: Path) -> None:
    run_id = "tiny-bytes." + "a" * 24
    path = write(tmp_path, "[heartbeat]\ninterval_s = 2\nttl_s = 5\n[swarm]\nmdns = true\n")
    env = {
        "SWARMD_SWARM_RUN_ID": run_id,  # a bare string
        "SWARMD_SWARM_MDNS": "false",  # TOML: a boolean
        "SWARMD_HEARTBEAT_TTL_S": "9",  # a number
        "SWARMD_SWARM_INITIAL_PEERS": f'["/ip4/10.0.0.1/tcp/31337/p2p/{PEER}"]',
        "SWARMD_CONFIG": "/etc/swarmd/config.toml",  # not a key: no section 'config'
        "SWARMD_TORCH": "torch==2.13.0",  # the dev installer's, not a key
    }
    cfg = load_config(path, env)
    assert cfg.swarm.run_id == run_id and cfg.swarm.mdns is False
    assert cfg.heartbeat.interval_s == 2.0 and cfg.heartbeat.ttl_s == 9.0
    assert cfg.swarm.initial_peers[0].startswith("/ip4/10.0.0.1/")
    assert load_config(None, {"SWARMD_NODE_LOG_LEVEL": "debug"}).node.log_level == "debug"


def test_a_misspelt_environment_key_is_refused_naming_the_source(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"unknown key 'runid'.*") as info:
        load_config(None, {"SWARMD_SWARM_RUNID": "x"})
    assert "SWARMD_* variables" in str(info.value)
