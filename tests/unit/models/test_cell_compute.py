"""models/cell_compute.py: a pipeline of cells equals the full model, gradient mode with shards
equals the synchronous reference, local-mode identities, and abandoned shares leave nothing."""

from __future__ import annotations

import pytest
import torch

from swarmd.models.build import ModelError, ModelShape, build_model
from swarmd.models.cell_compute import CellCompute, flatten_parameters, unflatten_parameters
from swarmd.models.data.corpus import load_corpus, train_eval_split
from swarmd.models.data.windows import Dataset
from swarmd.models.lr_schedule import LrSchedule
from swarmd.models.parameter_shard import ParameterShard
from swarmd.models.precision import ComputeSettings
from swarmd.models.reference import TrainConfig, round_at_stage_cuts, train_reference
from swarmd.models.shard_config import ShardConfig
from swarmd.models.stages import StageModule

pytestmark = pytest.mark.timeout(120)

PLAN = [(0, 1), (1, 2)]
LR, WD = 3e-3, 0.01


def shape(family: str = "gpt2") -> ModelShape:
    return ModelShape(family=family, layers=2, hidden=32, heads=2, vocab=256, seq_len=16)


def dataset() -> Dataset:
    train, _ = train_eval_split(load_corpus("builtin"), 16, seed=7)
    return train


def cells(
    family: str = "gpt2",
    mode: str = "gradient",
    seed: int = 7,
    plan: list[tuple[int, int]] = PLAN,
    settings: ComputeSettings | None = None,
) -> list:
    model = build_model(shape(family), seed)
    return [
        CellCompute(
            StageModule(model, plan, s), mode=mode, window=len(plan) + 1, lr=LR, weight_decay=WD, settings=settings
        )
        for s in range(len(plan))
    ]


def run_share(
    pipeline: list[CellCompute], data: Dataset, first: int, count: int, wire: torch.dtype = torch.float16
) -> list[float]:
    """One share of micro-batches of 2 through a pipeline of cells, two in flight, activations and
    their gradients crossing each boundary in ``wire``'s dtype (fp16: the data path's default)."""
    losses: list[float] = []
    pending: list[tuple[int, torch.Tensor]] = []

    def drain_one() -> None:
        m, x = pending.pop(0)
        grad, loss = pipeline[-1].forward_backward_last(m, x, data.micro_batch(m, 2))
        losses.append(loss)
        for cell in reversed(pipeline[:-1]):
            assert grad is not None
            grad = cell.backward(m, grad.to(wire))
        assert grad is None  # stage 0 sends nothing back

    for m in range(first, first + count):
        x: torch.Tensor = data.micro_batch(m, 2)
        for cell in pipeline[:-1]:
            x = cell.forward(m, x).to(wire)
        pending.append((m, x))
        if len(pending) == 2:
            drain_one()
    while pending:
        drain_one()
    for cell in pipeline:
        assert cell.end_share() == count
    return losses


def full_model_mean_gradient(
    family: str, data: Dataset, first: int, count: int, wire: str = "fp32"
) -> tuple[list[float], dict]:
    """The full model's losses and mean gradient (hidden states rounded to ``wire`` where PLAN
    cuts, as the reference does)."""
    model = build_model(shape(family), 7)
    round_at_stage_cuts(model, shape(family), len(PLAN), wire)
    losses = []
    for m in range(first, first + count):
        ids = data.micro_batch(m, 2)
        loss = model(input_ids=ids, labels=ids).loss
        (loss / count).backward()
        losses.append(float(loss.detach()))
    return losses, {name: p.grad for name, p in model.named_parameters()}


