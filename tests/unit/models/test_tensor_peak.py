"""models/tensor_peak.py: live tensor bytes and their peak, forward, backward and frees."""

from __future__ import annotations

import pytest
import torch

from swarmd.models.tensor_peak import TensorPeak

pytestmark = pytest.mark.timeout(60)

MB = 1_000_000


def test_it_counts_the_forward_the_backward_and_what_is_freed() -> None:
    x = torch.randn(250_000, requires_grad=True)  # 1 MB
    with TensorPeak([x]) as peak:
        assert peak.current == MB
        doubled = x * 2  # 1 MB, freed once tanh has its input
        y = doubled.tanh()  # 1 MB, kept for the backward
        del doubled
        assert peak.current == 2 * MB and peak.peak == 3 * MB
        peak.reset_peak()
        y.sum().backward()  # the backward's gradients: tanh's (1 MB) and mul's, x.grad (1 MB)
        assert x.grad is not None
        assert peak.peak == 4 * MB + 8  # x, y, the gradient through tanh, x.grad; the sum and its grad
        del y
        assert peak.current == 2 * MB  # x and x.grad


def test_views_share_their_storage_and_the_start_can_be_every_reachable_tensor() -> None:
    kept = torch.zeros(1000)
    with TensorPeak() as peak:
        start = peak.current
        assert start >= kept.nbytes
        view = kept[:10].view(2, 5)
        assert peak.current == start
        made = torch.ones(500)
        assert peak.current == start + 2000
        del made, view
        assert peak.current == start and peak.peak == start + 2000


def test_a_device_filter_skips_other_devices() -> None:
    with TensorPeak([], device="cuda") as peak:
        torch.ones(1000)
    assert peak.peak == 0
