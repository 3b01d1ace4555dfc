"""models/precision.py: the config's precision resolved per device, settings checked, host <-> device."""

from __future__ import annotations

import pytest
import torch

from swarmd.models.build import ModelError
from swarmd.models.precision import (
    DTYPES,
    ComputeSettings,
    copies_through_pinned_memory,
    resolve_precision,
    start_device,
    to_device,
    to_host,
)

pytestmark = pytest.mark.timeout(30)


def test_auto_is_fp32_on_the_cpu_and_bf16_on_a_gpu_that_has_it() -> None:
    asked: list[str] = []

    def has(answer: bool):  # type: ignore[no-untyped-def]
        def supported(device: str) -> bool:
            asked.append(device)
            return answer

        return supported

    assert resolve_precision("auto", "cpu", bf16_supported=has(True)) == "fp32"
    assert asked == []  # the CPU is never asked about
    assert resolve_precision("auto", "cuda:1", bf16_supported=has(True)) == "bf16"
    assert resolve_precision("auto", "cuda:0", bf16_supported=has(False)) == "fp32"  # a V100, a T4
    assert asked == ["cuda:1", "cuda:0"]
    for device in ("cpu", "cuda:0"):
        for explicit in DTYPES:
            assert resolve_precision(explicit, device, bf16_supported=has(False)) == explicit


@pytest.mark.parametrize("bad", ["fp16", "BF16", "", "tf32"])
def test_an_unknown_precision_names_the_value_and_the_choices(bad: str) -> None:
    with pytest.raises(ModelError, match=rf"precision = {bad!r} is not one of auto, bf16, fp32"):
        resolve_precision(bad, "cpu")


def test_settings_refuse_a_dtype_or_device_torch_would_not_take() -> None:
    assert ComputeSettings() == ComputeSettings(device="cpu", dtype="fp32", checkpointing=False, compile=False)
    with pytest.raises(ModelError, match="compute dtype 'auto'.*resolve_precision"):
        ComputeSettings(dtype="auto")
    with pytest.raises(ModelError, match="compute device 'gpu0' is not a torch device"):
        ComputeSettings(device="gpu0")
    assert ComputeSettings(device="cuda:3").torch_device == torch.device("cuda", 3)


def test_the_autocast_context_computes_matmuls_in_bf16_only_when_asked() -> None:
    a, b = torch.randn(8, 8), torch.randn(8, 8)
    with ComputeSettings(dtype="bf16").autocast():
        assert (a @ b).dtype == torch.bfloat16
    with ComputeSettings(dtype="fp32").autocast():
        assert (a @ b).dtype == torch.float32


def test_only_host_to_cuda_copies_go_through_pinned_memory() -> None:
    cpu, gpu = torch.device("cpu"), torch.device("cuda", 0)
    assert copies_through_pinned_memory(cpu, gpu)
    assert not copies_through_pinned_memory(gpu, cpu)  # a result back to the host: a plain copy
    assert not copies_through_pinned_memory(cpu, cpu)
    assert not copies_through_pinned_memory(gpu, torch.device("cuda", 1))


def test_on_the_cpu_tensors_stay_where_they_are_and_come_back_in_fp32() -> None:
    x = torch.randn(4, 3)
    assert to_device(x, torch.device("cpu")) is x  # no copy on the CPU path
    half = x.to(torch.bfloat16).requires_grad_()
    back = to_host(half)
    assert back.dtype == torch.float32 and back.device.type == "cpu" and not back.requires_grad
    assert torch.equal(back, half.detach().float())
    start_device(torch.device("cpu"))  # nothing to turn on off CUDA
    assert torch.get_float32_matmul_precision() == "highest"