def assert_close_but_for_adamw_noise(
    actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor], steps: int, atol: float
) -> None:
    """Weights after ``steps`` AdamW steps agree within ``atol`` but for a few elements: where a
    gradient is near 0, float noise (a different summation order) can flip its sign, and AdamW,
    which steps about ``lr`` whatever the gradient's size, then moves it the other way. That
    amplifies rounding; it is no error of the code under test."""
    assert actual.keys() == expected.keys()
    diff = torch.cat([(actual[k] - expected[k]).abs().reshape(-1) for k in expected])
    assert float((diff > atol).float().mean()) < 2e-3, f"{int((diff > atol).sum())} of {diff.numel()} over {atol}"
    assert float(diff.max()) <= 2 * LR * steps * (1 + 1e-3)


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_a_pipeline_of_two_cells_reproduces_the_full_model(family: str) -> None:
    data = dataset()
    pipeline = cells(family)
    losses = run_share(pipeline, data, first=0, count=4)
    expected_losses, expected = full_model_mean_gradient(family, data, 0, 4)
    # fp16 on the wire is the one difference from the full model's own graph.
    assert losses == pytest.approx(expected_losses, abs=2e-3)
    names: set[str] = set()
    for cell in pipeline:
        vector, micro_batches = cell.contribution()
        assert micro_batches == 4 and vector.numel() == cell.size
        for name, grad in unflatten_parameters(cell.module, vector).items():
            names.add(name)
            torch.testing.assert_close(grad, expected[name], atol=2e-4, rtol=2e-2, msg=name)
    assert names == set(expected)


@pytest.mark.parametrize(("family", "wire"), [("llama", torch.bfloat16), ("gpt2", torch.float16)])
def test_the_reference_rounds_where_the_cells_cut_as_their_wire_does(family: str, wire: torch.dtype) -> None:
    data = dataset()
    pipeline = cells(family)
    losses = run_share(pipeline, data, first=0, count=4, wire=wire)
    half = shape(family).wire_half
    assert {"bf16": torch.bfloat16, "fp16": torch.float16}[half] == wire  # the daemon's wire for the family
    rounded_losses, rounded = full_model_mean_gradient(family, data, 0, 4, wire=half)
    _, exact = full_model_mean_gradient(family, data, 0, 4)
    assert losses == pytest.approx(rounded_losses, abs=1e-5)
    # Stage 0 gets the gradient that came back through the cut: rounded alike on both sides, and
    # closer to the pipeline's than the unrounded reference's is.
    (first, _) = pipeline
    grads = unflatten_parameters(first.module, first.contribution()[0])
    for name, grad in grads.items():
        torch.testing.assert_close(grad, rounded[name], atol=1e-6, rtol=1e-4, msg=name)
    off = sum(float((grads[n] - rounded[n]).abs().sum()) for n in grads)
    off_exact = sum(float((grads[n] - exact[n]).abs().sum()) for n in grads)
    assert off < off_exact / 10, (off, off_exact)


def test_in_fp32_the_pipeline_matches_the_full_model_tightly() -> None:
    data = dataset()
    first, last = cells()
    ids = data.micro_batch(3, 2)
    hidden = first.forward(3, ids)
    grad, loss = last.forward_backward_last(3, hidden, ids)
    assert grad is not None and first.backward(3, grad) is None
    for cell in (first, last):
        cell.end_share()
    expected_losses, expected = full_model_mean_gradient("gpt2", data, 3, 1)
    assert loss == pytest.approx(expected_losses[0], abs=1e-6)
    for cell in (first, last):
        for name, g in unflatten_parameters(cell.module, cell.contribution()[0]).items():
            torch.testing.assert_close(g, expected[name], atol=1e-5, rtol=1e-4, msg=name)


