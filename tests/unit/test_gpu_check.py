"""The GPU check's pure parts: FLOPs per token, MFU, the loss comparison rule, the table, the config."""

from __future__ import annotations

import dataclasses
import math
import tomllib

import pytest

from swarmd.config import ComputeConfig
from tests.gpu.check import CPU, GPU
from tests.gpu.daemons import config_toml, layout
from tests.gpu.device_checks import gpu_memory_cap
from tests.gpu.figures import (
    LossComparison,
    Row,
    compare_losses,
    flops_per_token,
    goals,
    markdown_table,
    mfu,
    step_losses,
)


def test_flops_per_token_counts_the_matmuls_and_attention_as_torchtitan_does() -> None:
    # 6 per non-embedding parameter, plus 12 x layers x hidden x seq.
    found = flops_per_token(params=1000, embedding_params=100, layers=2, hidden=8, seq_len=16)
    assert found == 6 * 900 + 12 * 2 * 8 * 16
    with pytest.raises(ValueError, match="embedding_params 5"):
        flops_per_token(params=4, embedding_params=5, layers=1, hidden=1, seq_len=1)


def test_the_gpu_models_flops_and_an_h100s_mfu() -> None:
    # The GPU check's model: 24 layers of attention (q, o 1024^2; k, v 1024 x 256) and a SwiGLU
    # of 3 x 1024 x 2816, two norms each; an embedding and an untied head of 32,000 x 1,024.
    layer = 2 * 1024 * 1024 + 2 * 1024 * 256 + 3 * 1024 * 2816 + 2 * 1024
    embedding = 32000 * 1024
    params = 24 * layer + 1024 + 2 * embedding
    assert 330e6 < params < 340e6
    per_token = flops_per_token(params=params, embedding_params=embedding, layers=24, hidden=1024, seq_len=2048)
    assert per_token == 6 * (params - embedding) + 12 * 24 * 1024 * 2048
    # 150,000 tokens/s on an H100 SXM (989 TFLOPS) is 37% MFU.
    assert mfu(150_000, per_token, 989e12) == pytest.approx(150_000 * per_token / 989e12)
    assert 0.36 < mfu(150_000, per_token, 989e12) < 0.38
    with pytest.raises(ValueError, match="above 0"):
        mfu(1.0, 1, 0.0)


def test_step_losses_average_complete_steps_and_count_a_recompute_once() -> None:
    # per_step 2: micro-batches 0, 1 are step 0; 2, 3 step 1; 4 alone is an incomplete step 2.
    pairs = [[0, 4.0], [1, 2.0], [2, 1.0], [3, 3.0], [2, 5.0], [4, 9.0]]
    assert step_losses(pairs, 2) == {0: 3.0, 1: 4.0}  # micro-batch 2 recomputed: its latest loss, once
    with pytest.raises(ValueError, match="per_step"):
        step_losses(pairs, 0)


def test_the_loss_comparison_takes_the_last_window_both_reached() -> None:
    reference = [5.0, 4.0, 3.0, 2.5, 2.0]
    run = {0: 5.1, 1: 4.1, 2: 3.1, 3: 2.6}  # one step short of the reference
    c = compare_losses(run, reference, window=2, tolerance=0.15)
    assert c is not None and (c.first_step, c.last_step) == (2, 3)
    assert c.loss == pytest.approx(2.85) and c.reference == pytest.approx(2.75)
    assert c.gap == pytest.approx(0.1) and c.within
    assert not compare_losses(run, reference, window=2, tolerance=0.05).within  # type: ignore[union-attr]
    # Steps past ``upto`` or past the reference are not compared; nothing to compare is None.
    assert compare_losses(run, reference, window=2, tolerance=0.1, upto=1).last_step == 1  # type: ignore[union-attr]
    assert compare_losses({7: 1.0}, reference, window=2, tolerance=1.0) is None
    # Better than the reference by more than the tolerance fails too, as does a NaN.
    assert not LossComparison(0, 0, loss=1.0, reference=2.0, tolerance=0.5).within
    assert not LossComparison(0, 0, loss=math.nan, reference=2.0, tolerance=0.5).within


def test_the_table_gives_each_rows_ratio_to_the_reference_and_the_goals() -> None:
    loss = LossComparison(15, 19, loss=5.42, reference=5.40, tolerance=0.1)
    rows = [
        Row("reference", 1000.0, 0.4, [2**30], LossComparison(15, 19, 5.4, 5.4, 0.1)),
        Row("one daemon", 850.0, 0.34, [3 * 2**29], loss, "note"),
        Row("two daemons, 2 stages", None, None, [], None, "0 updates"),
    ]
    table = markdown_table(rows).splitlines()
    assert table[0].startswith("| row | tokens/s | vs ref | MFU | peak GiB |")
    assert table[2] == "| reference | 1,000 | 1.00x | 40.0% | 1.00 | 5.400 (steps 15-19) |  |"
    assert table[3] == "| one daemon | 850 | 0.85x | 34.0% | 1.50 | 5.420 (+0.0200 vs ref, steps 15-19) | note |"
    assert table[4] == "| two daemons, 2 stages | - | - | - | - | - | 0 updates |"
    ratio, reference_mfu = goals(rows)
    assert ratio.value == pytest.approx(0.85) and ratio.met
    assert reference_mfu.value == 0.4 and reference_mfu.met
    assert goals(rows[:1])[0].value is None and "not measured" in goals(rows[:1])[0].line()
    assert rows[1].to_json()["loss"] == {**dataclasses.asdict(loss), "gap": pytest.approx(0.02), "within": True}


def test_the_daemons_config_is_one_the_daemon_takes() -> None:
    config = tomllib.loads(config_toml(device="cuda", gpu_memory_gib=39.5, precision="bf16"))
    assert ComputeConfig(**config["compute"]) == ComputeConfig(device="cuda", precision="bf16")
    assert config["limits"] == {"pause_while_gpu_used": False, "pause_on_battery": False, "gpu_memory_gib": 39.5}
    assert "gpu_memory_gib" not in tomllib.loads(config_toml(device="cpu"))["limits"]


def test_the_cap_check_reads_each_daemons_status() -> None:
    total = 80 * 2**30
    good = {"limits": {"applied": {"gpu_memory": "40.0 of 80.0 GiB", "gpu_memory_peak_bytes": 30 * 2**30}}}
    over = {"limits": {"applied": {"gpu_memory": "40.0 of 80.0 GiB", "gpu_memory_peak_bytes": 41 * 2**30}}}
    uncapped = {"limits": {"applied": {"gpu_memory": "no cap (80.0 GiB)", "gpu_memory_peak_bytes": 2**30}}}
    lines = gpu_memory_cap([good, over, uncapped, {}], 40.0, total)
    assert [c.outcome for c in lines] == ["pass", "fail", "fail", "fail"]


def test_the_layout_names_each_daemons_cells_and_shards() -> None:
    status = {
        "training": {
            "cells": [{"pipeline": 0, "stage": 1}],
            "shards": [{"stage": 1, "shard": 0}],
            "assignment": {"pipelines": 1, "local_steps": 1},
        }
    }
    assert layout([status, {}]) == "d0: cells [(0, 1)] shards [(1, 0)]; d1: cells [] shards []; pipelines 1, H 1"


def test_the_modes_keep_their_batches_whole() -> None:
    for setup in (GPU, CPU):
        batch = setup.spec["batch"]
        assert batch["sequences"] % batch["micro_batch"] == 0
        assert 1 <= setup.warmup < setup.steps
        assert setup.spec["model"]["layers"] % 2 == 0  # two even stages
