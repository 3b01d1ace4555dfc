"""peers/planning/scenario.py: scenario files are checked once, and every refusal names its field."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from swarmd.peers.planning.scenario import ScenarioError, Shape, load_scenario, parse_scenario
from swarmd.peers.planning.scenario_gen import synthetic_scenario_dict

pytestmark = pytest.mark.timeout(60)


def example() -> dict[str, Any]:
    return synthetic_scenario_dict(4, regions=2, seed=1, parallelism={"stages": 2, "data_parallel": 2})


def test_a_valid_scenario_round_trips_its_numbers() -> None:
    raw = example()
    raw["cost"] = {"activation_bytes": 1e6, "grad_bytes": 2e6}
    sc = parse_scenario(raw)
    assert sc.n == 4 and sc.ids == [d["id"] for d in raw["devices"]]
    assert sc.parallelism == Shape(2, 2)
    assert sc.latency_s[0, 1] == raw["latency_s"][0][1]
    assert sc.bandwidth_Bps[1, 0] == raw["bandwidth_Bps"][1][0]
    assert math.isinf(sc.bandwidth_Bps[2, 2])  # a device talks to itself for free
    assert sc.activation_bytes(Shape(2, 2)) == 1e6 and sc.grad_bytes(Shape(2, 2)) == 2e6


def test_costs_follow_from_the_model_when_not_given() -> None:
    sc = parse_scenario(example())
    m = sc.model
    # Each of 2 pipelines carries half the batch's hidden states; a stage holds half the parameters.
    assert sc.activation_bytes(Shape(2, 2)) == sc.batch_sequences / 2 * m.seq_len * m.hidden * m.dtype_bytes
    assert sc.grad_bytes(Shape(2, 2)) == m.params * m.dtype_bytes / 2


def test_the_shipped_examples_parse(tmp_path: Path) -> None:
    files = sorted((Path(__file__).resolve().parents[4] / "docs" / "scenarios").glob("*.json"))
    assert len(files) >= 2, "docs/scenarios/ ships the example scenarios"
    for path in files:
        sc = load_scenario(path)
        assert sc.n == len(json.loads(path.read_text())["devices"])


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        (lambda r: r["devices"][2].update(tflops=-3), "devices[2].tflops"),
        (lambda r: r["devices"][1].update(memory_gib=0), "devices[1].memory_gib"),
        (lambda r: r["devices"][0].pop("id"), "devices[0].id"),
        (lambda r: r["devices"][3].update(id=r["devices"][0]["id"]), "devices[3].id"),
        (lambda r: r["devices"][1].update(mean_uptime_h=float("nan")), "devices[1].mean_uptime_h"),
        (lambda r: r["bandwidth_Bps"][0].__setitem__(1, 0), "bandwidth_Bps[0][1]"),
        (lambda r: r["bandwidth_Bps"][2].__setitem__(3, -5e6), "bandwidth_Bps[2][3]"),
        (lambda r: r["latency_s"][3].__setitem__(0, float("nan")), "latency_s[3][0]"),
        (lambda r: r["latency_s"][1].__setitem__(2, -0.01), "latency_s[1][2]"),
        (lambda r: r["latency_s"][1].pop(), "latency_s[1]"),
        (lambda r: r["bandwidth_Bps"].pop(), "bandwidth_Bps"),
        (lambda r: r["latency_s"].__setitem__(0, "fast"), "latency_s[0]"),
        (lambda r: r.pop("latency_s"), "latency_s"),
        (lambda r: r["model"].update(layers=2.5), "model.layers"),
        (lambda r: r["model"].pop("hidden"), "model.hidden"),
        (lambda r: r["batch"].update(micro_batch=10_000), "batch.micro_batch"),
        (lambda r: r["parallelism"].update(data_parallel=3), "parallelism"),
        (lambda r: r["parallelism"].update(stages=True), "parallelism.stages"),
        (lambda r: r.update(cost={"grad_bytes": "many"}), "cost.grad_bytes"),
        (lambda r: r.update(devices=[]), "devices"),
    ],
)
def test_a_malformed_scenario_is_refused_naming_the_field(edit: Any, field: str) -> None:
    raw = copy.deepcopy(example())
    edit(raw)
    with pytest.raises(ScenarioError) as e:
        parse_scenario(raw)
    assert f"field {field} " in str(e.value) or str(e.value).startswith(f"scenario field {field}")


def test_the_diagonal_is_ignored() -> None:
    raw = example()
    raw["bandwidth_Bps"][1][1] = 0
    raw["latency_s"][2][2] = 5.0
    sc = parse_scenario(raw)
    assert sc.latency_s[2, 2] == 0.0 and math.isinf(sc.bandwidth_Bps[1, 1])


def test_files_that_are_not_scenarios_say_so(tmp_path: Path) -> None:
    missing = tmp_path / "nope.json"
    with pytest.raises(ScenarioError, match="cannot read scenario file"):
        load_scenario(missing)
    broken = tmp_path / "broken.json"
    broken.write_text('{"devices": [')
    with pytest.raises(ScenarioError, match="is not JSON"):
        load_scenario(broken)
    nan = tmp_path / "nan.json"
    text = json.dumps(example()).replace('"tflops": ', '"tflops": NaN, "x": ', 1)
    nan.write_text(text)
    with pytest.raises(ScenarioError, match=r"devices\[0\].tflops"):
        load_scenario(nan)


def test_restricting_to_devices_keeps_rows_and_columns_together() -> None:
    sc = parse_scenario(example())
    sub = sc.with_devices([3, 1])
    assert sub.ids == [sc.ids[3], sc.ids[1]]
    assert sub.latency_s[0, 1] == sc.latency_s[3, 1] and sub.bandwidth_Bps[1, 0] == sc.bandwidth_Bps[1, 3]
    assert np.isinf(np.diag(sub.bandwidth_Bps)).all()


def test_matrices_given_as_arrays_are_checked_by_the_same_rules() -> None:
    lists = example()
    arrays = copy.deepcopy(lists)
    arrays["latency_s"] = np.array(lists["latency_s"])
    arrays["bandwidth_Bps"] = np.array(lists["bandwidth_Bps"])
    a, b = parse_scenario(arrays), parse_scenario(lists)
    assert np.array_equal(a.latency_s, b.latency_s) and np.array_equal(a.bandwidth_Bps, b.bandwidth_Bps)
    for key, value, rule in (
        ("latency_s", -1.0, ">= 0"),
        ("bandwidth_Bps", 0.0, "> 0"),
        ("latency_s", np.nan, "finite"),
    ):
        bad = copy.deepcopy(arrays)
        bad[key][2, 1] = value
        with pytest.raises(ScenarioError, match=rf"{key}\[2\]\[1\].*{rule}"):
            parse_scenario(bad)
    arrays["latency_s"][1, 1] = np.nan  # the diagonal is ignored here too
    parse_scenario(arrays)


def test_a_measured_achieved_figure_is_what_the_device_is_priced_at() -> None:
    raw = example()
    raw["devices"][1]["achieved_tflops"] = 7.5
    sc = parse_scenario(raw)
    assert sc.devices[1].achieved_tflops == 7.5 and sc.devices[1].tflops == raw["devices"][1]["tflops"]
    assert sc.devices[0].achieved_tflops is None  # absent: the rated figure stands
    assert list(sc.device_arrays.tflops) == [
        raw["devices"][0]["tflops"],
        7.5,
        *(d["tflops"] for d in raw["devices"][2:]),
    ]
    # Above the rated figure is allowed: a card boosting past its rated clock measures so.
    raw["devices"][1]["achieved_tflops"] = raw["devices"][1]["tflops"] * 1.05
    assert parse_scenario(raw).devices[1].speed_tflops == raw["devices"][1]["achieved_tflops"]


@pytest.mark.parametrize("value", [0, -2.0, "fast", True, float("inf")])
def test_a_bad_achieved_figure_is_refused_by_name(value: object) -> None:
    raw = example()
    raw["devices"][3]["achieved_tflops"] = value
    with pytest.raises(ScenarioError, match=r"devices\[3\]\.achieved_tflops"):
        parse_scenario(raw)
