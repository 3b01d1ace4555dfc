"""daemon/cli/status_view.py's compute line: what the device probe achieved, of the rated figure."""

from __future__ import annotations

import pytest

from swarmd.cli.status_view import fmt_probe

pytestmark = pytest.mark.timeout(30)

H100 = {
    "achieved_tflops": 412.0,
    "rated_tflops": 989.0,
    "of_rated": 0.4166,
    "cpu_share": 1.0,
    "precision": "bf16",
    "threads": 16,
    "run_shapes": True,
    "min_fraction": 0.25,
    "free_memory_bytes": 75 * 2**30,
    "seconds": 1.6,
}


def test_a_measured_gpu_shows_its_share_of_the_rated_figure_and_its_free_memory() -> None:
    assert fmt_probe(H100) == (
        "compute   412 TFLOPS achieved (bf16, the run's shapes, 16 thread(s)), 42% of 989 rated; "
        "75.0 GiB free; probed in 1.6 s"
    )


def test_a_cpu_at_half_share_shows_what_the_planner_is_offered() -> None:
    cpu = {**H100, "achieved_tflops": 0.0862, "rated_tflops": None, "of_rated": None, "cpu_share": 0.5}
    cpu |= {"precision": "fp32", "threads": 1, "run_shapes": False, "free_memory_bytes": 9 * 2**30}
    assert fmt_probe(cpu) == (
        "compute   0.0862 TFLOPS achieved (fp32, a generic block, 1 thread(s)); 9.0 GiB free; probed in 1.6 s; "
        "offers 0.0431 at cpu_share 0.5"
    )


def test_before_a_measurement_the_rated_figure_if_any() -> None:
    assert fmt_probe(None) == "compute   not measured"
    assert fmt_probe({"achieved_tflops": None, "rated_tflops": 989.0}) == "compute   not measured; rated 989 TFLOPS"
