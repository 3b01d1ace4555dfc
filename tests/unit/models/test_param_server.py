"""models/param_server.py: versions, the staleness bound, gradient checks, and resuming."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from swarmd.models.param_server import GradientError, ServerConfig, StageParameterServer

pytestmark = pytest.mark.timeout(60)


def initial() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {"layer.weight": torch.randn(4, 3, generator=g), "layer.bias": torch.randn(4, generator=g)}


def grads(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"layer.weight": torch.randn(4, 3, generator=g), "layer.bias": torch.randn(4, generator=g)}


def test_push_applies_adamw_and_bumps_the_version() -> None:
    server = StageParameterServer(initial(), ServerConfig(lr=0.1, weight_decay=0.01), None)
    reference = {k: torch.nn.Parameter(v.clone()) for k, v in initial().items()}
    ref_opt = torch.optim.AdamW(reference.values(), lr=0.1, weight_decay=0.01)
    for step in range(3):
        result = server.push(grads(step), base_version=server.version)
        assert result.accepted and result.version == step + 1 and result.staleness == 0
        for name, p in reference.items():
            p.grad = grads(step)[name]
        ref_opt.step()
    version, weights = server.weights()
    assert version == 3
    for name, p in reference.items():
        assert torch.allclose(weights[name], p.detach())


def test_too_stale_dropped_and_counted() -> None:
    server = StageParameterServer(initial(), ServerConfig(lr=0.1, max_staleness=1), None)
    for step in range(3):
        server.push(grads(step), base_version=server.version)
    before = server.weights()[1]
    ok = server.push(grads(9), base_version=2)  # staleness 1: within the bound
    assert ok.accepted and ok.staleness == 1
    stale = server.push(grads(9), base_version=1)  # staleness 3 > 1
    assert not stale.accepted and stale.version == 4 and stale.weight == 0.0
    assert server.counters.dropped_stale == 1 and server.counters.applied == 4
    assert server.counters.staleness_histogram == {0: 3, 1: 1, 3: 1}
    assert not torch.equal(before["layer.bias"], server.weights()[1]["layer.bias"])  # the accepted one applied


def test_too_stale_scaled_when_so_configured() -> None:
    server = StageParameterServer(initial(), ServerConfig(lr=0.1, max_staleness=0, staleness_policy="scale"), None)
    server.push(grads(0), base_version=0)
    server.push(grads(1), base_version=1)
    result = server.push(grads(2), base_version=0)  # staleness 2, excess 2
    assert result.accepted and result.weight == pytest.approx(1 / 3)
    assert server.counters.scaled == 1 and server.version == 3


@pytest.mark.parametrize(
    "bad, message",
    [
        ({"layer.weight": torch.zeros(4, 3)}, "missing"),
        ({**grads(0), "other": torch.zeros(1)}, "unknown"),
        ({**grads(0), "layer.bias": torch.zeros(5)}, "shape"),
        ({**grads(0), "layer.bias": torch.tensor([0.0, float("nan"), 0.0, 0.0])}, "NaN"),
    ],
)
def test_malformed_gradients_refused(bad: dict[str, torch.Tensor], message: str) -> None:
    server = StageParameterServer(initial(), ServerConfig(lr=0.1), None)
    with pytest.raises(GradientError, match=message):
        server.push(bad, base_version=0)
    assert server.version == 0


def test_version_from_the_future_refused() -> None:
    server = StageParameterServer(initial(), ServerConfig(lr=0.1), None)
    with pytest.raises(GradientError, match="version 5"):
        server.push(grads(0), base_version=5)


def test_checkpoint_every_n_and_resume_with_optimizer_state(tmp_path: Path) -> None:
    path = tmp_path / "stage0.safetensors"
    config = ServerConfig(lr=0.05, weight_decay=0.01, checkpoint_every=2)
    server = StageParameterServer(initial(), config, path)
    server.push(grads(0), 0)
    assert not path.exists()
    server.push(grads(1), 1)
    assert path.exists()
    server.push(grads(2), 2)  # not yet checkpointed: a restart resumes at version 2
    resumed = StageParameterServer(initial(), config, path)
    assert resumed.version == 2

    server = StageParameterServer(initial(), config, path)  # also at version 2, from the file
    # Same next push on both: identical weights only if the AdamW moments were restored too.
    fresh_moments = StageParameterServer(resumed.weights()[1], config, None)
    for s in (server, resumed, fresh_moments):
        s.push(grads(7), s.version)
    assert torch.equal(server.weights()[1]["layer.weight"], resumed.weights()[1]["layer.weight"])
    assert not torch.allclose(fresh_moments.weights()[1]["layer.weight"], resumed.weights()[1]["layer.weight"])


def test_checkpoint_of_another_stage_refused(tmp_path: Path) -> None:
    path = tmp_path / "stage.safetensors"
    StageParameterServer({"x": torch.zeros(2)}, ServerConfig(lr=0.1), path).checkpoint()
    with pytest.raises(GradientError, match="other parameters"):
        StageParameterServer(initial(), ServerConfig(lr=0.1), path)


def test_config_validation() -> None:
    for kwargs in ({"lr": 0.0}, {"lr": float("nan")}, {"lr": 0.1, "max_staleness": -1},
                   {"lr": 0.1, "staleness_policy": "ignore"}, {"lr": 0.1, "checkpoint_every": 0}):  # fmt: skip
        with pytest.raises(ValueError):
            ServerConfig(**kwargs)  # type: ignore[arg-type]
