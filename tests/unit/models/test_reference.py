"""models/reference.py: the single-process baseline learns, deterministically."""

from __future__ import annotations

import pytest
import torch

from swarmd.models.build import ModelShape, build_model
from swarmd.models.data.corpus import load_corpus, train_eval_split
from swarmd.models.lr_schedule import LrSchedule
from swarmd.models.reference import TrainConfig, _Exchange, train_reference

pytestmark = pytest.mark.timeout(120)

SHAPE = ModelShape(family="gpt2", layers=2, hidden=32, heads=2, vocab=256, seq_len=32)


def settings(**kw: object) -> TrainConfig:
    base: dict[str, object] = dict(seed=7, steps=30, batch_sequences=8, micro_batch=4, lr=3e-3)
    base.update(kw)
    return TrainConfig(**base)  # type: ignore[arg-type]


def test_loss_falls_on_the_builtin_corpus() -> None:
    train, _ = train_eval_split(load_corpus("builtin"), SHAPE.seq_len, seed=7)
    results, _ = train_reference(SHAPE, train, settings())
    first, last = results[0].loss, sum(r.loss for r in results[-5:]) / 5
    assert first == pytest.approx(5.55, abs=0.3)  # ln(256): an untrained byte model is uniform
    assert last < 0.8 * first, [round(r.loss, 2) for r in results]
    assert results[-1].tokens == 30 * 8 * SHAPE.seq_len


def test_same_seed_same_run_and_micro_batching_does_not_change_the_math() -> None:
    train, _ = train_eval_split(load_corpus("builtin"), SHAPE.seq_len, seed=7)
    a, wa = train_reference(SHAPE, train, settings(steps=3))
    b, wb = train_reference(SHAPE, train, settings(steps=3))
    c, wc = train_reference(SHAPE, train, settings(steps=3, micro_batch=2))
    assert [r.loss for r in a] == [r.loss for r in b]
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    # Accumulating 4 micro-batches of 2 equals 2 of 4: the same sequences, the same mean.
    assert [r.loss for r in a] == pytest.approx([r.loss for r in c], abs=1e-5)
    assert all(torch.allclose(wa[k], wc[k], atol=1e-5) for k in wa)


def test_settings_validation() -> None:
    for kw in ({"steps": 0}, {"micro_batch": 3}, {"batch_sequences": 2}):
        with pytest.raises(ValueError):
            settings(**kw)


def test_the_reference_steps_at_its_schedules_rate() -> None:
    train, _ = train_eval_split(load_corpus("builtin"), SHAPE.seq_len, seed=7)
    schedule = LrSchedule(3e-3, warmup_steps=2, decay_steps=4, min_lr_ratio=0.5)
    _, scheduled = train_reference(SHAPE, train, settings(steps=5, schedule=schedule))
    model = build_model(SHAPE, 7)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1.0, weight_decay=0.0)
    for step in range(5):  # by hand: the rate set before each step
        for group in optimizer.param_groups:
            group["lr"] = [1.5e-3, 3e-3, 3e-3, 2.25e-3, 1.5e-3][step]
        optimizer.zero_grad()
        for k in range(2):
            ids = train.micro_batch(step * 2 + k, 4)
            (model(input_ids=ids, labels=ids).loss / 2).backward()
        optimizer.step()
    for name, weight in model.state_dict().items():
        torch.testing.assert_close(scheduled[name], weight, atol=1e-6, rtol=1e-5, msg=name)
    _, constant = train_reference(SHAPE, train, settings(steps=5))
    assert not all(torch.equal(constant[k], scheduled[k]) for k in constant)


def test_the_swarms_exchange_rounding_lands_every_step_as_an_fp16_delta() -> None:
    """``contribution`` and ``fp16_deltas``: each weight moves by an fp16 number per step (the
    shard server's delta), the rounding carried on, so the run stays within rounding of fp32's."""
    train, _ = train_eval_split(load_corpus("builtin"), SHAPE.seq_len, seed=7)
    start = build_model(SHAPE, 7).state_dict()
    _, plain_one = train_reference(SHAPE, train, settings(steps=1))
    _, one = train_reference(SHAPE, train, settings(steps=1, fp16_deltas=True))
    for name, before in start.items():  # the first step: nothing carried yet
        assert torch.equal(one[name], before + (plain_one[name] - before).to(torch.float16).to(torch.float32)), name
    plain, _ = train_reference(SHAPE, train, settings(steps=10))
    swarm, _ = train_reference(SHAPE, train, settings(steps=10, contribution="bf16", fp16_deltas=True))
    assert [r.loss for r in swarm] == pytest.approx([r.loss for r in plain], abs=0.02)
    assert [r.loss for r in swarm] != [r.loss for r in plain]
    with pytest.raises(ValueError, match="contribution"):
        settings(contribution="int8")


def test_a_stages_gradient_spike_is_clipped_to_its_shard_servers_norm_bound() -> None:
    """``norm_bound``: each stage's gradient is screened as its shard server screens a
    contribution (``NormBound``, 10 times the median norm once 8 are seen); the other stage's is
    left alone, and so is every gradient without it."""
    model = build_model(SHAPE, 7)
    config = settings(stages=2, norm_bound=True)
    exchange = _Exchange(model, SHAPE, config)
    plain = _Exchange(build_model(SHAPE, 7), SHAPE, settings(stages=2))
    first, second = exchange.stages
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)

    def set_grads(stage: list[torch.nn.Parameter], norm: float) -> None:
        total = sum(p.numel() for p in stage)
        for p in stage:
            p.grad = torch.full_like(p, norm / total**0.5)

    def norm(stage: list[torch.nn.Parameter]) -> float:
        return float(torch.cat([p.grad.reshape(-1) for p in stage if p.grad is not None]).norm())

    for _ in range(8):
        set_grads(first, 1.0)
        set_grads(second, 1.0)
        exchange.step(optimizer)
    set_grads(first, 100.0)  # a spike in stage 0 only
    set_grads(second, 2.0)
    exchange.step(optimizer)
    assert norm(first) == pytest.approx(10.0, rel=1e-3) and norm(second) == pytest.approx(2.0, rel=1e-3)
    assert not plain.bounds
