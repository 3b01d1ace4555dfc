"""``swarmd plan``: FORMAT.md's scenario in, its plan object out; a malformed file gets one line naming the field."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from swarmd.cli.main import main
from swarmd.peers.planning.scenario import load_scenario
from swarmd.peers.planning.scenario_gen import synthetic_scenario_dict

pytestmark = pytest.mark.timeout(120)


def write(tmp_path: Path, raw: dict[str, object]) -> Path:
    path = tmp_path / "scenario.json"
    path.write_text(json.dumps(raw))
    return path


def test_json_plan_has_the_format_fields(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    raw = synthetic_scenario_dict(12, regions=2, seed=1, parallelism={"stages": 3, "data_parallel": 4})
    path = write(tmp_path, raw)
    assert main(["plan", "--scenario", str(path), "--json", "--time-budget", "0.3"]) == 0
    out = json.loads(capsys.readouterr().out)
    # FORMAT.md's fields, and the data path's beside them (a superset: FORMAT.md is not ours to change)
    assert set(out) >= {
        "pipelines",
        "layers_per_stage",
        "parameter_servers",
        "relays",
        "predicted",
        "sync_comm_reference_s",
        "runtime_s",
    }
    assert set(out) >= {"shard_servers", "local_steps", "share_micro_batches", "spares", "roles", "bounds"}
    learning = out["learning"]
    assert 0 < learning["efficiency"] <= 1
    assert learning["effective_tokens_per_s"] == pytest.approx(
        out["predicted"]["tokens_per_s"] * learning["efficiency"], rel=1e-3
    )
    # Rounds of one step cost no gap: no replica count is past the useful one.
    assert (learning["most_useful_replicas"] is None) == (out["local_steps"] == 1)
    assert set(out["predicted"]) >= {
        "iteration_s",
        "compute_s",
        "pipeline_comm_s",
        "sync_comm_s",
        "churn_s",
        "tokens_per_s",
    }
    ids = {d["id"] for d in raw["devices"]}  # type: ignore[union-attr, index]
    assert len(out["pipelines"]) == 4 and all(len(row) == 3 for row in out["pipelines"])
    placed = [d for row in out["pipelines"] for d in row]
    assert len(set(placed)) == 12 and set(placed) <= ids
    assert sum(out["layers_per_stage"]) == raw["model"]["layers"]  # type: ignore[index]
    assert set(out["parameter_servers"]) <= ids and set(out["relays"]) <= ids
    assert [row[0] for row in out["shard_servers"]] == out["parameter_servers"]
    assert out["local_steps"] >= 1 and out["share_micro_batches"] >= 1
    assert set(out["roles"]) <= ids and all("cell" in out["roles"][d] for d in placed)
    p = out["predicted"]
    # The breakdown is of one server step's seconds: the parts add up to it.
    assert p["iteration_s"] == pytest.approx(
        p["compute_s"] + p["pipeline_comm_s"] + p["sync_comm_s"] + p["churn_s"], rel=1e-4
    )
    assert 0 < p["tokens_per_s"] <= out["bounds"]["compute_bound_tokens_per_s"]
    assert out["sync_comm_reference_s"] > 0 and out["runtime_s"] > 0
    load_scenario(path)  # the file we wrote is one the parser takes


def test_human_output_names_stages_and_costs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, synthetic_scenario_dict(16, regions=2, seed=2))
    assert main(["plan", "--scenario", str(path), "--time-budget", "0.3", "--no-network"]) == 0
    out = capsys.readouterr().out
    for words in (
        "parameter server",
        "shards",
        "local steps",
        "trained tokens/s",
        "compute bound",
        "fastest device alone",
        "spares",
        "reference cost",
    ):
        assert words in out, words


def test_a_malformed_scenario_exits_1_with_one_line_naming_the_field(tmp_path: Path) -> None:
    raw = synthetic_scenario_dict(4, regions=1, seed=1)
    raw["bandwidth_Bps"][1][3] = float("nan")  # type: ignore[index]
    path = write(tmp_path, raw)
    result = subprocess.run(
        [sys.executable, "-m", "swarmd", "plan", "--scenario", str(path)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 1
    assert result.stderr.strip().count("\n") == 0, result.stderr
    assert "bandwidth_Bps[1][3]" in result.stderr and "Traceback" not in result.stderr


def test_status_shows_the_plan_the_coordinator_and_the_measurements() -> None:
    from swarmd.cli.status_view import fmt_swarm

    swarm = {
        "coordinator": "12D3me",
        "plan_error": None,
        "reliability": {"12D3me": 0.42},
        "plan": {
            "version": 7,
            "kind": "repair",
            "by": "12D3me",
            "pipelines": 2,
            "stages": 2,
            "layers_per_stage": [3, 1],
            "predicted_iteration_s": 0.25,
            "my_stage": 1,
        },
        "links": {
            "measured": 3,
            "matrix_measured": 12,
            "matrix_filled": 0,
            "probes_sent": 9,
            "probe_failures": 1,
            "probe_bytes_last_hour": 3 * 2**20,
        },
    }
    text = "\n".join(fmt_swarm(swarm, "12D3me"))
    assert "v7 (repair)" in text and "predicted iteration 0.250 s" in text and "this peer: stage 1" in text
    assert "(this peer)" in text and "0.42" in text and "3.0 MiB" in text
    swarm["plan"] = None
    assert "fewer peers than stages" in "\n".join(fmt_swarm(swarm, "other"))
