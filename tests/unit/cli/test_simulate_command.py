"""``swarmd simulate`` end to end on the shared two-region scenario: the table, the numbers and
the plots it writes, and the one-line errors for what a user can get wrong."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from swarmd.cli.main import main
from swarmd.config import HeartbeatConfig, RolesConfig, SwarmConfig
from swarmd.models.shard_config import ShardConfig
from swarmd.peers.membership.election import ElectionConfig, coordination_round_s
from swarmd.peers.planning.transfers import KEEP_VERSIONS
from swarmd.peers.sim.simulator import SimConfig

pytestmark = pytest.mark.timeout(300)

SCENARIO = Path(__file__).resolve().parents[3] / "docs" / "scenarios" / "lan-and-wan-12.json"


@pytest.fixture
def scenario_file() -> Path:
    return SCENARIO


def test_simulate_writes_a_report_numbers_and_plots(
    scenario_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "sim"
    argv = [
        "simulate",
        "--scenario",
        str(scenario_file),
        "--hours",
        "0.5",
        "--seed",
        "1",
        "--strategies",
        "swarmd,petals-greedy",
        "--time-budget",
        "0.05",
        "--out",
        str(out),
    ]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "| swarmd |" in printed and "| petals-greedy |" in printed
    assert "| strategy | share | share compute | round | contribution | pull | commit lag |" in printed
    assert "| strategy | coordinator changes | plans lost | relays | transfers relayed | spare claims |" in printed
    assert (out / "report.md").read_text() in printed
    data = json.loads((out / "results.json").read_text())
    assert [r["strategy"] for r in data["rows"]] == ["swarmd", "petals-greedy"]
    for row, run in zip(data["rows"], data["runs"], strict=True):
        # Whether an update commits within the half hour is the planner's choice of H and k.
        assert row["updates_lost"] == 0 and row["tokens_per_s"] >= 0 and 0 <= row["of_compute_bound"] < 1
        assert run["plan_events"][0]["kind"] == "full" and len(run["timeline"]) >= 30
        assert row["phases"]["share"]["n"] > 0 and row["phases"]["contribution"]["n"] > 0
        assert len(run["sent_bytes"]) == data["devices"]
    # Twelve members elect no relay beyond the first (one per sixteen), and only swarmd elects.
    assert [row["relays"] for row in data["rows"]] == [1, 0]
    # What the tokens teach: both on the same target, each at its own efficiency.
    header = "| strategy | trained tokens/s | efficiency | effective tokens/s | loss at the end | hours to target |"
    assert header in printed
    assert len({row["target_loss"] for row in data["rows"]}) == 1
    for row in data["rows"]:
        assert 0 < row["efficiency"] <= 1
        assert row["effective_tokens_per_s"] == pytest.approx(row["tokens_per_s"] * row["efficiency"], rel=1e-3)
        if row["tokens_per_s"] > 0:
            # 20 tokens a parameter is far more than half an hour trains: extrapolated at the mean rate.
            assert row["time_to_target_extrapolated"]
            assert row["time_to_target_s"] == pytest.approx(
                row["target_tokens"] / row["effective_tokens_per_s"], rel=0.01
            )
            assert row["loss_at_end"] > row["target_loss"]  # not there yet
    for name in ("effective_tokens_per_s.png", "staleness.png", "plan_runtimes.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--hours", "0"], "--hours 0 is out of range"),
        (["--hours", "1", "--strategies", "swarmd,magic"], "unknown strategy magic"),
        (["--hours", "1", "--time-budget", "-1"], "--time-budget -1"),
        (["--hours", "1", "--target-loss", "1.5"], "--target-loss 1.5: loss 1.500 is out of reach"),
    ],
)
def test_user_errors_are_one_line(
    scenario_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    assert main(["simulate", "--scenario", str(scenario_file), "--out", str(tmp_path / "x"), *args]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


def test_the_simulators_defaults_are_the_daemons() -> None:
    """The simulated coordinator's round and election thresholds follow the daemon's defaults."""
    settings = SimConfig()
    roles = RolesConfig()
    assert settings.coordinate_s == coordination_round_s(HeartbeatConfig().interval_s)
    assert settings.thresholds == ElectionConfig(
        min_reliability=roles.min_reliability,
        min_relay_reliability=roles.min_relay_reliability,
        min_connectivity_Bps=roles.min_connectivity_Bps,
        hysteresis=roles.hysteresis,
    )
    assert settings.data_via_relay == SwarmConfig().data_via_relay
    # A cell further behind than this gets the whole slice: the planner prices it the same way.
    assert settings.keep_versions == KEEP_VERSIONS == ShardConfig(mode="gradient", lr=1e-3).keep_versions


def test_a_strategy_that_cannot_place_the_swarm_is_reported_not_fatal(tmp_path: Path) -> None:
    from swarmd.peers.planning.scenario_gen import synthetic_scenario_dict

    # 1.3B parameters need more than 16 GiB with their optimizer state: no 12-16 GiB device
    # holds them alone, so DiLoCo has no replica; swarmd pipelines them.
    raw = synthetic_scenario_dict(
        12,
        seed=1,
        model={"layers": 24, "hidden": 2048, "seq_len": 2048, "vocab": 50257, "params": 1.3e9, "dtype_bytes": 2},
    )
    for device in raw["devices"]:
        device["memory_gib"] = 16
    path = tmp_path / "big.json"
    path.write_text(json.dumps(raw))
    argv = [
        "simulate",
        "--scenario",
        str(path),
        "--hours",
        "0.2",
        "--strategies",
        "swarmd,diloco",
        "--time-budget",
        "0.05",
        "--out",
        str(tmp_path / "sim"),
    ]
    assert main(argv) == 0
    report = (tmp_path / "sim" / "report.md").read_text()
    assert "| swarmd |" in report and "- diloco: cannot run (no live device holds the model alone" in report