def test_gradient_mode_with_one_pipeline_and_sharded_servers_equals_synchronous_adamw() -> None:
    data = dataset()
    per_step, steps = 4, 3
    pipeline = cells()
    servers: list[list[ParameterShard]] = []
    config = ShardConfig(mode="gradient", lr=LR, weight_decay=WD)
    for cell in pipeline:
        flat = flatten_parameters(cell.module)
        cuts = [(0, cell.size // 3), (cell.size // 3, cell.size)]
        servers.append([ParameterShard(lo, hi, flat[lo:hi], config, step_micro_batches=per_step) for lo, hi in cuts])
    losses, after_one_step = [], {}
    for step in range(steps):
        # fp32 on the wire: what is left to differ from the reference is rounding order and fp16 deltas.
        share_losses = run_share(pipeline, data, first=step * per_step, count=per_step, wire=torch.float32)
        losses.append(sum(share_losses) / per_step)
        for cell, shards in zip(pipeline, servers, strict=True):
            vector, micro_batches = cell.contribution()
            for shard in shards:
                result = shard.contribute(vector[shard.lo : shard.hi], shard.version, micro_batches, [step], 1.0)
                assert result.step is not None
                shard.confirm(result.step.version)
                deltas = shard.deltas_since(step)
                assert deltas is not None
                cell.apply_deltas(shard.lo, deltas)
            cell.rebase()
            # The cell holds the servers' weights bit for bit.
            server_weights = torch.cat([w[1] for w in (s.weights() for s in shards) if w is not None])
            assert torch.equal(cell.flat(), server_weights) and torch.equal(cell.global_vector, server_weights)
            if step == 0:
                after_one_step.update(unflatten_parameters(cell.module, cell.flat()))

    def reference(steps: int) -> tuple[list[float], dict[str, torch.Tensor]]:
        settings = TrainConfig(seed=7, steps=steps, batch_sequences=2 * per_step, micro_batch=2, lr=LR, weight_decay=WD)
        results, weights = train_reference(shape(), data, settings)
        return [r.loss for r in results], weights

    _, one_step = reference(1)
    assert_close_but_for_adamw_noise(after_one_step, one_step, steps=1, atol=2e-6)
    reference_losses, _ = reference(steps)
    assert losses == pytest.approx(reference_losses, abs=5e-5)  # every step's loss, after each update


def test_local_mode_inner_steps_then_the_pseudo_gradient() -> None:
    data = dataset()
    (cell,) = cells(mode="local", plan=[(0, 2)])
    start = cell.flat()
    model = build_model(shape(), 7)
    inner = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WD)
    for share in range(3):  # H = 3 shares of k = 2
        run_share([cell], data, first=2 * share, count=2)
        inner.zero_grad()
        for m in (2 * share, 2 * share + 1):
            ids = data.micro_batch(m, 2)
            (model(input_ids=ids, labels=ids).loss / 2).backward()
        inner.step()
    local = cell.flat()
    expected = {name: p.detach() for name, p in model.named_parameters()}
    assert_close_but_for_adamw_noise(unflatten_parameters(cell.module, local), expected, steps=3, atol=1e-5)
    pseudo, micro_batches = cell.contribution()
    assert micro_batches == 6 and torch.equal(pseudo, start - local)
    with pytest.raises(ModelError, match="no micro-batch"):
        cell.contribution()  # a new round, based on the local weights, has nothing yet
    run_share([cell], data, first=6, count=2)
    second, _ = cell.contribution()
    assert torch.equal(second, local - cell.flat())


def test_local_mode_rebase_keeps_the_progress_since_the_base() -> None:
    data = dataset()
    (cell,) = cells(mode="local", plan=[(0, 2)])
    base = cell.global_vector
    run_share([cell], data, first=0, count=2)
    progress = cell.flat() - base
    # Another pipeline's contribution moved shard [lo, hi) of the global weights.
    lo, delta = 100, torch.randn(500, generator=torch.Generator().manual_seed(0)).mul(1e-3).to(torch.float16)
    cell.apply_deltas(lo, [(1, delta)])
    new_global = base.clone()
    new_global[lo : lo + 500] += delta.float()
    assert torch.equal(cell.global_vector, new_global)
    cell.rebase()
    assert torch.equal(cell.flat(), progress + new_global)
    run_share([cell], data, first=2, count=2)
    pseudo, micro_batches = cell.contribution()
    assert micro_batches == 4
    assert torch.equal(pseudo, new_global - (cell.flat()))  # the round's base is the new global


@pytest.mark.parametrize("mode", ["gradient", "local"])
def test_a_dropped_share_leaves_no_gradient_behind(mode: str) -> None:
    data = dataset()
    dropped, clean = cells(mode=mode), cells(mode=mode)
    run_share(dropped, data, first=0, count=2)
    run_share(clean, data, first=0, count=2)
    weights_before = [c.flat() for c in dropped]
    # The next share dies half-way: one micro-batch back-propagated, one still in flight.
    first, last = dropped
    for m in (2, 3):
        hidden = first.forward(m, data.micro_batch(m, 2))
    grad, _ = last.forward_backward_last(2, hidden, data.micro_batch(2, 2))
    assert grad is not None
    first.backward(2, grad)
    assert first.in_flight == [3] and first.share_micro_batches == 1
    assert first.drop_share() == 2 and last.drop_share() == 1
    assert first.in_flight == [] and all(p.grad is None for c in dropped for p in c.module.parameters())
    for cell, before in zip(dropped, weights_before, strict=True):
        assert torch.equal(cell.flat(), before)  # no inner step in local mode either
    for a, b in zip(dropped, clean, strict=True):
        va, na = a.contribution()
        vb, nb = b.contribution()
        # Equal to float rounding (the kernels need not be bit-reproducible); a gradient left
        # behind by the dropped share would be off by a whole micro-batch's.
        assert na == nb == 2
        torch.testing.assert_close(va, vb, atol=1e-7, rtol=1e-6)


def test_the_window_and_share_rules_are_enforced() -> None:
    data = dataset()
    first, last = cells()
    for m in range(3):
        first.forward(m, data.micro_batch(m, 2))
    with pytest.raises(ModelError, match="window"):
        first.forward(3, data.micro_batch(3, 2))
    with pytest.raises(ModelError, match="already in this share"):
        first.forward(1, data.micro_batch(1, 2))
    assert first.drop(2) and not first.drop(2)
    with pytest.raises(ModelError, match="no forward of micro-batch 7"):
        first.backward(7, torch.zeros(2, 16, 32))
    with pytest.raises(ModelError, match="NaN"):
        first.backward(0, torch.full((2, 16, 32), float("nan")))
    with pytest.raises(ModelError, match="output gradient"):
        first.backward(0, torch.zeros(2, 16, 31))
    with pytest.raises(ModelError, match="between shares"):
        first.rebase()
    with pytest.raises(ModelError, match="still wait"):
        first.end_share()
    with pytest.raises(ModelError, match="forward_backward_last"):
        last.forward(0, torch.zeros(2, 16, 32))
    with pytest.raises(ModelError, match="not the last stage"):
        first.forward_backward_last(0, data.micro_batch(0, 2), data.micro_batch(0, 2))
    with pytest.raises(ModelError, match="NaN"):
        last.forward_backward_last(5, torch.full((2, 16, 32), float("inf")), data.micro_batch(5, 2))
    with pytest.raises(ModelError, match="token ids span"):
        first.forward(9, torch.full((2, 16), 300, dtype=torch.long))
    with pytest.raises(ModelError, match="not consecutive"):
        first.apply_deltas(0, [(1, torch.zeros(4, dtype=torch.float16)), (3, torch.zeros(4, dtype=torch.float16))])
    with pytest.raises(ModelError, match="fp16 slices"):
        first.apply_deltas(first.size - 2, [(1, torch.zeros(4, dtype=torch.float16))])
    assert first.drop_share() == 2
    with pytest.raises(ModelError, match="no backward"):
        first.end_share()


def test_load_flat_starts_a_new_lineage() -> None:
    data = dataset()
    (cell,) = cells(mode="local", plan=[(0, 2)])
    run_share([cell], data, first=0, count=2)
    fresh = flatten_parameters(build_model(shape(), 99))
    cell.load_flat(fresh)
    assert torch.equal(cell.flat(), fresh) and torch.equal(cell.global_vector, fresh)
    assert cell.round_micro_batches == 0
    with pytest.raises(ModelError, match="does not fit|elements"):
        cell.load_flat(fresh[:-1])


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_a_tied_single_stage_cell_steps_its_one_shared_weight(family: str) -> None:
    tied = ModelShape(**{**shape(family).to_dict(), "tied": True})
    model = build_model(tied, 7)
    cell = CellCompute(StageModule(model, [(0, 2)], 0), mode="gradient", window=2, lr=LR)
    assert cell.size == sum(p.numel() for p in model.parameters())  # the shared weight counted once
    ids = dataset().micro_batch(0, 2)
    grad, loss = cell.forward_backward_last(0, ids, ids)
    assert grad is None and cell.end_share() == 1
    reference = model(input_ids=ids, labels=ids).loss
    reference.backward()
    assert loss == pytest.approx(float(reference.detach()), abs=1e-6)
    # The embedding's gradient is the sum of both its uses (the input and the head).
    contribution = unflatten_parameters(cell.module, cell.contribution()[0])
    assert "lm_head.weight" not in contribution
    for name, p in model.named_parameters():
        torch.testing.assert_close(contribution[name], p.grad, atol=1e-5, rtol=1e-4, msg=name)
    # A new vector (what a shard's step sends) moves the head with the embedding.
    cell.load_flat(cell.flat() + 1.0)
    assert torch.equal(cell.module.lm_head.weight, model.lm_head.weight + 1.0)


def test_local_modes_inner_steps_take_the_schedules_rate_at_the_swarms_inner_step() -> None:
    data = dataset()
    moved = []
    for schedule, inner_step in (
        (None, None),
        (LrSchedule(LR, warmup_steps=4), 0),
        (LrSchedule(LR, warmup_steps=4), 9),
    ):
        model = build_model(shape(), 7)
        cell = CellCompute(
            StageModule(model, [(0, 2)], 0), mode="local", window=2, lr=LR, weight_decay=0.0, schedule=schedule
        )
        before = cell.flat()
        ids = data.micro_batch(0, 2)
        cell.forward_backward_last(0, ids, ids)
        cell.end_share(inner_step)
        moved.append(float((cell.flat() - before).abs().max()))
    # Adam's first step moves a weight by about its rate: the peak, a quarter of it in the
    # warm-up's first step, the peak again past the warm-up.
    assert moved[0] == pytest.approx(LR, rel=1e-3)
    assert moved[1] == pytest.approx(LR / 4, rel=1e-3) and moved[2] == pytest.approx(LR, rel=1e-3)


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_checkpointed_cells_reproduce_the_full_model(family: str) -> None:
    data = dataset()
    pipeline = cells(family, settings=ComputeSettings(checkpointing=True))
    losses = run_share(pipeline, data, first=0, count=4)
    expected_losses, expected = full_model_mean_gradient(family, data, 0, 4)
    assert losses == pytest.approx(expected_losses, abs=2e-3)  # fp16 on the wire, as uncheckpointed
    for cell in pipeline:
        for name, grad in unflatten_parameters(cell.module, cell.contribution()[0]).items():
            torch.testing.assert_close(grad, expected[name], atol=2e-4, rtol=2e-2, msg=name)


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_a_bf16_cell_trains_on_fp32_weights(family: str) -> None:
    data = dataset()
    bf16 = ComputeSettings(dtype="bf16")
    pipeline = cells(family, mode="local", settings=bf16)
    fp32_losses = run_share(cells(family), data, first=0, count=2)
    first = run_share(pipeline, data, first=0, count=2)
    # Autocast's bf16 matmuls (8 bits of mantissa) move the loss a little, no more.
    assert first == pytest.approx(fp32_losses, abs=3e-2)
    losses = first
    for _ in range(8):  # the same two micro-batches again: the inner AdamW steps fit them
        losses = run_share(pipeline, data, first=0, count=2)
    assert sum(losses) < sum(first) - 0.5, (first, losses)
    hidden = pipeline[0].forward(0, data.micro_batch(0, 2))
    assert hidden.dtype == torch.float32 and hidden.device.type == "cpu"  # for the wire's codec
    pipeline[0].drop_share()
    for cell in pipeline:
        assert all(p.dtype == torch.float32 for p in cell.module.parameters())  # master weights
        assert cell.global_vector.dtype == torch.float32
        pseudo, micro_batches = cell.contribution()
        assert micro_batches == 18 and pseudo.dtype == torch.float32 and bool(torch.isfinite(pseudo).all())
        assert float(pseudo.abs().max()) > 0
