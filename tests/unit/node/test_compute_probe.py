"""daemon/node/compute_probe.py: the products a block's probe multiplies, their FLOPs, and the probe
itself on this CPU (a positive figure within its few seconds; never an assertion on speed)."""

from __future__ import annotations

import math

import pytest
import torch

from swarmd.config import ComputeConfig
from swarmd.models.presets import DEFAULT_RUN
from swarmd.models.shape import ModelShape
from swarmd.node.compute_probe import (
    GENERIC,
    Matmul,
    ProbeError,
    StageDims,
    _largest_fraction,
    block_matmuls,
    compute_threads,
    matmul_flops,
    measure_achieved_tflops,
    probe_device,
)
from swarmd.peers.planning.scenario import ModelSpec
from swarmd.peers.records.run_spec import parse_spec_body

pytestmark = pytest.mark.timeout(60)

TINY_BYTES = StageDims.of_run(ModelShape(family="gpt2", layers=4, hidden=128, heads=4, vocab=256, seq_len=128), 4)
LLAMA_350M = StageDims.of_run(
    ModelShape(family="llama", layers=24, hidden=1024, heads=16, kv_heads=4, vocab=32000, seq_len=2048), 8
)


def shapes(products: list[Matmul]) -> dict[tuple[int, int, int, int, str], int]:
    return {(p.m, p.k, p.n, p.batch, p.grows): p.count for p in products}


def test_the_default_runs_block_is_its_projections_three_ways_and_attention_per_head() -> None:
    # GPT-2, hidden 128, 4 heads of 32, MLP 512, four sequences of 128: 512 rows.
    assert shapes(block_matmuls(TINY_BYTES)) == {
        (512, 128, 128, 1, "m"): 8,  # Q, K, V, O forward and their inputs' gradients
        (128, 512, 128, 1, "k"): 4,  # their weights' gradients: the rows are the inner size
        (512, 512, 128, 1, "m"): 2,  # the MLP's output forward, its input's gradient backward
        (512, 128, 512, 1, "m"): 2,  # and the other way round
        (512, 512, 128, 1, "k"): 1,  # the MLP output's weight gradient
        (128, 512, 512, 1, "k"): 1,  # the MLP input's
        (128, 32, 128, 16, "batch"): 2,  # scores Q K^T and dP, per head of each sequence
        (128, 128, 32, 16, "batch"): 4,  # P V, dQ, dK, dV
    }


def test_grouped_query_attention_narrows_k_and_v_and_a_gated_mlp_has_two_inputs() -> None:
    got = shapes(block_matmuls(LLAMA_350M))
    rows = 8 * 2048
    assert got[(rows, 1024, 256, 1, "m")] == 2 and got[(rows, 256, 1024, 1, "m")] == 2  # K, V: 4 heads of 64
    assert got[(1024, rows, 256, 1, "k")] == 2
    assert got[(rows, 1024, 2752, 1, "m")] == 2 + 1  # gate and up forward, down's input gradient
    assert got[(1024, rows, 2752, 1, "k")] == 2 and got[(2752, rows, 1024, 1, "k")] == 1
    assert got[(2048, 64, 2048, 128, "batch")] == 2 and got[(2048, 2048, 64, 128, "batch")] == 4


@pytest.mark.parametrize("dims", [TINY_BYTES, GENERIC, LLAMA_350M])
def test_a_blocks_flops_are_what_the_planner_counts_per_layer(dims: StageDims) -> None:
    """6 FLOPs per parameter per token and 12 seq_len hidden per token of attention: the
    scenario's ``layer_flops_per_sequence`` for a block of the same parameters."""
    kv = dims.kv_heads * dims.head_dim
    params = 2 * dims.hidden**2 + 2 * dims.hidden * kv + (3 if dims.gated else 2) * dims.hidden * dims.intermediate
    tokens = dims.rows
    assert matmul_flops(block_matmuls(dims)) == tokens * (6 * params + 12 * dims.seq_len * dims.hidden)
    if not dims.gated and kv == dims.hidden and dims.intermediate == 4 * dims.hidden:  # GPT-2's 12 h^2 block
        block = ModelSpec(1, dims.hidden, dims.seq_len, 1, params=float(params + dims.hidden), dtype_bytes=2)
        assert matmul_flops(block_matmuls(dims)) == dims.micro_batch * block.layer_flops_per_sequence()


def test_a_product_grows_only_along_the_micro_batch_and_never_to_nothing() -> None:
    p = Matmul(4096, 1024, 2752, count=3, grows="m")
    assert p.at(0.25) == Matmul(1024, 1024, 2752, count=3, grows="m")
    assert p.at(1e-9).m == 1 and p.at(1e-9).k == 1024
    w = Matmul(1024, 4096, 2752, grows="k")
    assert w.at(0.5) == Matmul(1024, 2048, 2752, grows="k")
    heads = Matmul(2048, 64, 2048, batch=128, count=2)
    assert heads.at(0.01).batch == 1 and heads.flops == 2 * heads.call_flops == 2 * 2.0 * 128 * 2048 * 64 * 2048


def test_the_largest_fraction_fits_the_memory_it_may_use() -> None:
    p = Matmul(4096, 1024, 1024, grows="m")  # 4M + 1M + 4M elements at full size
    assert _largest_fraction(p, 10 * 2**20) == 1.0
    half = _largest_fraction(p, 5 * 2**20)
    assert half == 0.5 and p.at(half).operand_elements() <= 5 * 2**20
    with pytest.raises(ProbeError, match="free memory on it"):
        _largest_fraction(p, 2**20)  # the weight alone does not fit


def test_the_threads_are_the_limits_or_torchs_default() -> None:
    assert compute_threads(3) == 3
    assert compute_threads(0) == torch.get_num_threads()


def test_the_probe_measures_a_positive_figure_within_its_seconds_and_restores_the_threads() -> None:
    before = torch.get_num_threads()
    result = measure_achieved_tflops("cpu", "fp32", 1, TINY_BYTES, run_shapes=True, budget_s=0.4)
    assert torch.get_num_threads() == before
    assert result.achieved_tflops > 0 and math.isfinite(result.achieved_tflops)
    assert result.dtype == "fp32" and result.threads == 1 and result.run_shapes
    assert 0 < result.min_fraction <= 1 and result.free_memory_bytes > 0
    assert result.seconds < 4  # 0.4 s timed, sizing at most half as long again, and the allocations


def test_before_the_run_is_known_the_probe_takes_the_generic_block_and_the_cells_dtype() -> None:
    compute = ComputeConfig(device="cpu")  # precision "auto": fp32 on a CPU
    generic = probe_device("cpu", compute, 1, None)
    assert not generic.run_shapes and generic.dtype == "fp32" and generic.threads == 1
    assert generic.achieved_tflops > 0 and generic.seconds < 6  # its budget is 0.8 s of timed calls
    run = parse_spec_body(dict(DEFAULT_RUN))
    at_run = probe_device("cpu", compute, 1, run)
    assert at_run.run_shapes and at_run.min_fraction == 1.0  # the default run's block is small: full size


def test_an_unknown_dtype_is_refused() -> None:
    with pytest.raises(ProbeError, match="bf16 or fp32, not 'fp16'"):
        measure_achieved_tflops("cpu", "fp16", 1, TINY_BYTES, run_shapes=False, budget_s=0.1)
