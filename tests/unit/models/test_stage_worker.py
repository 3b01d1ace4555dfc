"""models/stage_worker.py: tasks on named weights versions reproduce the full model's gradients."""

from __future__ import annotations

import pytest
import torch

from swarmd.models.build import ModelError, ModelShape, build_model
from swarmd.models.stage_worker import StageWorker
from swarmd.models.stages import StageModule, split_layers

pytestmark = pytest.mark.timeout(60)

SHAPE = ModelShape(family="gpt2", layers=3, hidden=32, heads=2, vocab=256, seq_len=16)


def ids(seed: int) -> torch.Tensor:
    return torch.randint(0, 256, (2, SHAPE.seq_len), generator=torch.Generator().manual_seed(seed))


def workers(accumulate: int = 1) -> list[StageWorker]:
    ranges = split_layers(SHAPE.layers, 2)
    model = build_model(SHAPE, seed=3)
    out = []
    for s in range(2):
        w = StageWorker(StageModule(model, ranges, s), accumulate=accumulate)
        w.add_weights(0, {k: v.clone() for k, v in w.module.state_dict().items()})
        out.append(w)
    return out


def run_micro_batch(w0: StageWorker, w1: StageWorker, x: torch.Tensor, version: int) -> float:
    hidden = w0.forward(x, version)
    last = w1.train_last(hidden, x, version)
    assert last.grad_input is not None
    first = w0.backward(x, last.grad_input, version)
    assert first.grad_input is None and last.loss is not None
    return last.loss


def test_tasks_reproduce_the_full_models_loss_and_gradients() -> None:
    w0, w1 = workers()
    x = ids(0)
    loss = run_micro_batch(w0, w1, x, 0)
    full = build_model(SHAPE, seed=3)
    reference = full(input_ids=x, labels=x).loss
    reference.backward()
    assert loss == pytest.approx(float(reference.detach()), abs=1e-5)
    pushed = {**w0.take_push().gradients, **w1.take_push().gradients}  # type: ignore[union-attr]
    for name, p in full.named_parameters():
        assert torch.allclose(pushed[name], p.grad, atol=1e-6), name


def test_backward_uses_the_version_its_forward_used() -> None:
    w0, w1 = workers()
    x = ids(1)
    hidden = w0.forward(x, 0)
    grad_out = w1.train_last(hidden, x, 0).grad_input
    assert grad_out is not None
    # Newer weights arrive between the forward and the backward (another micro-batch's update).
    w0.add_weights(1, {k: v + 0.5 for k, v in w0.module.state_dict().items()})
    assert w0.forward(x, 1).sub(hidden).abs().max() > 0.1  # version 1 really differs
    w0.backward(x, grad_out, 0)
    pushed = w0.take_push()
    assert pushed is not None and pushed.base_version == 0

    fresh0, fresh1 = workers()
    run_micro_batch(fresh0, fresh1, x, 0)
    expected = fresh0.take_push()
    assert expected is not None
    for name, g in expected.gradients.items():
        assert torch.allclose(pushed.gradients[name], g, atol=1e-6), name


def test_accumulation_takes_the_mean_and_the_oldest_version() -> None:
    w0, w1 = workers(accumulate=2)
    w1.add_weights(1, {k: v.clone() for k, v in w1.module.state_dict().items()})
    w0.add_weights(1, {k: v.clone() for k, v in w0.module.state_dict().items()})
    run_micro_batch(w0, w1, ids(2), 0)
    assert not w1.ready_to_push()
    run_micro_batch(w0, w1, ids(3), 1)
    assert w1.ready_to_push()
    push = w1.take_push()
    assert push is not None and push.micro_batches == 2 and push.base_version == 0
    assert w1.take_push() is None

    a0, a1 = workers()
    run_micro_batch(a0, a1, ids(2), 0)
    b0, b1 = workers()
    run_micro_batch(b0, b1, ids(3), 0)
    ga, gb = a1.take_push(), b1.take_push()
    assert ga is not None and gb is not None
    for name in push.gradients:
        assert torch.allclose(push.gradients[name], (ga.gradients[name] + gb.gradients[name]) / 2, atol=1e-6)


def test_versions_are_bounded_and_checked() -> None:
    w0, _ = workers()
    with pytest.raises(ModelError, match="not 5"):
        w0.forward(ids(0), 5)
    with pytest.raises(ModelError, match="do not match"):
        w0.add_weights(1, {"nope": torch.zeros(1)})
    small = StageWorker(w0.module, keep_versions=2)
    weights = w0.module.state_dict()
    for v in range(4):
        small.add_weights(v, weights)
    assert not small.has_version(1) and small.has_version(3) and small.newest_version == 3


def test_wrong_task_for_the_stage() -> None:
    w0, w1 = workers()
    with pytest.raises(ModelError, match="train_last"):
        w1.forward(torch.zeros(2, SHAPE.seq_len, SHAPE.hidden), 0)
    with pytest.raises(ModelError, match="not the last stage"):
        w0.train_last(ids(0), ids(0), 0)
